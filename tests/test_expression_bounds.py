"""Bounded work: no JSONata expression can block a run past its limits, stop a pause or an abort from
reaching it, or stall the other runs of the process while it computes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.core.expression_bounds import ExpressionLimits
from flowkernel.core.expressions import Expr
from flowkernel.errors import ExpressionLimitError, InvalidInputError
from flowkernel.run.kernel import Kernel
from flowkernel.run.offload import limits_from_env
from flowkernel.store.memory import MemoryStore

ROOT = Path(__file__).resolve().parent.parent
FOREVER = "($f := function($x){ $f($x + 1) }; $f(0))"  # tail recursion: no stack growth, no end
DEEP = "($f := function($x){ 1 + $f($x + 1) }; $f(0))"
CATASTROPHIC = "$exists($match(a.s, /(a|aa)+$/))"
BACKTRACKS = "a" * 64 + "!"


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=120)


def spawn(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def write_flow(tmp_path: Path, nodes: list[dict[str, Any]], edges: list[dict[str, Any]] | None = None) -> str:
    path = tmp_path / "flow.json"
    path.write_text(json.dumps({"name": "bounded", "nodes": nodes, "edges": edges or []}))
    return str(path)


def events_until(stream: IO[str], predicate: Any) -> Iterator[dict[str, Any]]:
    for line in stream:
        event = json.loads(line)
        yield event
        if predicate(event):
            return
    raise AssertionError("the run ended before the expected event")


CASES = {
    "a range in a transform": (
        [{"id": "calc", "type": "transform", "input": {"expr": "$count([1..10000000])"}}], [],
        "node", "calc", "expression_error", "FLOWKERNEL_EXPR_MAX_ITEMS"),
    "padding in a binding": (
        [{"id": "calc", "type": "noop", "input": {"text": "{{ $pad('x', 100000000) }}"}}], [],
        "node", "calc", "binding_error", "FLOWKERNEL_EXPR_MAX_STRING"),
    "recursion in a node's when": (
        [{"id": "calc", "type": "noop", "input": {}, "when": DEEP}], [],
        "node", "calc", "binding_error", "FLOWKERNEL_EXPR_MAX_DEPTH"),
    "a catastrophic regular expression in an edge's when": (
        [{"id": "a", "type": "noop", "input": {"s": BACKTRACKS}}, {"id": "b", "type": "noop", "input": {}}],
        [{"from": "a", "to": "b", "when": CATASTROPHIC}],
        "edge", "a->b", "when failed", "FLOWKERNEL_EXPR_TIMEOUT_MS"),
    "an endless loop in forEach.in": (
        [{"id": "a", "type": "noop", "input": {}}, {"id": "b", "type": "noop", "input": {}}],
        [{"from": "a", "to": "b", "forEach": {"in": FOREVER, "as": "x"}}],
        "edge", "a->b", "forEach.in failed", "FLOWKERNEL_EXPR_TIMEOUT_MS"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_expression_past_its_limits_fails_the_run_with_the_limit_named(case: str, tmp_path: Path,
                                                                       clean_env: dict[str, str]) -> None:
    nodes, edges, where, name, kind, variable = CASES[case]
    env = {**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "300"}
    started = time.monotonic()
    run = fk("run", write_flow(tmp_path, nodes, edges), "--json", "--db", str(tmp_path / "r.db"), cwd=tmp_path,
             env=env)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and variable in lines[0] and "Traceback" not in run.stderr, run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines()]
    final = events[-1]
    assert final["type"] == "flow:complete" and final["status"] == "failed" and variable in final["error"]
    if where == "node":
        error = next(e for e in events if e["type"] == "node:error")
        assert error["nodeId"] == name and error["errorType"] == kind and variable in error["message"]
    else:
        assert final["error"].startswith(f"edge {name!r}: {kind}: ")
    # Bounded: well within the limits, not the minutes these expressions would otherwise take. (The
    # regular expression's share is CPU time, which a loaded machine stretches: hence the margin.)
    assert time.monotonic() - started < 60


def test_abort_from_another_process_stops_a_runaway_transform_at_once(tmp_path: Path,
                                                                      clean_env: dict[str, str]) -> None:
    env = {**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "600000"}  # ten minutes: only the abort can stop it
    db = str(tmp_path / "r.db")
    flow = write_flow(tmp_path, [{"id": "spin", "type": "transform", "input": {"expr": FOREVER}}])
    proc = spawn("run", flow, "--json", "--db", db, cwd=tmp_path, env=env)
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "node:start"))
        run_id = seen[0]["flowRunId"]
        started = time.monotonic()
        aborted = fk("abort", run_id, "--reason", "runaway", "--db", db, cwd=tmp_path, env=env)
        assert aborted.returncode == 0, aborted.stderr
        rest = [json.loads(line) for line in proc.stdout]
        assert proc.wait(timeout=60) == 1
        assert time.monotonic() - started < 30
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    assert rest[-1]["type"] == "flow:complete" and rest[-1]["status"] == "aborted" and rest[-1]["error"] == "runaway"
    assert not any(e["type"] in ("node:complete", "node:error") for e in rest)


def test_a_pause_reaches_a_runaway_binding_and_the_resumed_run_records_the_limit(tmp_path: Path,
                                                                                clean_env: dict[str, str]) -> None:
    db = str(tmp_path / "r.db")
    flow = write_flow(tmp_path, [
        {"id": "first", "type": "noop", "input": {"n": 1}},
        {"id": "then", "type": "noop", "input": {"value": "{{ " + FOREVER + " }}"}}],
        [{"from": "first", "to": "then"}])
    proc = spawn("run", flow, "--json", "--db", db, cwd=tmp_path,
                 env={**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "600000"})
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "edge:fire"))
        run_id = seen[0]["flowRunId"]
        paused = fk("pause", run_id, "--db", db, cwd=tmp_path, env=clean_env)
        assert paused.returncode == 0, paused.stderr
        rest = [json.loads(line) for line in proc.stdout]
        assert proc.wait(timeout=60) == 3
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    assert rest[-1]["type"] == "flow:paused"
    assert not any(e["type"] == "node:start" and e["nodeId"] == "then" for e in seen + rest)

    resumed = fk("resume", run_id, "--json", "--db", db, cwd=tmp_path,
                 env={**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "200"})
    assert resumed.returncode == 1
    events = [json.loads(line) for line in resumed.stdout.splitlines()]
    error = next(e for e in events if e["type"] == "node:error")
    assert error["nodeId"] == "then" and error["errorType"] == "binding_error"
    assert "ran longer than its 200 ms limit" in error["message"]
    replay = fk("replay", run_id, "--db", db, cwd=tmp_path, env=clean_env)  # from the events, not re-evaluated
    assert replay.returncode == 0 and "matches the stored snapshot" in replay.stderr


def _seen(kernel: Kernel, run_id: str, kind: str, node: str) -> bool:
    return any(r.runId == run_id for r in kernel.runs()) and any(
        e.type == kind and e.nodeId == node for e in kernel.events(run_id))


def test_one_runaway_expression_does_not_stall_the_other_runs_of_the_process() -> None:
    kernel = Kernel(MemoryStore(), services={"expression_limits": ExpressionLimits(timeout_ms=600_000)})
    computing = kernel.compile({"name": "computing", "nodes": [  # a node computes
        {"id": "spin", "type": "transform", "input": {"expr": FOREVER}}]})
    deciding = kernel.compile({"name": "deciding", "nodes": [  # the scheduler decides an edge
        {"id": "first", "type": "noop", "input": {}}, {"id": "never", "type": "noop", "input": {}}],
        "edges": [{"from": "first", "to": "never", "when": FOREVER}]})
    steady = kernel.compile({"name": "steady", "nodes": [
        {"id": f"n{i}", "type": "transform", "input": {"expr": f"{i} + 1"}} for i in range(20)],
        "edges": [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(19)]})
    finished: dict[str, str] = {}

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            async def execute(flow: Any, run_id: str) -> None:
                finished[run_id] = (await kernel.run(flow, run_id=run_id)).status

            tg.start_soon(execute, computing, "run_computing")
            tg.start_soon(execute, deciding, "run_deciding")
            with anyio.fail_after(60):
                while not (_seen(kernel, "run_computing", "node:start", "spin")
                           and _seen(kernel, "run_deciding", "node:complete", "first")):
                    await anyio.sleep(0.01)
                snap = await kernel.run(steady)
            finished["steady"] = snap.status
            assert set(finished) == {"steady"}  # the other two are still computing
            with anyio.fail_after(60):
                await kernel.command("run_computing", Command(kind="abort", reason="enough"))
                await kernel.command("run_deciding", Command(kind="abort", reason="enough"))

    anyio.run(main)
    assert finished == {"steady": "completed", "run_computing": "aborted", "run_deciding": "aborted"}


def test_bounded_expressions_run_without_a_guard_and_open_ones_are_recognised() -> None:
    bounded = ["planner.text", "$not(reviewer.structuredOutput.passed)", "'Hello, ' & flow.input.name & '!'",
               "$string($count(state.drafts) + 1)", "$lowercase($trim(review)) != 'approve'", "items[status = 'ok'].id",
               "{'answer': researcher.text, 'turns': researcher.numTurns}", "$join(shout.iterations.output, '-')",
               "$iteration < 3", "$exists(flow.input.topics) ? flow.input.topics : ['a', 'b']", "$split(name, '')"]
    open_ = [FOREVER, "[1..5]", "$match(s, /a+/)", "**.a", "$$.a", "a^(b)", "$join(a, b)", "$pad('x', 3)",
             "$eval('1')", "$sort(a)", "$map(a, $string)", "($x := 1; $x)", "a@$v.b", "$now()"]
    assert [src for src in bounded if not Expr(src).bounded] == []
    assert [src for src in open_ if Expr(src).bounded] == []
    # Every expression in the shipped example flows is bounded: none of them pays for a thread.
    for path in (ROOT / "flows").glob("*.json"):
        text = path.read_text()
        for node in json.loads(text)["nodes"]:
            expr = node["input"].get("expr") if node["type"] == "transform" else None
            if isinstance(expr, str):
                assert Expr(expr).bounded, (path.name, expr)


def test_limits_evaluate_where_called_outside_a_run_and_come_from_the_environment() -> None:
    with pytest.raises(ExpressionLimitError, match="nested deeper than 1000"):
        Expr(DEEP).evaluate({})
    assert limits_from_env({"FLOWKERNEL_EXPR_TIMEOUT_MS": "250", "FLOWKERNEL_EXPR_MAX_ITEMS": "10"}) == \
        ExpressionLimits(timeout_ms=250, max_items=10)
    with pytest.raises(InvalidInputError, match="FLOWKERNEL_EXPR_MAX_DEPTH='deep': expected a positive whole"):
        limits_from_env({"FLOWKERNEL_EXPR_MAX_DEPTH": "deep"})


def test_a_bad_limit_in_the_environment_is_a_one_line_error(tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, [{"id": "calc", "type": "transform", "input": {"expr": "[1..3]"}}])
    run = fk("run", flow, "--db", str(tmp_path / "r.db"), cwd=tmp_path,
             env={**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "soon"})
    assert run.returncode == 2
    assert run.stderr.strip() == "flowkernel: FLOWKERNEL_EXPR_TIMEOUT_MS='soon': expected a positive whole number"


def test_timeout_ms_stops_an_open_transform_that_its_limits_would_let_run_on() -> None:
    kernel = Kernel(MemoryStore(), services={"expression_limits": ExpressionLimits(timeout_ms=600_000)})
    flow = kernel.compile({"name": "timed", "nodes": [
        {"id": "spin", "type": "transform", "input": {"expr": FOREVER},
         "policy": {"timeoutMs": 300, "retry": {"maxAttempts": 2, "backoffMs": 10}}}]})
    started = time.monotonic()
    snap = anyio.run(kernel.run, flow)
    assert time.monotonic() - started < 30  # two attempts of 300 ms, not the ten minutes of the limit
    assert snap.status == "failed"
    errors = [e for e in kernel.events(snap.runId) if e.type == "node:error"]
    assert [(e.errorType, e.attempt, e.willRetry) for e in errors] == [("timeout", 1, True), ("timeout", 2, False)]
    assert all(e.message == "timed out after 300 ms" for e in errors)


def test_a_worker_goes_on_executing_runs_and_taking_commands_while_an_expression_computes(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    from flowkernel.store.open import open_store

    db = str(tmp_path / "runs.db")
    kernel = Kernel(open_store(db))
    runaway = kernel.compile({"name": "runaway", "nodes": [
        {"id": "spin", "type": "transform", "input": {"expr": FOREVER}}]})
    steady = kernel.compile({"name": "steady", "nodes": [
        {"id": f"n{i}", "type": "transform", "input": {"expr": f"$string({i})"}} for i in range(5)],
        "edges": [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(4)]})
    env = {**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "600000"}  # ten minutes: only the abort stops it
    worker = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "worker", "--db", db, "--concurrency", "2"],
                              cwd=tmp_path, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait_for(check: Any, what: str) -> None:
        deadline = time.monotonic() + 60
        while not check():
            assert worker.poll() is None, f"the worker exited: {worker.stderr.read() if worker.stderr else ''}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    try:
        spinning = kernel.enqueue(runaway, {})
        wait_for(lambda: any(e.type == "node:start" for e in kernel.events(spinning)), "the runaway node to start")
        after = kernel.enqueue(steady, {})
        wait_for(lambda: kernel.store.get_run(after).status == "completed", "the other run to complete")
        assert kernel.store.get_run(spinning).status == "running"  # still computing
        aborted = fk("abort", spinning, "--reason", "runaway", "--db", db, cwd=tmp_path, env=env)
        assert aborted.returncode == 0, aborted.stderr
        wait_for(lambda: kernel.store.get_run(spinning).status == "aborted", "the abort to stop the runaway run")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        worker.kill()
        worker.communicate(timeout=10)
        kernel.close()
    assert kernel_events_types(db, spinning)[-1] == "flow:complete"


def kernel_events_types(db: str, run_id: str) -> list[str]:
    from flowkernel.store.open import open_store

    kernel = Kernel(open_store(db))
    try:
        return [e.type for e in kernel.events(run_id)]
    finally:
        kernel.close()


def test_a_stopping_worker_hands_over_a_run_whose_scheduler_is_computing_an_expression(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    """SIGTERM while the rules evaluate a runaway binding: the worker does not wait for it (its grace is
    for node runs, and none is in flight); it leaves the run running, unleased, for another worker."""
    from flowkernel.store.open import open_store

    db = str(tmp_path / "runs.db")
    kernel = Kernel(open_store(db))
    flow = kernel.compile({"name": "deciding", "nodes": [
        {"id": "first", "type": "noop", "input": {"n": 1}},
        {"id": "then", "type": "noop", "input": {"value": "{{ " + FOREVER + " }}"}}],
        "edges": [{"from": "first", "to": "then"}]})
    env = {**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "600000"}
    worker = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "worker", "--db", db, "--grace-s", "120"],
                              cwd=tmp_path, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        run_id = kernel.enqueue(flow, {})
        deadline = time.monotonic() + 60
        while not any(e.type == "edge:fire" for e in kernel.events(run_id)):
            assert worker.poll() is None and time.monotonic() < deadline, "the worker never got to the binding"
            time.sleep(0.02)
        worker.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        assert worker.wait(timeout=60) == 0
        assert time.monotonic() - stopping < 30  # not the 120 s grace, nor the ten-minute limit
    finally:
        worker.kill()
        worker.communicate(timeout=10)
    record = kernel.store.get_run(run_id)
    assert record.status == "running" and record.leaseOwner is None
    assert not any(e.type == "node:start" and e.nodeId == "then" for e in kernel.events(run_id))
    kernel.close()


def test_a_limit_error_quotes_a_long_expression_cut_short_so_the_message_stays_one_readable_line(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    long = "($filler := '" + "x" * 9000 + "'; $count([1..10000000]))"  # valid (under 10,000 characters), open
    run = fk("run", write_flow(tmp_path, [{"id": "calc", "type": "transform", "input": {"expr": long}}]), "--json",
             "--db", str(tmp_path / "r.db"), cwd=tmp_path, env=clean_env)
    assert run.returncode == 1
    error = next(e for e in map(json.loads, run.stdout.splitlines()) if e["type"] == "node:error")
    assert "FLOWKERNEL_EXPR_MAX_ITEMS" in error["message"] and "($filler := 'xxx" in error["message"]
    assert len(error["message"]) < 300, error["message"]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 500, run.stderr
