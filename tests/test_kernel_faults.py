"""A run is never left ``running`` by a failure of the kernel itself or a node type's bug that escapes
the node's own error handling: the run ends ``failed`` with the error recorded, and the CLI says so in
one line."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PLUGIN = "tests.plugins.faulty"


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", "--plugin", PLUGIN, *args], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=60)


def write_flow(tmp_path: Path, nodes: list[dict[str, Any]]) -> str:
    path = tmp_path / "flow.json"
    edges = [{"from": a["id"], "to": b["id"]} for a, b in itertools.pairwise(nodes)]
    path.write_text(json.dumps({"name": "faulty", "nodes": nodes, "edges": edges}))
    return str(path)


def stored(run_id: str, tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    show = json.loads(fk("show", run_id, "--json", cwd=tmp_path, env=env).stdout)
    events = [json.loads(line) for line in fk("events", run_id, "--json", cwd=tmp_path, env=env).stdout.splitlines()]
    return show, events


@pytest.mark.parametrize(("node_type", "error"), [
    ("faulty.event", "KeyError: 'no-such-edge'"),  # an event the reducer cannot apply
    ("faulty.probe", "AttributeError: 'NoneType' object has no attribute 'inline'"),  # a bug in the shell's call
])
def test_a_node_type_bug_that_escapes_into_the_kernel_fails_the_run_with_the_error_recorded(
        node_type: str, error: str, tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, [{"id": "first", "type": "noop", "input": {"n": 1}},
                                 {"id": "buggy", "type": node_type, "input": {}}])
    run = fk("run", flow, "--json", cwd=tmp_path, env=clean_env)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    run_id = json.loads(run.stdout.splitlines()[0])["flowRunId"]
    assert f"run {run_id} failed on an internal error: {error}" in lines[0]

    show, events = stored(run_id, tmp_path, clean_env)
    assert show["run"]["status"] == "failed" and error in show["run"]["error"]
    assert show["snapshot"]["status"] == "failed"
    assert events[-1]["type"] == "flow:complete" and events[-1]["status"] == "failed"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert show["snapshot"]["outputs"]["first"] == {"n": 1}  # what was saved before the fault stays


@pytest.mark.parametrize(("function", "raised"), [("faulty.exit", "SystemExit(3)"),
                                                  ("faulty.base", "BaseException(not an Exception)")])
def test_sys_exit_or_a_bare_base_exception_in_a_python_function_fails_its_node_not_the_process(
        function: str, raised: str, tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, [{"id": "quits", "type": "python", "input": {"function": function}},
                                 {"id": "after", "type": "noop", "input": {}}])
    run = fk("run", flow, "--json", cwd=tmp_path, env=clean_env)
    assert run.returncode == 1  # not the 3 the function passed to sys.exit
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"raised {raised}" in lines[0], run.stderr
    run_id = json.loads(run.stdout.splitlines()[0])["flowRunId"]
    show, events = stored(run_id, tmp_path, clean_env)
    assert show["run"]["status"] == "failed"
    error = next(e for e in events if e["type"] == "node:error")
    assert error["nodeId"] == "quits" and error["errorType"] == raised.split("(")[0]
    assert show["snapshot"]["nodeStatus"]["after"] == "pending"


@pytest.mark.parametrize(("function", "args", "message"), [
    ("faulty.deep", {}, "output is not JSON: maximum recursion depth exceeded"),
    ("faulty.surrogate", {}, "output is not JSON: 'utf-8' codec can't encode character '\\ud800'"),
    ("faulty.patch", {}, "state.odd: the value is not JSON: 'utf-8' codec can't encode character '\\udc80'"),
    ("faulty.patch", {"value": "object"}, "state.odd: the value is not JSON: Encoding objects of type object"),
])
def test_a_node_result_that_is_not_json_fails_that_node_not_the_kernel(
        function: str, args: dict[str, Any], message: str, tmp_path: Path, clean_env: dict[str, str]) -> None:
    """Odd values a function returns or writes are the node's failure, retryable, never an internal error."""
    flow = write_flow(tmp_path, [{"id": "odd", "type": "python", "input": {"function": function, "args": args}},
                                 {"id": "after", "type": "noop", "input": {"got": "{{ odd }}"}}])
    run = fk("run", flow, "--json", cwd=tmp_path, env=clean_env)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr
    run_id = json.loads(run.stdout.splitlines()[0])["flowRunId"]
    show, events = stored(run_id, tmp_path, clean_env)
    assert show["run"]["status"] == "failed"
    [error] = [e for e in events if e["type"] == "node:error"]
    assert error["nodeId"] == "odd" and message in error["message"], error
    assert error["errorType"] == ("state_error" if function == "faulty.patch" else "invalid_output")
    assert show["snapshot"]["nodeStatus"] == {"odd": "failed", "after": "pending"}
    assert "odd" not in show["snapshot"]["state"]


