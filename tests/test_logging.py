"""Library code says what went wrong through ``logging`` (loggers ``flowkernel.<part>``, listed in
``flowkernel.telemetry.logs``); only the command line writes to stderr, through its log handler."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from flowkernel.run.committer import Committer
from flowkernel.store.memory import MemoryStore
from flowkernel.telemetry.logs import LOGGERS

ROOT = Path(__file__).resolve().parent.parent


def test_a_failing_commit_watcher_is_logged_on_flowkernel_run_and_the_others_still_hear(
        caplog: pytest.LogCaptureFixture) -> None:
    heard: list[str] = []

    def broken() -> None:
        raise RuntimeError("watcher down")

    committer = Committer(MemoryStore())
    committer.on_commit.extend([broken, lambda: heard.append("told")])
    with caplog.at_level(logging.WARNING, logger="flowkernel"):
        committer.committed()
    assert heard == ["told"]
    [record] = caplog.records
    assert (record.name, record.levelname) == ("flowkernel.run", "WARNING")
    assert "a commit watcher failed: RuntimeError('watcher down')" in record.getMessage()


def test_the_cli_writes_a_library_warning_to_stderr_as_a_log_line(tmp_path: Path,
                                                                   clean_env: dict[str, str]) -> None:
    # A broken plugin distribution: its entry point names a module that does not exist.
    dist = tmp_path / "site" / "brokenplug-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[flowkernel.nodes]\nbad = no_such_module:thing\n")
    (tmp_path / "flow.json").write_text('{"name": "x", "nodes": [{"id": "a", "type": "nosuch"}], "edges": []}')
    env = {**clean_env, "PYTHONPATH": f"{clean_env['PYTHONPATH']}:{tmp_path / 'site'}"}
    res = subprocess.run([sys.executable, "-m", "flowkernel", "validate", "flow.json"], cwd=tmp_path, env=env,
                         text=True, capture_output=True, timeout=60)
    assert res.returncode == 2
    [line] = [x for x in res.stderr.splitlines() if "skipping entry point" in x]
    assert line.endswith(" WARNING flowkernel.plugins: skipping entry point flowkernel.nodes:bad: "
                         "No module named 'no_such_module'")
    quiet = subprocess.run([sys.executable, "-m", "flowkernel", "--log-level", "error", "validate", "flow.json"],
                           cwd=tmp_path, env=env, text=True, capture_output=True, timeout=60)
    assert "skipping entry point" not in quiet.stderr and "unknown node type 'nosuch'" in quiet.stderr


def test_every_logger_the_library_uses_is_listed() -> None:
    used: dict[str, str] = {}
    for path in [*(ROOT / "kernel").rglob("*.py"), *(ROOT / "nodes").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getLogger"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).startswith("flowkernel")):
                used[str(node.args[0].value)] = str(path.relative_to(ROOT))
    assert "flowkernel.plugins" in used and "flowkernel.run" in used
    assert {name: where for name, where in used.items() if name != "flowkernel" and name not in LOGGERS} == {}
