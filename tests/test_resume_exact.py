"""Resume is exact for every node type, whatever the crash point (each test kills a real process at a
chosen durable write with ``tests.plugins.crashpoint``, then resumes it in a new one).

WHEN a node run is killed part-way (after its state patch was stored, after ``agent:start`` but
before the prompt row, in the middle of a tool call, inside a child run)
THEN ``flowkernel resume`` finishes the run with what an uninterrupted run would have: each patch
counted once, each agent's conversation starting with its prompt, once, each tool call stored once,
the same child run carried on.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.agents.tools import INTERRUPTED_RESULT
from flowkernel.core.events import StatePatch
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore

from tests.crash_support import (
    EXAMPLES,
    FIXTURES,
    KILLED,
    conversations,
    flowkernel,
    normalized,
    only_run,
    write_flow,
)
from tests.helpers import py, registry, run_flow

CRASHY = ("tests.plugins.crashy",)


def patch_flow() -> dict[str, Any]:
    return {"name": "patches", "state": {"initial": {"xs": [1, 2, 3]}},
            "nodes": [py("add", "crashy.patch_then_work", {"path": "xs", "value": 4}),
                      {"id": "after", "type": "transform", "input": {"expr": "state.xs"}}],
            "edges": [{"from": "add", "to": "after"}]}


def test_a_patch_stored_by_a_node_run_killed_before_it_finished_counts_once_after_resume(tmp_path: Path) -> None:
    flow = write_flow(tmp_path, patch_flow())
    db = tmp_path / "runs.db"
    crashed = flowkernel(db, "run", str(flow), plugins=CRASHY, crash="after-event:state:patch:1")
    assert crashed.returncode == KILLED, crashed.stderr
    run_id = only_run(db)
    kernel = Kernel(str(db))
    try:
        assert any(isinstance(e, StatePatch) for e in kernel.events(run_id)), "the patch was stored before the kill"
        before = kernel.snapshot(run_id)
        assert before.nodeStatus["add"] == "running"
        assert before.state["xs"] == [1, 2, 3], "a patch of an unfinished node run is not in the state yet"
    finally:
        kernel.close()

    resumed = flowkernel(db, "resume", run_id, plugins=CRASHY)
    assert resumed.returncode == 0, resumed.stderr
    kernel = Kernel(str(db))
    try:
        final = kernel.snapshot(run_id)
        assert final.state["xs"] == [1, 2, 3, 4]
        assert final.outputs["after"] == [1, 2, 3, 4]
    finally:
        kernel.close()


def test_a_node_run_sees_its_own_patches_before_it_completes_and_others_see_them_after() -> None:
    seen: dict[str, Any] = {}

    async def writer(ctx: Any) -> str:
        ctx.patch_state("append", "xs", 4)
        ctx.patch_state("merge", "meta", {"by": "writer"})
        seen["own"] = ctx.state
        with anyio.fail_after(10):  # until both patches are stored
            while sum(b'"state:patch"' in b for b in ctx.store.read_events(ctx.flow_run_id)) < 2:
                await anyio.sleep(0.002)
        seen["stored"] = kernel.snapshot(ctx.flow_run_id)
        return "ok"

    doc = {"name": "own", "state": {"initial": {"xs": [1]}},
           "nodes": [py("writer", "writer"), {"id": "reader", "type": "transform", "input": {"expr": "state"}}],
           "edges": [{"from": "writer", "to": "reader"}]}
    kernel = Kernel(MemoryStore(), registry=registry(writer=writer))
    snap = anyio.run(kernel.run, kernel.compile(doc))
    assert seen["own"] == {"xs": [1, 4], "meta": {"by": "writer"}}
    stored = seen["stored"]
    assert stored.state == {"xs": [1]}, "the run's state changes when the node run completes"
    assert [(p.op, p.path) for p in stored.staged[stored.nodeRuns["writer"]]] == [("append", "xs"), ("merge", "meta")]
    assert snap.outputs["reader"] == {"xs": [1, 4], "meta": {"by": "writer"}}


def test_a_retried_node_run_applies_its_patches_once() -> None:
    calls = {"n": 0}

    def flaky(ctx: Any) -> int:
        calls["n"] += 1
        ctx.patch_state("append", "xs", calls["n"])
        if calls["n"] == 1:
            raise RuntimeError("first attempt fails after patching")
        return calls["n"]

    doc = {"name": "retry", "state": {"initial": {"xs": []}},
           "nodes": [py("flaky", "flaky", policy={"retry": {"maxAttempts": 2, "backoffMs": 0}})]}
    _, snap, _ = run_flow(doc, reg=registry(flaky=flaky))
    assert snap.status == "completed"
    assert snap.state["xs"] == [2], "the failed attempt's patch is discarded with it"


def test_a_failed_node_run_leaves_the_state_as_it_was() -> None:
    def broken(ctx: Any) -> None:
        ctx.patch_state("set", "flag", True)
        raise RuntimeError("broken")

    doc = {"name": "failing", "state": {"initial": {"flag": False}},
           "nodes": [py("broken", "broken", policy={"continueOnError": True}),
                     {"id": "after", "type": "transform", "input": {"expr": "state.flag"}}],
           "edges": [{"from": "broken", "to": "after"}]}
    _, snap, _ = run_flow(doc, reg=registry(broken=broken))
    assert snap.nodeStatus["broken"] == "failed"
    assert snap.state == {"flag": False} and snap.outputs["after"] is False


def test_patches_of_a_node_type_that_continues_from_its_progress_apply_at_once() -> None:
    seen: list[Any] = []

    class Stepper:
        """Cooperative: its patches are its progress (a node run that continues it reads them back)."""

        name = "stepper"
        cooperative_pause = True

        async def run(self, ctx: Any) -> Any:
            ctx.patch_state("set", "progress", 1)
            with anyio.fail_after(10):  # the patch is in the run's state before the node run ends
                while kernel.snapshot(ctx.flow_run_id).state.get("progress") != 1:
                    await anyio.sleep(0.002)
            seen.append(True)
            return "done"

    reg = registry()
    reg.add_node_type(Stepper)
    kernel = Kernel(MemoryStore(), registry=reg)
    snap = anyio.run(kernel.run, kernel.compile({"name": "steps", "nodes": [{"id": "s", "type": "stepper", "input": {}}]}))
    events = kernel.events(snap.runId)
    patch = next(e for e in events if isinstance(e, StatePatch))
    assert patch.staged is False and seen == [True]
    assert snap.state == {"progress": 1} and snap.staged == {}


# -- agents ---------------------------------------------------------------------------------------

RESEARCH = ("flowkernel.examples.research_tools",)
AGENT_FLOWS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "review-loop": (["--input", "feature=CSV export"], ()),
    "fanout": ([], ()),
    "research": (["--input", "question=Which database should our desktop app use?"], RESEARCH),
    "subflow": (["--input", "topic=durable workflows"], ()),
}
RESEARCH_REPLY = "Mostly record transactions."


@dataclass
class Finished:
    outputs: Any
    conversations: dict[str, list[Any]]
    tool_calls: list[dict[str, Any]]
    events: list[Any]


def finished(db: Path, run_id: str) -> Finished:
    kernel = Kernel(str(db))
    try:
        snap = kernel.snapshot(run_id)
        assert snap.status == "completed", (snap.status, snap.error)
        talks = conversations(kernel, run_id, without=frozenset({"continue"}))
        for child in kernel.runs(parent=run_id):  # a sub-flow's agents are in its own run
            talks |= {f"{child.flowName}/{k}": v for k, v in
                      conversations(kernel, child.runId, without=frozenset({"continue"})).items()}
        return Finished(outputs=normalized(snap.outputs), conversations=talks,
                        tool_calls=kernel.store.list_tool_calls(flow_run_id=run_id, limit=10_000),
                        events=kernel.events(run_id))
    finally:
        kernel.close()


def start(db: Path, name: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
    inputs, plugins = AGENT_FLOWS[name]
    return flowkernel(db, "run", str(EXAMPLES / f"{name}.json"), *inputs, "--fixtures", str(FIXTURES / name),
                      plugins=plugins, crash=crash)


def carry_on(db: Path, name: str, run_id: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
    """``resume`` the run, or ``reply`` to the node run it waits on (research asks the human once)."""
    _, plugins = AGENT_FLOWS[name]
    kernel = Kernel(str(db))
    try:
        snap = kernel.snapshot(run_id)
    finally:
        kernel.close()
    if snap.status == "waiting":
        return flowkernel(db, "reply", run_id, "--to", snap.waiting["researcher"].runId, RESEARCH_REPLY,
                          "--fixtures", str(FIXTURES / name), plugins=plugins, crash=crash)
    return flowkernel(db, "resume", run_id, "--fixtures", str(FIXTURES / name), plugins=plugins, crash=crash)


def to_the_end(db: Path, name: str, run_id: str) -> Finished:
    for _ in range(4):
        done = carry_on(db, name, run_id)
        if done.returncode == 0:
            return finished(db, run_id)
        assert done.returncode == 3, done.stderr  # research waits for its reply once
    raise AssertionError(f"run {run_id} did not finish")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Finished]:
    out = {}
    for name in AGENT_FLOWS:
        db = tmp_path_factory.mktemp(f"ref-{name}") / "runs.db"
        first = start(db, name)
        assert first.returncode in (0, 3), first.stderr
        out[name] = to_the_end(db, name, only_run(db)) if first.returncode == 3 else finished(db, only_run(db))
    return out


def assert_like_uninterrupted(got: Finished, reference: Finished) -> None:
    assert got.outputs == reference.outputs
    assert got.conversations == reference.conversations
    uses = [c["toolUseId"] for c in got.tool_calls]
    assert len(uses) == len(set(uses)), f"a tool call is stored twice: {uses}"
    assert sorted(uses) == sorted(c["toolUseId"] for c in reference.tool_calls)


def killed_then_finished(tmp_path: Path, name: str, crash: str, *, in_reply: bool = False) -> tuple[str, Finished]:
    db = tmp_path / "runs.db"
    first = start(db, name, crash=None if in_reply else crash)
    run_id = only_run(db)
    if in_reply:
        assert first.returncode == 3, first.stderr
        first = carry_on(db, name, run_id, crash=crash)
    assert first.returncode == KILLED, first.stderr
    return run_id, to_the_end(db, name, run_id)


def test_an_agent_killed_before_its_prompt_was_stored_starts_with_its_prompt_once(
        tmp_path: Path, uninterrupted: dict[str, Finished]) -> None:
    run_id, got = killed_then_finished(tmp_path, "review-loop", "before-message:1")
    kernel = Kernel(str(tmp_path / "runs.db"))
    try:
        planner = conversations(kernel, run_id)["ses_*_planner"]
    finally:
        kernel.close()
    prompt = uninterrupted["review-loop"].conversations["ses_*_planner"][0]
    assert planner[0] == prompt and planner.count(prompt) == 1
    assert planner[1] == {"role": "user", "content": "continue"}, "then the resume message, as the next turn"
    assert_like_uninterrupted(got, uninterrupted["review-loop"])


def test_resumed_foreach_agents_send_their_prompt_once(tmp_path: Path, uninterrupted: dict[str, Finished]) -> None:
    # The second message row is the second item's prompt: the first item's prompt is stored, and both
    # are in flight when the process dies.
    _, got = killed_then_finished(tmp_path, "fanout", "before-message:2")
    for session, messages in got.conversations.items():
        prompts = [m for m in messages if m["role"] == "user"]
        assert prompts == messages[:1] and len(prompts) == 1, session
    assert_like_uninterrupted(got, uninterrupted["fanout"])


def test_an_agent_killed_after_its_final_answer_was_stored_completes_with_it(
        tmp_path: Path, uninterrupted: dict[str, Finished]) -> None:
    _, got = killed_then_finished(tmp_path, "review-loop", "before-event:node:complete:1")
    assert got.conversations["ses_*_planner"][-1]["role"] == "assistant", "no model call after the answer"
    assert_like_uninterrupted(got, uninterrupted["review-loop"])


def test_a_tool_call_cut_short_by_a_crash_runs_again_on_resume(
        tmp_path: Path, uninterrupted: dict[str, Finished]) -> None:
    # The first answer asks for two lookups; the process dies before either row is stored.
    _, got = killed_then_finished(tmp_path, "research", "before-tool-call:1")
    first_two = got.tool_calls[:2]
    assert [(c["toolName"], c["status"]) for c in first_two] == [("lookup_fact", "completed")] * 2
    assert all(c["output"] != INTERRUPTED_RESULT for c in got.tool_calls)
    assert_like_uninterrupted(got, uninterrupted["research"])


def test_a_reply_stored_as_the_answer_to_ask_human_is_not_sent_again(
        tmp_path: Path, uninterrupted: dict[str, Finished]) -> None:
    # Killed after the ask_human tool-call row, before the user message that carries it.
    _, got = killed_then_finished(tmp_path, "research", "before-message:1", in_reply=True)
    assert_like_uninterrupted(got, uninterrupted["research"])


def test_messages_stored_before_their_inbox_was_marked_taken_are_not_sent_again(
        tmp_path: Path, uninterrupted: dict[str, Finished]) -> None:
    # Killed after the user message with the reply is stored, before inbox:consumed is committed.
    _, got = killed_then_finished(tmp_path, "research", "before-event:inbox:consumed:1", in_reply=True)
    assert_like_uninterrupted(got, uninterrupted["research"])


# -- child runs -----------------------------------------------------------------------------------

def test_a_child_run_killed_mid_node_is_resumed_by_its_resumed_parent(
        tmp_path: Path, uninterrupted: dict[str, Finished]) -> None:
    # Messages: the brief's prompt and answer, then the child's draft prompt (3) and answer (4).
    run_id, got = killed_then_finished(tmp_path, "subflow", "before-message:4")
    kernel = Kernel(str(tmp_path / "runs.db"))
    try:
        children = kernel.runs(parent=run_id)
        assert [c.status for c in children] == ["completed"], "the same child, carried on to the end"
        child = children[0].runId
        assert [e.type for e in kernel.events(child)].count("flow:resumed") == 1
    finally:
        kernel.close()
    assert_like_uninterrupted(got, uninterrupted["subflow"])



# -- resume of a failed run -----------------------------------------------------------------------

def test_resume_of_a_failed_run_gives_a_failed_agent_the_message_as_its_next_turn(tmp_path: Path) -> None:
    from flowkernel.testing.fake_api import FakeAnthropic, Text, reply

    flow = write_flow(tmp_path, {"name": "strict", "nodes": [{"id": "agent", "type": "claude.agent", "input": {
        "prompt": "Is it on?", "outputSchema": {"type": "object", "required": ["on"]}, "outputRetries": 0}}]})
    db = tmp_path / "runs.db"
    with FakeAnthropic() as fake:
        fake.script(reply(Text("Yes, it is on.")), reply(Text('{"on": true}')))
        extra = {"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "test"}
        failed = flowkernel(db, "run", str(flow), extra_env=extra)
        assert failed.returncode == 1 and "outputSchema" in failed.stderr, failed.stderr
        run_id = only_run(db)
        resumed = flowkernel(db, "resume", run_id, "--message", "Reply with the JSON only.", extra_env=extra)
        assert resumed.returncode == 0, resumed.stderr
        assert len(fake.requests[1].body["messages"]) == 3
    kernel = Kernel(str(db))
    try:
        assert next(iter(conversations(kernel, run_id).values())) == [
            {"role": "user", "content": "Is it on?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Yes, it is on."}]},
            {"role": "user", "content": "Reply with the JSON only."},
            {"role": "assistant", "content": [{"type": "text", "text": '{"on": true}'}]}]
        snap = kernel.snapshot(run_id)
        assert snap.status == "completed" and snap.outputs["agent"]["structuredOutput"] == {"on": True}
        starts = [e for e in kernel.events(run_id) if e.type == "node:start"]
        assert starts[1].resumedFrom == starts[0].runId, "the failed node run is continued"
    finally:
        kernel.close()


def test_resume_of_a_failed_run_reruns_its_failed_nodes_and_items_with_the_message() -> None:
    fixed = {"now": False}

    def picky(ctx: Any, n: int) -> Any:
        if n == 2 and not fixed["now"]:
            raise RuntimeError("not yet")
        return {"n": n, "heard": [m.content for m in ctx.inbox()]}

    doc = {"name": "items", "nodes": [{"id": "list", "type": "transform", "input": {"expr": "[1, 2, 3]"}},
                                      py("each", "picky", {"n": "{{ n }}"}),
                                      py("after", "picky", {"n": 0})],
           "edges": [{"from": "list", "to": "each", "forEach": {"in": "list", "as": "n"}},
                     {"from": "each", "to": "after"}]}
    kernel, snap, _ = run_flow(doc, reg=registry(picky=picky))
    assert snap.status == "failed"
    fixed["now"] = True
    done = anyio.run(kernel.resume, snap.runId, "go on")
    assert done.status == "completed"
    assert [r["output"] for r in done.outputs["each"]["iterations"]] == [
        {"n": 1, "heard": []}, {"n": 2, "heard": ["go on"]}, {"n": 3, "heard": []}]
    starts = [e for e in kernel.events(snap.runId) if e.type == "node:start" and e.nodeId == "each" and e.item == 1]
    assert starts[-1].resumedFrom == starts[0].runId
