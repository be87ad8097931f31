"""Budgets (DESIGN §12): a run whose model calls reach its limit pauses at the agent's next turn
boundary with ``flow:paused {reason: "budget", costUsd, limitUsd}``; ``resume --budget`` raises the
limit (recorded in ``flow:resumed``) and the agent continues its stored conversation exactly.

Every model call goes through the real ``anthropic`` client to the fake Messages API. Prices: the
default model (claude-sonnet-5-5) bills $2 / $10 per million input / output tokens, so each call
below, 100,000 tokens in and 10,000 out, costs exactly $0.30.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command, judge_command
from flowkernel.core.events import AgentTool, AgentUsage, FlowPaused, FlowResumed, NodeStart
from flowkernel.core.reducer import fold
from flowkernel.errors import CommandRejectedError
from flowkernel.testing.audit import audit_run
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, held, reply

from tests.claude_support import make_kernel, sent, stored_conversation

CALL = {"input_tokens": 100_000, "output_tokens": 10_000}  # $0.30 on claude-sonnet-5-5


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def echo_agent(node_id: str = "agent", **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "claude.agent",
            "input": {"prompt": "Echo one, two, then say done", "model": "claude-sonnet-5-5", "tools": ["echo"]},
            **extra}


def tool_loop(fake: FakeAnthropic) -> None:
    """Three calls of $0.30: two tool rounds, then the answer."""
    fake.script(reply(ToolUse("echo", {"text": "one"}, id="tu_1"), **CALL),
                reply(ToolUse("echo", {"text": "two"}, id="tu_2"), **CALL),
                reply(Text("done"), **CALL))


async def test_a_run_over_its_budget_pauses_at_the_turn_boundary_and_resume_budget_continues_the_conversation(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    tool_loop(fake)
    kernel = make_kernel(tmp_path, fake)
    ran: list[str] = []
    kernel.registry.add_tool("echo", lambda text: ran.append(text) or text)
    flow = kernel.compile({"name": "budgeted", "budget": {"maxCostUsd": 0.5}, "nodes": [echo_agent()]})

    paused = await kernel.run(flow, {})

    # WHEN the second call takes the run from $0.30 to $0.60, over its $0.50
    assert paused.status == "paused" and fake.request_count == 2
    events = kernel.events(paused.runId)
    pause = next(e for e in events if isinstance(e, FlowPaused))
    assert (pause.reason, pause.costUsd, pause.limitUsd, pause.nodeId) == ("budget", 0.6, 0.5, None)
    usages = [e for e in events if isinstance(e, AgentUsage)]
    assert [round(u.costUsd, 2) for u in usages] == [0.3, 0.3]
    # THEN it paused right after that call, and the call's tool round still ran and was stored: the
    # agent stopped at the turn boundary that followed, with nothing lost
    assert events.index(pause) == events.index(usages[1]) + 1
    assert ran == ["one", "two"]
    assert [e.toolUseId for e in events if isinstance(e, AgentTool)] == ["tu_1", "tu_2"]
    assert paused.budgetPause is not None and paused.budgetPause.costUsd == 0.6
    assert round(paused.totalCostUsd, 10) == 0.6

    # a plain resume would spend on at once: refused, saying how to go on
    with pytest.raises(CommandRejectedError, match=r"spent \$0\.6 of its \$0\.5 budget.*--budget 1"):
        await kernel.resume(paused.runId)
    with pytest.raises(CommandRejectedError, match=r"spent \$0\.6 of its \$0\.55 budget"):
        await kernel.resume(paused.runId, budget=0.55)
    with pytest.raises(CommandRejectedError, match="positive number"):
        await kernel.resume(paused.runId, budget=-1)

    final = await kernel.resume(paused.runId, "go on", budget=1.0)

    assert final.status == "completed" and final.outputs["agent"]["text"] == "done"
    assert final.costLimits == {"flow": 1.0} and final.budgetPause is None
    assert round(final.totalCostUsd, 10) == 0.9
    resumed = [e for e in kernel.events(paused.runId) if isinstance(e, FlowResumed)]
    assert [(e.message, e.budgetUsd) for e in resumed] == [("go on", 1.0)]
    # the conversation goes on exactly: the third request is the second, its answer, the tool result
    # of the round that finished before the pause, and the resume message; no message twice or lost
    second, third = (sent(r.body)["messages"] for r in fake.requests[1:3])
    assert third == [*second,
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_2", "name": "echo",
                                                        "input": {"text": "two"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_2", "content": "two"},
                                                  {"type": "text", "text": "go on"}]}]
    assert stored_conversation(kernel, final.agentSessions["agent"]) == [
        *third, {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    assert ran == ["one", "two"]  # no tool ran twice
    # replaying the log gives the stored snapshot, limits and pause included
    assert fold(flow, kernel.events(paused.runId)) == kernel.snapshot(paused.runId)
    audit_run(kernel.store, paused.runId)


async def test_a_node_policy_limit_pauses_for_that_node_and_resume_budget_raises_the_nodes_limit(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    tool_loop(fake)
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("echo", lambda text: text)
    flow = kernel.compile({"name": "node-budget", "budget": {"maxCostUsd": 10},
                           "nodes": [echo_agent(policy={"maxCostUsd": 0.25})]})

    paused = await kernel.run(flow, {})

    assert paused.status == "paused" and fake.request_count == 1
    pause = next(e for e in kernel.events(paused.runId) if isinstance(e, FlowPaused))
    assert (pause.reason, pause.nodeId, pause.costUsd, pause.limitUsd) == ("budget", "agent", 0.3, 0.25)

    final = await kernel.resume(paused.runId, budget=0.7)

    # the node's limit was raised (the run's $10 stays); at $0.90 it is reached again
    assert final.status == "paused" and fake.request_count == 3
    assert final.costLimits == {"agent": 0.7}
    again = [e for e in kernel.events(paused.runId) if isinstance(e, FlowPaused)][-1]
    assert (again.nodeId, again.costUsd, again.limitUsd) == ("agent", 0.9, 0.7)
    # the node's cost counts every node run of it in this run: the resumed one went on from $0.30
    starts = [e for e in kernel.events(paused.runId) if isinstance(e, NodeStart)]
    assert len(starts) == 2 and starts[1].resumedFrom == starts[0].runId
    assert final.outputs["agent"]["text"] == "done"  # the answer of the third call was kept
    audit_run(kernel.store, paused.runId)


async def test_a_child_run_that_spends_the_parents_budget_pauses_the_parent_before_its_next_node(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("child answer"), **CALL), reply(Text("child answer 2"), **CALL))
    (tmp_path / "child.json").write_text(json.dumps({
        "name": "child", "nodes": [{"id": "agent", "type": "claude.agent",
                                    "input": {"prompt": "Answer", "model": "claude-sonnet-5-5"}}]}))
    (tmp_path / "parent.json").write_text(json.dumps({
        "name": "parent", "budget": {"maxCostUsd": 0.25},
        "nodes": [{"id": "call", "type": "flow.call", "input": {"flow": "child.json"}},
                  {"id": "after", "type": "transform", "input": {"expr": "call.agent.text"}}],
        "edges": [{"from": "call", "to": "after"}]}))
    kernel = make_kernel(tmp_path, fake)

    paused = await kernel.run(kernel.load_flow(tmp_path / "parent.json"), {})

    # the parent made no model call itself: its $0.30 is its child's
    assert paused.status == "paused" and paused.totalCostUsd == 0
    assert paused.nodeStatus == {"call": "done", "after": "pending"}
    pause = next(e for e in kernel.events(paused.runId) if isinstance(e, FlowPaused))
    assert (pause.reason, pause.costUsd, pause.limitUsd) == ("budget", 0.3, 0.25)
    assert kernel.summary(paused.runId).totalCostUsd == 0.3

    with pytest.raises(CommandRejectedError, match=r"spent \$0\.3 of its \$0\.25 budget"):
        await kernel.resume(paused.runId)
    final = await kernel.resume(paused.runId, budget=1)

    assert final.status == "completed" and final.outputs["after"] == "child answer"
    assert fake.request_count == 1
    audit_run(kernel.store, paused.runId)


async def test_a_child_still_running_that_spends_the_parents_budget_pauses_both_at_the_childs_turn_boundary(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    gate = threading.Event()  # never set: the child's third call is in flight when the pause comes
    fake.script(reply(ToolUse("echo", {"text": "one"}, id="tu_1"), **CALL),
                reply(ToolUse("echo", {"text": "two"}, id="tu_2"), **CALL),
                held(reply(Text("unused"), **CALL), release=gate),
                reply(Text("done"), **CALL))
    (tmp_path / "child.json").write_text(json.dumps({"name": "child", "nodes": [echo_agent()]}))
    (tmp_path / "parent.json").write_text(json.dumps({
        "name": "parent", "budget": {"maxCostUsd": 0.5},
        "nodes": [{"id": "call", "type": "flow.call", "input": {"flow": "child.json"}}]}))
    kernel = make_kernel(tmp_path, fake, budget_poll_s=0.05)
    kernel.registry.add_tool("echo", lambda text: text)

    with anyio.fail_after(60):
        paused = await kernel.run(kernel.load_flow(tmp_path / "parent.json"), {})

    # the parent saw its child's $0.60 while the child ran, and paused; the child stopped with it, its
    # third call (in flight) cancelled and not stored
    (child,) = kernel.runs(parent=paused.runId)
    assert paused.status == "paused" and child.status == "paused"
    pause = next(e for e in kernel.events(paused.runId) if isinstance(e, FlowPaused))
    assert (pause.reason, pause.nodeId, pause.costUsd, pause.limitUsd) == ("budget", None, 0.6, 0.5)
    session = kernel.snapshot(child.runId).agentSessions["agent"]
    third = sent(fake.requests[2].body)["messages"]
    assert stored_conversation(kernel, session) == third

    final = await kernel.resume(paused.runId, "go on", budget=2)

    assert final.status == "completed" and final.outputs["call"]["agent"]["text"] == "done"
    fourth = sent(fake.requests[3].body)["messages"]
    assert fourth[:len(third)] == third and len(fourth) == len(third) + 1  # the stored conversation, then "go on"
    assert stored_conversation(kernel, session)[-1] == {"role": "assistant", "content": [{"type": "text",
                                                                                          "text": "done"}]}
    audit_run(kernel.store, paused.runId)
    audit_run(kernel.store, child.runId)


async def test_a_child_paused_by_its_own_budget_pauses_the_parent_and_resume_budget_on_the_parent_raises_it(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    tool_loop(fake)
    (tmp_path / "child.json").write_text(json.dumps({"name": "child", "budget": {"maxCostUsd": 0.25},
                                                     "nodes": [echo_agent()]}))
    (tmp_path / "parent.json").write_text(json.dumps({
        "name": "parent",
        "nodes": [{"id": "call", "type": "flow.call", "input": {"flow": "child.json"}},
                  {"id": "after", "type": "transform", "input": {"expr": "call.agent.text"}}],
        "edges": [{"from": "call", "to": "after"}]}))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("echo", lambda text: text)

    paused = await kernel.run(kernel.load_flow(tmp_path / "parent.json"), {})

    # the child stopped at its agent's turn boundary after $0.30 of its $0.25; the parent paused with it
    (child,) = kernel.runs(parent=paused.runId)
    assert child.status == "paused" and fake.request_count == 1
    assert paused.status == "paused" and paused.nodeStatus["call"] == "running"
    pause = next(e for e in kernel.events(paused.runId) if isinstance(e, FlowPaused))
    assert (pause.reason, pause.nodeId, pause.costUsd, pause.limitUsd) == ("budget", "call", 0.3, 0.25)
    with pytest.raises(CommandRejectedError, match=r"node call has spent \$0\.3 of its \$0\.25 budget"):
        await kernel.resume(paused.runId)

    final = await kernel.resume(paused.runId, budget=1)

    # the child got the new limit and finished its conversation; then the parent went on
    assert final.status == "completed" and final.outputs["after"] == "done"
    assert kernel.snapshot(child.runId).costLimits == {"flow": 1.0}
    assert fake.request_count == 3 and kernel.summary(paused.runId).totalCostUsd == 0.9
    audit_run(kernel.store, paused.runId)
    audit_run(kernel.store, child.runId)


def test_the_budget_to_resume_with_is_judged_before_anything_is_recorded() -> None:
    from flowkernel.core.compiler import compile_flow
    from flowkernel.core.events import FlowStart
    from flowkernel.core.reducer import initial_snapshot
    from flowkernel.plugins.registry import default_registry

    flow = compile_flow({"name": "f", "nodes": [{"id": "a", "type": "noop"}]}, default_registry().node_types)
    snap = initial_snapshot(flow, FlowStart(flowName="f", flowHash=flow.hash, seq=1, flowRunId="run_x"))
    paused = fold(flow, [FlowPaused(seq=2, reason="pause requested")], snap)
    for bad in (0, -2, True, "ten", float("nan"), float("inf")):
        outcome = judge_command(flow, paused, Command(kind="resume", budget=bad), executing=False)
        assert not outcome.accepted and outcome.invalid and "positive number of US dollars" in (outcome.reason or "")
    outcome = judge_command(flow, paused, Command(kind="pause", budget=5), executing=False)
    assert not outcome.accepted and "--budget goes with resume" in (outcome.reason or "")
    assert judge_command(flow, paused, Command(kind="resume", budget=5), executing=False).accepted


# --- the command line ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=120)


def test_cli_exits_3_on_a_budget_pause_and_its_hint_resumes_the_run_as_printed(
        tmp_path: Path, fake: FakeAnthropic, clean_env: dict[str, str]) -> None:
    tool_loop(fake)
    plugin = tmp_path / "echo_tools.py"
    plugin.write_text("from flowkernel.plugins.registry import default_registry\n\n"
                      "default_registry().add_tool('echo', lambda text: text)\n")
    (tmp_path / "flow.json").write_text(json.dumps({"name": "budgeted", "budget": {"maxCostUsd": 0.5},
                                                    "nodes": [echo_agent()]}))
    env = {**clean_env, "ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "test",
           "PYTHONPATH": f"{clean_env['PYTHONPATH']}:{tmp_path}"}  # the tool plugin imports anywhere
    where = tmp_path / "elsewhere"
    where.mkdir()

    run = fk("--plugin", "echo_tools", "run", "flow.json", "--db", "runs.db", cwd=tmp_path, env=env)

    assert run.returncode == 3, run.stderr
    hint = next(line for line in run.stderr.splitlines() if "budget;" in line)
    assert "has spent $0.6 of its $0.5 budget" in hint and "Traceback" not in run.stderr
    command = hint.split("continue with: ", 1)[1]
    words = shlex.split(command)
    assert words[:2] == ["flowkernel", "resume"] and "--budget" in words and words[words.index("--budget") + 1] == "1"

    shown = fk("show", words[2], "--db", "runs.db", cwd=tmp_path, env=env)
    assert f"budget   run {words[2]} has spent $0.6 of its $0.5 budget: {command}" in shown.stdout

    # pasted somewhere else, as printed: the run goes on to the end
    done = fk(*words[1:], cwd=where, env=env)

    assert done.returncode == 0, done.stderr
    assert "budget raised to $1" in done.stdout
    assert fake.request_count == 3


def test_cli_refuses_a_budget_that_is_not_a_positive_number_and_validate_names_the_json_path(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    bad = fk("resume", "run_nope", "--budget", "-3", "--db", "runs.db", cwd=tmp_path, env=clean_env)
    assert bad.returncode == 2 and "--budget" in bad.stderr and "positive number" in bad.stderr
    assert not (tmp_path / "runs.db").exists()

    (tmp_path / "flow.json").write_text(json.dumps({
        "name": "f", "budget": {"maxCostUsd": 0},
        "nodes": [{"id": "a", "type": "noop", "policy": {"maxCostUsd": "5"}},
                  {"id": "b", "type": "noop", "maxCostUsd": 1}]}))
    checked = fk("validate", "flow.json", cwd=tmp_path, env=clean_env)
    assert checked.returncode == 2 and "Traceback" not in checked.stderr
    out = checked.stdout + checked.stderr
    assert "$.budget.maxCostUsd" in out and "greater than 0" in out
    assert "$.nodes[0].policy.maxCostUsd" in out
    assert "$.nodes[1].maxCostUsd" in out and "belongs in policy" in out

    schema = json.loads(fk("schema", cwd=tmp_path, env=clean_env).stdout)
    budget = schema["$defs"]["Budget"]
    assert budget["properties"]["maxCostUsd"]["exclusiveMinimum"] == 0 and budget["required"] == ["maxCostUsd"]
    assert "maxCostUsd" in schema["$defs"]["Policy"]["properties"]


def spent_then_failed(budget: float | None = None) -> dict[str, Any]:
    """``agent`` spends $0.30 and completes; then ``b`` fails (``boom``), so the run ends ``failed``. With a
    ``budget`` under $0.30 (a flow the failed run continues on, ``--flow``), the run has spent it."""
    extra: dict[str, Any] = {} if budget is None else {"budget": {"maxCostUsd": budget}}
    return {"name": "spent", **extra,
            "nodes": [{"id": "agent", "type": "claude.agent",
                       "input": {"prompt": "Say done", "model": "claude-sonnet-5-5"}},
                      {"id": "b", "type": "python", "input": {"function": "boom"}}],
            "edges": [{"from": "agent", "to": "b"}]}


BOOM_PLUGIN = ("from flowkernel.plugins.registry import default_registry\n\n"
               "def boom():\n    raise RuntimeError('boom')\n\n"
               "default_registry().add_function('boom', boom)\n")


def test_cli_retry_of_a_failed_run_that_has_spent_its_budget_is_refused_as_resume_is(
        tmp_path: Path, fake: FakeAnthropic, clean_env: dict[str, str]) -> None:
    fake.script(reply(Text("done"), **CALL))
    (tmp_path / "boom_plugin.py").write_text(BOOM_PLUGIN)
    (tmp_path / "flow.json").write_text(json.dumps(spent_then_failed()))
    (tmp_path / "lower.json").write_text(json.dumps(spent_then_failed(budget=0.25)))
    env = {**clean_env, "ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "test",
           "PYTHONPATH": f"{clean_env['PYTHONPATH']}:{tmp_path}"}
    plugin = ["--plugin", "boom_plugin"]
    run = fk(*plugin, "run", "flow.json", "--db", "runs.db", "--json", cwd=tmp_path, env=env)
    assert run.returncode == 1, run.stderr
    run_id = json.loads(run.stdout.splitlines()[0])["flowRunId"]
    # continued on a flow whose budget is under what the run spent, the run fails again at b
    again = fk(*plugin, "retry", run_id, "--flow", "lower.json", "--db", "runs.db", cwd=tmp_path, env=env)
    assert again.returncode == 1 and "boom" in again.stderr, again.stderr

    def log() -> list[dict[str, Any]]:
        shown = fk("events", run_id, "--db", "runs.db", "--json", cwd=tmp_path, env=env)
        return [json.loads(line) for line in shown.stdout.splitlines()]

    before = log()
    resumed = fk(*plugin, "resume", run_id, "--db", "runs.db", cwd=tmp_path, env=env)
    retried = fk(*plugin, "retry", run_id, "--db", "runs.db", cwd=tmp_path, env=env)

    refusal = f"flowkernel: run {run_id} has spent $0.3 of its $0.25 budget; resume with a higher limit: --budget 0.5"
    assert resumed.stderr.strip() == refusal and resumed.returncode == 2, resumed.stderr
    assert retried.stderr.strip() == refusal and retried.returncode == 2, retried.stderr
    # each refusal is recorded, and nothing ran again
    after = log()
    assert [(e["type"], e["command"], e["accepted"]) for e in after[len(before):]] == [
        ("command:received", "resume", False), ("command:received", "retry", False)]
    assert fake.request_count == 1


# --- over HTTP: the same Kernel.resume, through the worker pool -----------------------------------

def test_resume_over_http_takes_a_budget_and_the_pool_continues_the_run(tmp_path: Path, fake: FakeAnthropic) -> None:
    from flowkernel.agents.anthropic import AnthropicQuery
    from flowkernel.plugins.registry import default_registry

    from tests.server_support import pool_worker, serving, wait_for
    from tests.test_server import assert_problem

    tool_loop(fake)
    reg = default_registry().copy()
    reg.add_tool("echo", lambda text: text)
    query = AnthropicQuery(base_url=fake.base_url, api_key="test", backoff_s=0.01, max_retries=3)
    db = str(tmp_path / "runs.db")
    document = {"name": "budgeted", "budget": {"maxCostUsd": 0.5}, "nodes": [echo_agent()]}
    with serving(db, registry=reg, services={"query_fn": query}) as live, \
            pool_worker(db, registry=reg, services={"query_fn": query}), live.client() as http:
        run_id = http.post("/api/v1/runs", json={"flowDocument": document}).json()["runId"]

        def run() -> dict[str, Any]:
            body: dict[str, Any] = http.get(f"/api/v1/runs/{run_id}").json()
            return body

        wait_for(lambda: run()["run"]["status"] == "paused", what="the run to pause for its budget")
        assert run()["snapshot"]["budgetPause"] == {"costUsd": 0.6, "limitUsd": 0.5}
        assert_problem(http.post(f"/api/v1/runs/{run_id}/resume", json={"budget": 0}), 422, path="$.budget")
        refused = assert_problem(http.post(f"/api/v1/runs/{run_id}/resume", json={}), 409)
        assert "spent $0.6 of its $0.5 budget" in refused["detail"] and "--budget 1" in refused["detail"]

        resumed = http.post(f"/api/v1/runs/{run_id}/resume", json={"message": "go on", "budget": 1})

        assert resumed.status_code == 202, resumed.text
        wait_for(lambda: run()["run"]["status"] == "completed", what="the pool to finish the run")
        events = http.get(f"/api/v1/runs/{run_id}/events", params={"types": "flow:resumed"}).json()["items"]
        assert [(e["message"], e["budgetUsd"]) for e in events] == [("go on", 1.0)]
        assert run()["snapshot"]["costLimits"] == {"flow": 1.0} and run()["run"]["totalCostUsd"] == 0.9
    assert fake.request_count == 3


def test_retry_over_http_of_a_failed_run_that_has_spent_its_budget_is_refused_as_resume_is(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    from flowkernel.agents.anthropic import AnthropicQuery
    from flowkernel.plugins.registry import default_registry

    from tests.server_support import pool_worker, serving, wait_for
    from tests.test_server import assert_problem

    def boom() -> None:
        raise RuntimeError("boom")

    fake.script(reply(Text("done"), **CALL))
    reg = default_registry().copy()
    reg.add_function("boom", boom)
    query = AnthropicQuery(base_url=fake.base_url, api_key="test", backoff_s=0.01, max_retries=3)
    db = str(tmp_path / "runs.db")
    with serving(db, registry=reg, services={"query_fn": query}) as live, \
            pool_worker(db, registry=reg, services={"query_fn": query}), live.client() as http:
        run_id = http.post("/api/v1/runs", json={"flowDocument": spent_then_failed()}).json()["runId"]

        def ended_failed(after: int) -> bool:
            events = http.get(f"/api/v1/runs/{run_id}/events", params={"after": after}).json()["items"]
            return any(e["type"] == "flow:complete" and e["status"] == "failed" for e in events)

        wait_for(lambda: ended_failed(0), what="the run to fail at b")
        seq = http.get(f"/api/v1/runs/{run_id}").json()["snapshot"]["seq"]
        lowered = http.post(f"/api/v1/runs/{run_id}/retry", json={"flowDocument": spent_then_failed(budget=0.25)})
        assert lowered.status_code == 202, lowered.text
        wait_for(lambda: ended_failed(seq), what="the run to fail again on the flow with the lower budget")

        resumed = assert_problem(http.post(f"/api/v1/runs/{run_id}/resume", json={}), 409)
        retried = assert_problem(http.post(f"/api/v1/runs/{run_id}/retry", json={}), 409)

        assert "has spent $0.3 of its $0.25 budget" in retried["detail"] and "--budget 0.5" in retried["detail"]
        assert retried["detail"] == resumed["detail"]
        assert http.get(f"/api/v1/runs/{run_id}").json()["run"]["status"] == "failed"
    assert fake.request_count == 1


# --- the rule, pure ---------------------------------------------------------------------------------

def test_a_limit_is_reached_when_the_cost_equals_it_in_cents_whatever_the_float_sum_says() -> None:
    from flowkernel.core.budgets import over_budget
    from flowkernel.core.compiler import compile_flow
    from flowkernel.core.events import FlowStart
    from flowkernel.core.reducer import initial_snapshot
    from flowkernel.plugins.registry import default_registry

    flow = compile_flow({"name": "f", "budget": {"maxCostUsd": 0.3},
                         "nodes": [{"id": "a", "type": "noop", "policy": {"maxCostUsd": 0.2}}]},
                        default_registry().node_types)
    snap = initial_snapshot(flow, FlowStart(flowName="f", flowHash=flow.hash, seq=1, flowRunId="run_x"))
    snap = fold(flow, [AgentUsage(seq=2, nodeId="b", model="m", costUsd=0.1),
                       AgentUsage(seq=3, nodeId="b", model="m", costUsd=0.1)], snap)
    assert over_budget(flow, snap, node_id="b") is None  # $0.2 of the run's $0.3; b has no limit of its own
    snap = fold(flow, [AgentUsage(seq=4, nodeId="a", model="m", costUsd=0.1)], snap)
    assert snap.totalCostUsd != 0.3  # 0.1 + 0.1 + 0.1 in floats
    paused = over_budget(flow, snap, node_id="a")
    assert paused is not None and (paused.nodeId, paused.costUsd, paused.limitUsd) == (None, 0.3, 0.3)
    # a's own limit is reached first once it has spent $0.2; resuming with --budget raises a's, not the run's
    snap = fold(flow, [AgentUsage(seq=5, nodeId="a", model="m", costUsd=0.1)], snap)
    paused = over_budget(flow, snap, node_id="a")
    assert paused is not None and (paused.nodeId, paused.costUsd, paused.limitUsd) == ("a", 0.2, 0.2)
    paused.seq = 6
    resumed = fold(flow, [paused, FlowResumed(seq=7, budgetUsd=0.5)], snap)
    assert resumed.costLimits == {"a": 0.5} and resumed.budgetPause is None
    assert over_budget(flow, resumed, node_id="a") is not None  # the run's $0.3 still holds: $0.4 spent