def test_run_input_that_cannot_be_stored_is_a_one_line_error_and_creates_no_run(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, [{"id": "echo", "type": "noop", "input": {"got": "{{ flow.input }}"}}])
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "deep_object.json").write_text('{"k": ' + "[" * 100_000 + "]" * 100_000 + "}")
    env = {**clean_env, "PYTHONIOENCODING": "utf-8:surrogateescape"}
    cases = [(["--input", "k=bad\udcff"], "input.k is not valid UTF-8 text (byte 0xff at character 3)"),
             (["--input", "k=" + "[" * 100_000], "--input k=…: nested too deeply to read"),
             (["--input-json", "deep.json"], "--input-json deep.json: nested too deeply to read"),
             (["--input-json", "deep_object.json"], "--input-json deep_object.json: nested too deeply to read")]
    for args, message in cases:
        run = subprocess.run([sys.executable, "-m", "flowkernel.cli", "run", flow, *args, "--db", "runs.db"],
                             cwd=tmp_path, env=env, capture_output=True, timeout=60)
        stderr = run.stderr.decode("utf-8", "replace")
        assert run.returncode == 2, stderr
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and "Traceback" not in stderr, stderr
    assert not (tmp_path / "runs.db").exists() or fk("runs", "--db", "runs.db", cwd=tmp_path,
                                                     env=clean_env).stdout.strip() == "no runs"


def test_a_worker_marks_a_run_its_kernel_failed_on_as_failed_and_goes_on(tmp_path: Path,
                                                                          clean_env: dict[str, str]) -> None:
    import time

    from flowkernel.run.kernel import Kernel
    from flowkernel.store.open import open_store

    import tests.plugins.faulty  # noqa: F401 (registers faulty.event for this process's Kernel.compile)

    db = str(tmp_path / "runs.db")
    kernel = Kernel(open_store(db))
    buggy = kernel.compile({"name": "buggy", "nodes": [{"id": "first", "type": "noop", "input": {}},
                                                       {"id": "bad", "type": "faulty.event", "input": {}}],
                            "edges": [{"from": "first", "to": "bad"}]})
    fine = kernel.compile({"name": "fine", "nodes": [{"id": "only", "type": "noop", "input": {"n": 1}}]})
    log = tmp_path / "worker.log"
    with open(log, "wb") as err:
        worker = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "--plugin", PLUGIN, "worker", "--db", db],
                                  cwd=Path(__file__).resolve().parent.parent, env=clean_env,
                                  stdout=subprocess.DEVNULL, stderr=err)
    try:
        failed, after = kernel.enqueue(buggy, {}), None
        deadline = time.monotonic() + 60
        while after is None or kernel.store.get_run(after).status != "completed":
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"the worker did not finish both runs: {log.read_text()}"
            if after is None and kernel.store.get_run(failed).status == "failed":
                after = kernel.enqueue(fine, {})  # the same worker takes the next run
            time.sleep(0.02)
        worker.terminate()
        assert worker.wait(timeout=60) == 0
    finally:
        worker.kill()
        worker.wait(timeout=10)
    record = kernel.store.get_run(failed)
    assert record.status == "failed" and "internal error: KeyError: 'no-such-edge'" in (record.error or "")
    assert record.leaseOwner is None
    events = kernel.events(failed)
    assert events[-1].type == "flow:complete" and [e.seq for e in events] == list(range(1, len(events) + 1))
    reported = [line for line in log.read_text().splitlines() if failed in line and "claimed" not in line]
    assert len(reported) == 1 and "internal error" in reported[0] and "Traceback" not in log.read_text()
    kernel.close()


def test_a_child_run_the_kernel_failed_on_fails_its_parent_with_the_error_named(tmp_path: Path,
                                                                                  clean_env: dict[str, str]) -> None:
    (tmp_path / "child.json").write_text(json.dumps({"name": "child", "nodes": [
        {"id": "first", "type": "noop", "input": {}}, {"id": "buggy", "type": "faulty.event", "input": {}}],
        "edges": [{"from": "first", "to": "buggy"}]}))
    flow = write_flow(tmp_path, [{"id": "call", "type": "flow.call", "input": {"flow": "child.json"}},
                                 {"id": "after", "type": "noop", "input": {}}])
    run = fk("run", flow, "--json", cwd=tmp_path, env=clean_env)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert "internal error: KeyError: 'no-such-edge'" in lines[0] and "TaskGroup" not in lines[0], lines[0]
    records = [json.loads(line) for line in fk("runs", "--json", cwd=tmp_path, env=clean_env).stdout.splitlines()]
    assert {r["flowName"]: r["status"] for r in records} == {"faulty": "failed", "child": "failed"}
    parent = next(r for r in records if r["flowName"] == "faulty")
    _, events = stored(parent["runId"], tmp_path, clean_env)
    [error] = [e for e in events if e["type"] == "node:error"]
    assert error["nodeId"] == "call" and error["errorType"] == "KernelFault"
