"""More of the CLI as a user types it: plugins, retry, abort, sub-flows, following events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FLOWS = Path(__file__).parent / "flows"


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60)


def write(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / f"{doc['name']}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_plugin_registers_functions_and_node_types_by_flag_or_environment(tmp_path: Path,
                                                                         clean_env: dict[str, str]) -> None:
    flow = write(tmp_path, {"name": "plug", "nodes": [
        {"id": "s", "type": "python", "input": {"function": "shout", "args": {"text": "hi"}}},
        {"id": "r", "type": "text.reverse", "input": {"text": "{{ s }}"}}], "edges": [{"from": "s", "to": "r"}]})
    unknown = fk("validate", flow, cwd=tmp_path, env=clean_env)
    assert unknown.returncode == 2 and "unknown node type 'text.reverse'" in unknown.stderr
    by_flag = fk("--plugin", "tests.plugins.extras", "run", flow, "--json", cwd=tmp_path, env=clean_env)
    assert by_flag.returncode == 0, by_flag.stderr
    last_output = [json.loads(line) for line in by_flag.stdout.splitlines()][-2]
    assert last_output["type"] == "node:complete" and last_output["output"] == "!IH"
    by_env = fk("run", flow, cwd=tmp_path, env=clean_env | {"FLOWKERNEL_PLUGINS": "tests.plugins.extras"})
    assert by_env.returncode == 0, by_env.stderr
    missing = fk("--plugin", "no.such.module", "validate", flow, cwd=tmp_path, env=clean_env)
    assert missing.returncode == 2 and "--plugin no.such.module: cannot import" in missing.stderr


def test_retry_from_the_cli_reruns_only_the_failed_node(tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write(tmp_path, {"name": "flaky", "nodes": [
        {"id": "a", "type": "noop", "input": {"v": 1}},
        {"id": "b", "type": "python", "input": {"function": "fail_first_time",
                                                "args": {"marker": str(tmp_path / "failed-once")}}}],
        "edges": [{"from": "a", "to": "b"}]})
    env = clean_env | {"FLOWKERNEL_PLUGINS": "tests.plugins.extras"}
    first = fk("run", flow, "--json", cwd=tmp_path, env=env)
    assert first.returncode == 1
    run_id = json.loads(first.stdout.splitlines()[0])["flowRunId"]
    assert f"flowkernel retry {run_id}" in first.stderr
    again = fk("retry", run_id, "--json", cwd=tmp_path, env=env)  # the fault is gone now
    assert again.returncode == 0, again.stderr
    started = [e["nodeId"] for e in map(json.loads, again.stdout.splitlines()) if e["type"] == "node:start"]
    assert started == ["b"]


def test_abort_from_the_cli_is_final(tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write(tmp_path, {"name": "ask", "nodes": [{"id": "q", "type": "human.input", "input": {"prompt": "?"}}]})
    waiting = fk("run", flow, "--json", cwd=tmp_path, env=clean_env)
    assert waiting.returncode == 3
    run_id = json.loads(waiting.stdout.splitlines()[0])["flowRunId"]
    aborted = fk("abort", run_id, "--reason", "changed my mind", cwd=tmp_path, env=clean_env)
    assert aborted.returncode == 0, aborted.stderr
    show = json.loads(fk("show", run_id, "--json", cwd=tmp_path, env=clean_env).stdout)
    assert show["snapshot"]["status"] == "aborted" and show["snapshot"]["error"] == "changed my mind"
    refused = fk("resume", run_id, cwd=tmp_path, env=clean_env)
    assert refused.returncode == 2 and "aborted" in refused.stderr


def test_sub_flows_link_both_ways_and_a_child_reply_finishes_the_parent(tmp_path: Path,
                                                                       clean_env: dict[str, str]) -> None:
    parent = fk("run", str(FLOWS / "parent_asks.json"), "--json", cwd=tmp_path, env=clean_env)
    assert parent.returncode == 3, parent.stderr
    parent_id = json.loads(parent.stdout.splitlines()[0])["flowRunId"]
    children = [json.loads(line) for line in fk("runs", "--parent", parent_id, "--json", cwd=tmp_path,
                                                 env=clean_env).stdout.splitlines()]
    assert [c["flowName"] for c in children] == ["child-asks"]
    child_id = children[0]["runId"]
    shown = fk("show", parent_id, cwd=tmp_path, env=clean_env).stdout
    assert "children" in shown and child_id in shown
    child = json.loads(fk("show", child_id, "--json", cwd=tmp_path, env=clean_env).stdout)
    assert child["run"]["parentRunId"] == parent_id
    assert f"parent   {parent_id}" in fk("show", child_id, cwd=tmp_path, env=clean_env).stdout
    target = child["snapshot"]["waiting"]["ask"]["runId"]
    replied = fk("reply", child_id, "--to", target, "amber", cwd=tmp_path, env=clean_env)
    assert replied.returncode == 0, replied.stderr
    final = json.loads(fk("show", parent_id, "--json", cwd=tmp_path, env=clean_env).stdout)["snapshot"]
    assert final["status"] == "completed" and final["outputs"]["after"] == "child got amber"


def test_events_follow_prints_until_the_run_stops(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run = fk("run", str(ROOT / "flows" / "hello.json"), "--input", "name=Ada", "--json", cwd=tmp_path, env=clean_env)
    run_id = json.loads(run.stdout.splitlines()[0])["flowRunId"]
    followed = fk("events", run_id, "--follow", "--json", cwd=tmp_path, env=clean_env)
    assert followed.returncode == 0
    assert followed.stdout == run.stdout
    readable = fk("events", run_id, "--after", "40", cwd=tmp_path, env=clean_env)
    assert "■ completed" in readable.stdout and "flow:start" not in readable.stdout
