"""The regular expressions a JSON Schema brings (a flow's `inputs`, a human.input reply schema, an
agent's outputSchema) are matched within the expression time limit, off the event loop, and a match
that runs out is a refusal naming the value and the schema keyword: never a frozen process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import regex
from flowkernel.core import bounded_regex
from flowkernel.core.commands import Command
from flowkernel.core.expression_bounds import ExpressionLimits
from flowkernel.core.expression_scope import EvaluationCancelled, Scope, set_scope
from flowkernel.core.jsonschemas import instance_errors
from flowkernel.errors import CommandRejectedError, PatternTimeoutError
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore
from flowkernel.testing.fake_api import FakeAnthropic, Text, reply

from tests.claude_support import agent_flow, make_kernel
from tests.helpers import py, registry
from tests.server_support import wait_for
from tests.test_server_runs import answering, free_port

ROOT = Path(__file__).resolve().parent.parent
BACKTRACKS = "^(a|a)+$"  # exponential in `re` and in `regex` alike
# Python's re needs about 20 s for this on an idle machine, the regex module about as long.
LONG = "a" * 26 + "!"


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=120)


KEYWORDS: dict[str, tuple[dict[str, Any], Any, str, str]] = {
    "pattern": ({"properties": {"name": {"type": "string", "pattern": BACKTRACKS}}}, {"name": LONG},
                ".name", "$.inputs.properties.name.pattern"),
    "patternProperties": ({"patternProperties": {BACKTRACKS: {"type": "number"}}}, {LONG: 1},
                          f".{LONG}", "$.inputs.patternProperties"),
    "additionalProperties": ({"properties": {"other": {}}, "patternProperties": {BACKTRACKS: {}},
                              "additionalProperties": False}, {LONG: 1}, f".{LONG}", "$.inputs.patternProperties"),
    "unevaluatedProperties": ({"allOf": [{"patternProperties": {BACKTRACKS: True}}], "unevaluatedProperties": False},
                              {LONG: 1}, f".{LONG}", "$.inputs.allOf[0].patternProperties"),
    "propertyNames": ({"propertyNames": {"pattern": BACKTRACKS}}, {LONG: 1}, "", "$.inputs.propertyNames.pattern"),
    "a pattern inside anyOf": ({"properties": {"n": {"anyOf": [{"type": "number"}, {"pattern": BACKTRACKS}]}}},
                               {"n": LONG}, ".n", "$.inputs.properties.n.anyOf[1].pattern"),
}


@pytest.mark.parametrize("keyword", list(KEYWORDS))
def test_every_pattern_keyword_stops_at_the_time_limit_naming_the_value_and_the_keyword(
        keyword: str, monkeypatch: pytest.MonkeyPatch) -> None:
    schema, instance, where, at = KEYWORDS[keyword]
    monkeypatch.setenv("FLOWKERNEL_EXPR_TIMEOUT_MS", "300")
    started = time.monotonic()
    with pytest.raises(PatternTimeoutError) as caught:
        instance_errors(schema, instance, schema_at="$.inputs")
    assert time.monotonic() - started < 5  # the limit, not the seconds to minutes of the match
    assert (caught.value.where, caught.value.keyword) == (where, at)
    assert f"of {at} ran past the 300 ms limit (FLOWKERNEL_EXPR_TIMEOUT_MS)" in str(caught.value)
    assert bounded_regex.live_children() == 0


def test_patterns_that_finish_keep_their_meaning() -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"}},
              "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False}
    assert instance_errors(schema, {"code": "ABC-12", "x-note": "ok"}) == []
    assert instance_errors(schema, {"code": "abc", "x-note": 1, "other": 2}) == [
        ("", "'other' does not match any of the regexes: '^x-'"),
        (".code", "'abc' does not match '^[A-Z]{3}-\\\\d+$'"),
        (".x-note", "1 is not of type 'string'")]


def test_a_cancelled_validation_stops_its_match_at_once_and_leaves_no_process() -> None:
    scope = Scope(ExpressionLimits(timeout_ms=600_000))  # only the cancellation can stop it
    outcome: list[BaseException | None] = []

    def validate() -> None:
        set_scope(scope)
        try:
            instance_errors({"pattern": BACKTRACKS}, "a" * 40 + "!")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        finally:
            set_scope(None)

    thread = threading.Thread(target=validate)
    thread.start()
    wait_for(lambda: bounded_regex.live_children() == 1, what="the match to move to a process of its own")
    cancelled = time.monotonic()
    scope.cancel()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - cancelled < 2
    assert isinstance(outcome[0], EvaluationCancelled)
    assert bounded_regex.live_children() == 0  # killed: no CPU goes on being spent on it


def test_a_match_that_moves_to_a_child_process_gives_the_results_the_regex_module_gives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[int] = []
    spawn = bounded_regex._spawn

    def counting() -> Any:
        spawned.append(1)
        return spawn()

    monkeypatch.setattr(bounded_regex, "_spawn", counting)
    monkeypatch.setattr(bounded_regex, "SLICE_S", 0.001)
    pattern = bounded_regex.compile_pattern("(?P<run>a|aa)+(?P<end>!?)$")
    subject = "a" * 18 + "!b" + "aa"
    bound = bounded_regex.Bound(time.monotonic() + 60)
    direct = list(regex.finditer(pattern.pattern, subject))
    found = list(bounded_regex.finditer(pattern, subject, bound))
    assert [(m.span(), m.groups(), m.groupdict(), m.group(0, "run")) for m in found] == \
        [(m.span(), m.groups(), m.groupdict(), m.group(0, "run")) for m in direct]
    assert bounded_regex.search(pattern, subject, bound).span() == direct[0].span()
    assert bounded_regex.sub(pattern, lambda m: m.group().upper(), subject, bound) == \
        regex.sub(pattern.pattern, lambda m: m.group().upper(), subject)
    assert bounded_regex.sub(pattern, "<\\g<run>>", subject, bound) == regex.sub(pattern.pattern, "<\\g<run>>", subject)
    assert bounded_regex.split(pattern, subject, bound) == regex.split(pattern.pattern, subject)
    assert len(spawned) >= 4 and bounded_regex.live_children() == 0


# --- through the faces: the CLI, the executing process, an agent, serve ----------------------------


def write_flow(tmp_path: Path, document: dict[str, Any]) -> str:
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_run_input_whose_pattern_runs_out_is_exit_2_naming_the_value_and_the_keyword(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, {"name": "p", "inputs": {"type": "object", "properties": {
        "name": {"type": "string", "pattern": BACKTRACKS}}}, "nodes": [{"id": "n", "type": "noop", "input": {}}]})
    (tmp_path / "input.json").write_text(json.dumps({"name": LONG}))
    started = time.monotonic()
    done = fk("run", flow, "--input-json", str(tmp_path / "input.json"), "--db", str(tmp_path / "r.db"),
              cwd=tmp_path, env={**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "300"})
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 30
    [line] = done.stderr.strip().splitlines()
    assert "input.name: matching the pattern '^(a|a)+$' of $.inputs.properties.name.pattern ran past the " \
           "300 ms limit (FLOWKERNEL_EXPR_TIMEOUT_MS)" in line and "Traceback" not in done.stderr


def test_a_reply_whose_pattern_runs_out_is_refused_and_recorded(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = str(tmp_path / "r.db")
    env = {**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "300"}
    flow = write_flow(tmp_path, {"name": "ask", "nodes": [{"id": "ask", "type": "human.input", "input": {
        "prompt": "Code?", "schema": {"type": "string", "pattern": BACKTRACKS}}}]})
    first = fk("run", flow, "--json", "--db", db, cwd=tmp_path, env=env)
    assert first.returncode == 3, first.stderr
    events = [json.loads(line) for line in first.stdout.splitlines()]
    run_id = events[0]["flowRunId"]
    node_run = next(e["runId"] for e in events if e["type"] == "node:waiting")
    answer = fk("reply", run_id, "--to", node_run, LONG, "--db", db, cwd=tmp_path, env=env)
    assert answer.returncode == 2, answer.stderr
    assert "matching the pattern '^(a|a)+$' of ask.input.schema.pattern ran past the 300 ms limit" in answer.stderr
    shown = fk("events", run_id, "--json", "--db", db, cwd=tmp_path, env=env)
    received = [json.loads(line) for line in shown.stdout.splitlines() if '"command:received"' in line]
    assert [(r["command"], r["accepted"]) for r in received] == [("reply", False)]
    fine = fk("reply", run_id, "--to", node_run, "aaa", "--db", db, cwd=tmp_path, env=env)
    assert fine.returncode == 0, fine.stderr


async def test_an_executing_process_judges_a_reply_off_its_event_loop() -> None:
    release = anyio.Event()

    async def slow() -> str:
        await release.wait()
        return "done"

    kernel = Kernel(MemoryStore(), registry=registry(slow=slow),
                    services={"expression_limits": ExpressionLimits(timeout_ms=1500)})
    flow = kernel.compile({"name": "both", "nodes": [
        {"id": "ask", "type": "human.input", "input": {"prompt": "Code?", "schema": {"pattern": BACKTRACKS}}},
        py("work", "slow")]})
    gaps: list[float] = []
    async with anyio.create_task_group() as tg:
        result: list[Any] = []

        async def execute() -> None:
            result.append(await kernel.run(flow, run_id="run_both"))

        tg.start_soon(execute)
        with anyio.fail_after(30):
            while not kernel.runs() or "ask" not in kernel.snapshot("run_both").waiting:
                await anyio.sleep(0.01)
        node_run = kernel.snapshot("run_both").waiting["ask"].runId

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await anyio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tg.start_soon(tick)
        with pytest.raises(CommandRejectedError, match="ran past the 1500 ms limit"):
            await kernel.command("run_both", Command(kind="reply", target=node_run, content=LONG))
        tg.cancel_scope.cancel()
    assert len(gaps) > 20 and max(gaps) < 0.5  # the loop went on meanwhile


async def test_an_output_schema_whose_pattern_runs_out_fails_the_agent_without_asking_again(tmp_path: Path) -> None:
    with FakeAnthropic() as fake:
        fake.script(reply(Text(json.dumps({"code": LONG}))), reply(Text(json.dumps({"code": "aaa"}))))
        kernel = make_kernel(tmp_path, fake, expression_limits=ExpressionLimits(timeout_ms=300))
        schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": BACKTRACKS}}}
        snap = await kernel.run(kernel.compile(agent_flow(prompt="Code?", outputSchema=schema)), {})
        assert snap.status == "failed"
        fault = snap.faults["agent"]
        assert fault.errorType == "error_output_schema"
        assert "code: matching the pattern '^(a|a)+$' of agent.input.outputSchema.properties.code.pattern ran " \
               "past the 300 ms limit" in fault.message
        assert fake.request_count == 1


def test_serve_refuses_a_run_whose_input_pattern_runs_out_and_answers_health_meanwhile(tmp_path: Path) -> None:
    import os

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "FLOWKERNEL_EXPR_TIMEOUT_MS": "3000"}
    env.pop("FLOWKERNEL_API_TOKEN", None)
    process = subprocess.Popen([sys.executable, "-m", "flowkernel", "serve", "--port", str(port), "--db",
                                str(tmp_path / "runs.db"), "--workers", "1"], stderr=subprocess.PIPE, text=True,
                               env=env, cwd=str(tmp_path))
    document = {"name": "p", "inputs": {"type": "object", "properties": {
        "name": {"type": "string", "pattern": BACKTRACKS}}}, "nodes": [{"id": "n", "type": "noop", "input": {}}]}
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answering(port), what="serve to answer")
        warm = httpx.post(f"{base}/api/v1/runs", json={"flowDocument": document, "input": {"name": "aa"}}, timeout=60)
        assert warm.status_code == 201, warm.text  # (the first request of a process imports what validates)
        answers: list[httpx.Response] = []

        def create() -> None:
            answers.append(httpx.post(f"{base}/api/v1/runs", json={"flowDocument": document, "input": {
                "name": "a" * 36 + "!"}}, timeout=60))

        poster = threading.Thread(target=create)
        poster.start()
        waits = []
        while poster.is_alive():
            began = time.monotonic()
            assert httpx.get(f"{base}/api/v1/health", timeout=30).status_code == 200
            waits.append(time.monotonic() - began)
            time.sleep(0.05)
        poster.join()
        assert len(waits) >= 3 and max(waits) < 1.5, waits
        [created] = answers
        assert created.status_code == 422, created.text
        [error] = created.json()["errors"]
        assert error["path"] == "$.input.name"
        assert "of $.inputs.properties.name.pattern ran past the 3000 ms limit" in error["message"]

        # A stop asked for while such a check runs still stops serve within its grace.
        poster = threading.Thread(target=lambda: httpx.post(f"{base}/api/v1/runs", json={
            "flowDocument": document, "input": {"name": "a" * 36 + "!"}}, timeout=60))
        poster.start()
        time.sleep(0.5)
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - stopped < 10
        poster.join(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.communicate(timeout=10)
