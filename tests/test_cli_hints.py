"""What the CLI tells a user is true and helps: the command a failed run prints continues it, times
are never negative, the closing line counts failures, counts are in good English, errors read whole,
help says what an option takes, and a resumed node run is not called a second attempt."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "flowkernel.cli"]


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=60)


def write(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def printed_command(stderr: str, after: str) -> list[str]:
    """The command a hint prints after ``after``, as argv for this interpreter's console script."""
    line = next(line for line in stderr.splitlines() if after in line)
    words = shlex.split(line.split(after, 1)[1])
    assert words[0] == "flowkernel", line
    return [*CLI, *words[1:]]


def run_id_of(stdout: str) -> str:
    found = re.search(r"run (run_\w+)", stdout)
    assert found, stdout
    return found.group(1)


def test_a_failing_edge_condition_hints_a_retry_on_the_fixed_flow_and_that_command_completes_the_run(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    doc = {"name": "edgy", "nodes": [{"id": "a", "type": "noop", "input": {"v": 1}},
                                     {"id": "b", "type": "noop", "input": {}}],
           "edges": [{"from": "a", "to": "b", "when": "$number('x') > 1"}]}
    flow = write(tmp_path / "edgy.json", doc)
    failed = fk("run", flow, "--db", "runs.db", cwd=tmp_path, env=clean_env)
    assert failed.returncode == 1
    run_id = run_id_of(failed.stdout)
    assert f"flowkernel retry {run_id} --flow {flow}" in failed.stderr, failed.stderr
    # A plain retry fails the same way (no node failed), and says so again.
    plain = fk("retry", run_id, "--db", "runs.db", cwd=tmp_path, env=clean_env)
    assert plain.returncode == 1 and f"--flow {flow}" in plain.stderr, plain.stderr

    write(tmp_path / "edgy.json", {**doc, "edges": [{"from": "a", "to": "b", "when": "a.v = 1"}]})
    fixed = subprocess.run(printed_command(plain.stderr, "continue with: "), cwd=tmp_path, env=clean_env,
                           text=True, capture_output=True, timeout=60)
    assert fixed.returncode == 0, fixed.stderr
    assert "✔ b" in fixed.stdout and "■ completed" in fixed.stdout


def test_a_failed_node_still_hints_a_plain_retry(tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write(tmp_path / "flaky.json", {"name": "flaky", "nodes": [
        {"id": "b", "type": "python", "input": {"function": "fail_first_time",
                                                "args": {"marker": str(tmp_path / "failed-once")}}}]})
    env = clean_env | {"FLOWKERNEL_PLUGINS": "tests.plugins.extras"}
    failed = fk("run", flow, cwd=tmp_path, env=env)
    run_id = run_id_of(failed.stdout)
    assert failed.returncode == 1 and f"re-run its failed nodes with: flowkernel retry {run_id}\n" in failed.stderr


def test_the_live_view_of_a_fork_never_shows_a_negative_time(tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write(tmp_path / "two.json", {"name": "two", "nodes": [
        {"id": "prep", "type": "noop", "input": {"v": 1}}, {"id": "b", "type": "noop", "input": {}}],
        "edges": [{"from": "prep", "to": "b"}]})
    first = fk("run", flow, cwd=tmp_path, env=clean_env)
    run_id = run_id_of(first.stdout)
    # The fork starts in a new process, well after the run's events it copies were made.
    forked = fk("fork", run_id, "--at", "3", cwd=tmp_path, env=clean_env)
    assert forked.returncode == 0, forked.stderr
    fork_id = run_id_of(forked.stdout)
    shown = fk("events", fork_id, cwd=tmp_path, env=clean_env)
    for out in (forked.stdout, shown.stdout):
        times = [float(line.split("s ", 1)[0]) for line in out.splitlines()]
        assert len(times) == 8 and min(times) >= 0, out
        assert "● prep" in out and f"fork of {run_id} at seq 3" in out.splitlines()[0]


def test_the_closing_line_counts_failed_items_and_nodes_that_failed_under_continue_on_error(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write(tmp_path / "mixed.json", {"name": "mixed", "nodes": [
        {"id": "list", "type": "noop", "input": {"xs": [1, 0, 2]}},
        {"id": "inv", "type": "transform", "input": {"expr": "$number(x = 0 ? 'bad' : x)"},
         "policy": {"continueOnError": True}},
        {"id": "bad", "type": "transform", "input": {"expr": "$number('nope')"}, "policy": {"continueOnError": True}},
        {"id": "end", "type": "noop", "input": {}}],
        "edges": [{"from": "list", "to": "inv", "forEach": {"in": "list.xs", "as": "x"}},
                  {"from": "list", "to": "bad"}, {"from": "bad", "to": "end"}, {"from": "inv", "to": "end"}]})
    done = fk("run", flow, cwd=tmp_path, env=clean_env)
    assert done.returncode == 0, done.stderr
    # list, inv[0], inv[2], inv and end are done; inv[1] and bad failed.
    assert done.stdout.splitlines()[-1].endswith("■ completed              5 done, 2 failed, 0 skipped"), done.stdout


def test_a_failure_a_retry_got_past_is_no_longer_counted(tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write(tmp_path / "flaky.json", {"name": "flaky", "nodes": [
        {"id": "a", "type": "noop", "input": {"v": 1}},
        {"id": "b", "type": "python", "input": {"function": "fail_first_time",
                                                "args": {"marker": str(tmp_path / "failed-once")}}}],
        "edges": [{"from": "a", "to": "b"}]})
    env = clean_env | {"FLOWKERNEL_PLUGINS": "tests.plugins.extras"}
    failed = fk("run", flow, cwd=tmp_path, env=env)
    assert "■ failed                 1 done, 1 failed, 0 skipped: node 'b' failed" in failed.stdout, failed.stdout
    again = fk("retry", run_id_of(failed.stdout), cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1].endswith("■ completed              2 done, 0 skipped"), again.stdout


def test_counts_of_one_are_singular(tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write(tmp_path / "once.json", {"name": "once", "nodes": [
        {"id": "list", "type": "noop", "input": {"xs": ["only"]}},
        {"id": "each", "type": "noop", "input": {"x": "{{ x }}"}},
        {"id": "check", "type": "noop", "input": {}}],
        "edges": [{"from": "list", "to": "each", "forEach": {"in": "list.xs", "as": "x"}},
                  {"from": "each", "to": "check"},
                  {"from": "check", "to": "each", "maxIterations": 1}]})
    checked = fk("validate", flow, cwd=tmp_path, env=clean_env)
    assert checked.stdout.endswith("3 nodes, 3 edges\n"), checked.stdout
    single = write(tmp_path / "single.json", {"name": "single", "nodes": [{"id": "a", "type": "noop"}]})
    assert fk("validate", single, cwd=tmp_path, env=clean_env).stdout.endswith("1 node, 0 edges\n")

    ran = fk("run", flow, cwd=tmp_path, env=clean_env)
    assert ran.returncode == 0, ran.stderr
    assert "fired with 1 item\n" in ran.stdout and "loop exhausted after 1 iteration\n" in ran.stdout, ran.stdout
    run_id = run_id_of(ran.stdout)
    assert "check->each: 1 iteration\n" in fk("show", run_id, cwd=tmp_path, env=clean_env).stdout
    exported = fk("export", run_id, cwd=tmp_path, env=clean_env)
    assert exported.stderr == "flowkernel: exported 1 run\n"
    (tmp_path / "runs.jsonl").write_text(exported.stdout)
    imported = fk("import", "runs.jsonl", "--db", "other.db", cwd=tmp_path, env=clean_env)
    assert "flowkernel: imported 1 run, refused 0\n" in imported.stderr, imported.stderr
    replayed = fk("replay", run_id, cwd=tmp_path, env=clean_env)
    assert re.search(r"replayed \d+ events", replayed.stderr), replayed.stderr


def test_a_yaml_error_reads_as_a_whole_sentence(tmp_path: Path, clean_env: dict[str, str]) -> None:
    (tmp_path / "bad.yaml").write_text("name: y\nnodes:\n  - id: a\n    type: noop\n   input: {}\n")
    res = fk("validate", "bad.yaml", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2
    assert res.stderr == ("flowkernel: bad.yaml:5:4: not valid YAML: expected the end of the indented block, "
                          "but found a new indented mapping\n")
    (tmp_path / "tag.yaml").write_text("name: !secret-tag y\n")
    res = fk("validate", "tag.yaml", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2 and "secret-tag" not in res.stderr and "…" not in res.stderr, res.stderr


def test_send_and_reply_help_say_a_node_id_works_for_to(tmp_path: Path, clean_env: dict[str, str]) -> None:
    for command in ("send", "reply"):
        shown = " ".join(fk(command, "--help", cwd=tmp_path, env=clean_env).stdout.split())
        assert "--to NODE_RUN_ID|NODE" in shown and "or a node id when exactly one node run" in shown, shown


def test_a_node_resumed_after_a_pause_is_not_shown_as_a_second_attempt(tmp_path: Path,
                                                                       clean_env: dict[str, str]) -> None:
    flow = write(tmp_path / "pausable.json", {"name": "pausable", "nodes": [
        {"id": "work", "type": "python", "input": {"function": "block_first_run"}}]})
    plugin = ["--plugin", "tests.plugins.waiters"]
    proc = subprocess.Popen([*CLI, *plugin, "run", flow, "--json"], cwd=tmp_path, env=clean_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        first = json.loads(proc.stdout.readline())
        started = json.loads(proc.stdout.readline())
        assert started["type"] == "node:start"
        paused = fk(*plugin, "pause", first["flowRunId"], cwd=tmp_path, env=clean_env)
        assert paused.returncode == 0, paused.stderr
        assert proc.wait(timeout=30) == 3
    finally:
        proc.kill()
        proc.communicate()
    resumed = fk(*plugin, "resume", first["flowRunId"], cwd=tmp_path, env=clean_env)
    assert resumed.returncode == 0, resumed.stderr
    assert "● work" in resumed.stdout and "resumed from" in resumed.stdout and "attempt" not in resumed.stdout
    events = [json.loads(line) for line in fk("events", first["flowRunId"], "--json", cwd=tmp_path,
                                               env=clean_env).stdout.splitlines()]
    assert [e["attempt"] for e in events if e["type"] == "node:start"] == [1, 1]
