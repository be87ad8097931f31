"""``--plugin`` follows one rule on every command: given before the command or after it, a module of the
current directory imports, and a command that executes a stored run uses the plugins the run remembers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flowkernel.cli import parser

PLUGIN = ("from flowkernel.plugins.registry import register_function\n\n"
          "@register_function('excite')\n"
          "def excite(text: str) -> str:\n"
          "    return text + '!'\n")
FLOW = {"name": "loud", "nodes": [{"id": "loud", "type": "python",
                                   "input": {"function": "excite", "args": {"text": "hi"}}}]}


# The console script, as a user runs it: unlike `python -m flowkernel`, it does not put the current
# directory on the import path, so what makes a module of it import is the `--plugin` handling itself.
SCRIPT = str(Path(sys.executable).with_name("flowkernel"))


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=120)


def project(tmp_path: Path, clean_env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """A folder holding the plugin module ``myplug`` and the flow ``loud.json`` that needs it; an
    environment where only installed modules and the current directory's import."""
    here = tmp_path / "project"
    here.mkdir()
    (here / "myplug.py").write_text(PLUGIN)
    (here / "loud.json").write_text(json.dumps(FLOW))
    env = dict(clean_env)
    env.pop("PYTHONPATH", None)
    return here, env


def outputs(stdout: str) -> list[object]:
    return [e["output"] for e in map(json.loads, stdout.splitlines()) if e["type"] == "node:complete"]


def test_every_command_takes_plugin_after_its_name() -> None:
    commands = parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, command in commands.items():
        options = {o for action in command._actions for o in action.option_strings}
        assert "--plugin" in options, name


def test_run_and_validate_take_plugin_after_the_flow(tmp_path: Path, clean_env: dict[str, str]) -> None:
    here, env = project(tmp_path, clean_env)
    checked = fk("validate", "loud.json", "--plugin", "myplug", cwd=here, env=env)
    assert checked.returncode == 0, checked.stderr
    ran = fk("run", "loud.json", "--plugin", "myplug", "--db", "runs.db", "--json", cwd=here, env=env)
    assert ran.returncode == 0, ran.stderr
    assert outputs(ran.stdout) == ["hi!"]


def test_a_worker_given_plugin_after_its_name_imports_a_module_of_the_current_directory(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    here, env = project(tmp_path, clean_env)
    queued = fk("run", "loud.json", "--queue", "--db", "runs.db", cwd=here, env=env)  # the run names no plugin
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    worker = subprocess.Popen([SCRIPT, "worker", "--plugin", "myplug", "--db", "runs.db"],
                              cwd=here, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        followed = fk("events", run_id, "--follow", "--json", "--db", "runs.db", cwd=here, env=env)
    finally:
        worker.terminate()
        _, worker_log = worker.communicate(timeout=60)
    assert followed.returncode == 0, followed.stderr + worker_log
    assert outputs(followed.stdout) == ["hi!"], worker_log


def test_rerun_uses_the_plugins_the_run_remembers_and_takes_plugin(tmp_path: Path,
                                                                   clean_env: dict[str, str]) -> None:
    here, env = project(tmp_path, clean_env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    db = str(here / "runs.db")
    ran = fk("--plugin", "myplug", "run", "loud.json", "--db", db, "--json", cwd=here, env=env)
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout.splitlines()[0])["flowRunId"]

    remembered = fk("rerun", run_id, "--db", db, cwd=here, env=env)  # no --plugin: the run's own
    assert remembered.returncode == 0, remembered.stderr
    assert remembered.stdout == f"run {run_id}: the re-execution matches the recording (completed, same events " \
                                "and outputs)\n"

    # Where the module does not import, the refusal names it: the run's plugins are what it executes with.
    refused = fk("rerun", run_id, "--db", db, cwd=elsewhere, env=env)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"flowkernel: run {run_id} was started with --plugin myplug, which cannot be "
                                     "imported here")

    # The flow file now names a function of another module: rerun takes it with --plugin.
    (here / "quiet.py").write_text(PLUGIN.replace("excite", "whisper").replace("+ '!'", ".lower()"))
    grown = {**FLOW, "nodes": [*FLOW["nodes"], {"id": "soft", "type": "python",
                                                "input": {"function": "whisper", "args": {"text": "HO"}}}]}
    (here / "loud.json").write_text(json.dumps(grown))
    unknown = fk("rerun", run_id, "--db", db, cwd=here, env=env)
    assert unknown.returncode == 2 and "unknown python function 'whisper'" in unknown.stderr, unknown.stderr
    given = fk("rerun", run_id, "--plugin", "quiet", "--db", db, cwd=here, env=env)
    assert given.returncode == 1, given.stderr  # it ran, with one node more than the recording
    assert given.stdout.startswith(f"run {run_id}: diverges") and "soft" in given.stdout, given.stdout


def test_fixtures_of_a_run_hold_the_tool_definitions_of_the_plugins_it_remembers(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    root = Path(__file__).resolve().parent.parent
    started = fk("--plugin", "flowkernel.examples.research_tools", "run", str(root / "flows" / "research.json"),
                 "--input", "question=Which database should our desktop app use?",
                 "--fixtures", str(root / "fixtures" / "research"), "--db", "runs.db", "--json",
                 cwd=tmp_path, env=clean_env)
    assert started.returncode == 3, started.stderr  # the researcher waits for a reply
    run_id = json.loads(started.stdout.splitlines()[0])["flowRunId"]
    written = fk("fixtures", run_id, "--output", "out", "--db", "runs.db", cwd=tmp_path, env=clean_env)  # no --plugin
    assert written.returncode == 0, written.stderr
    call = json.loads((tmp_path / "out" / "researcher.json").read_text())["calls"][0]
    recorded = json.loads((root / "fixtures" / "research" / "researcher.json").read_text())["calls"][0]
    assert [t["name"] for t in call["input"]["tools"]] == [t["name"] for t in recorded["input"]["tools"]]
    assert "lookup_fact" in [t["name"] for t in call["input"]["tools"]]
