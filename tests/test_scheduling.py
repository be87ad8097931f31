"""The scheduling rules of DESIGN §3, observed through real runs (in memory)."""

from __future__ import annotations

import gc
import time
from typing import Any

import anyio
import msgspec
import pytest
from flowkernel.core.events import (
    EdgeFire,
    FlowComplete,
    LoopExhausted,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
)
from flowkernel.core.node_context import NodeContext
from flowkernel.core.reducer import fold
from flowkernel.core.state_ops import apply_patch
from flowkernel.errors import FlowValidationError

from tests.helpers import flow, py, registry, run_flow, started, t


def test_independent_nodes_run_concurrently_within_max_concurrency() -> None:
    live = {"now": 0, "peak": 0}

    async def slow(ctx: NodeContext) -> str:
        live["now"] += 1
        live["peak"] = max(live["peak"], live["now"])
        await anyio.sleep(0.02)
        live["now"] -= 1
        return ctx.node_id

    nodes = [py(f"n{i}", "slow") for i in range(6)]
    _, snap, _ = run_flow(flow(nodes, maxConcurrency=3), reg=registry(slow=slow))
    assert snap.status == "completed"
    assert live["peak"] == 3


def test_conditional_branch_skips_the_other_side_and_skips_propagate() -> None:
    doc = flow(
        [t("a", "1"), t("yes", "'y'"), t("no", "'n'"), t("after_no", "'x'"), t("end_all", "'e'")],
        [{"from": "a", "to": "yes", "when": "a = 1"}, {"from": "a", "to": "no", "when": "a = 2"},
         {"from": "no", "to": "after_no"}, {"from": "yes", "to": "end_all"}, {"from": "after_no", "to": "end_all"}],
    )
    _, snap, events = run_flow(doc)
    assert snap.status == "completed"
    assert snap.nodeStatus == {"a": "done", "yes": "done", "no": "skipped", "after_no": "skipped",
                               "end_all": "skipped"}
    skipped = [(e.nodeId, e.reason) for e in events if isinstance(e, NodeSkipped)]
    assert skipped == [("no", "edge"), ("after_no", "edge"), ("end_all", "edge")]


def test_any_gate_joins_a_conditional_branch() -> None:
    doc = flow(
        [t("a", "5"), t("big", "'big'"), t("small", "'small'"), t("join", "big ? big : small")],
        [{"from": "a", "to": "big", "when": "a > 3"}, {"from": "a", "to": "small", "when": "a <= 3"},
         {"from": "big", "to": "join", "gate": "any"}, {"from": "small", "to": "join", "gate": "any"}],
    )
    _, snap, _ = run_flow(doc)
    assert snap.outputs["join"] == "big"
    assert snap.nodeStatus["small"] == "skipped"


def test_node_waits_for_every_incoming_edge_before_starting() -> None:
    order: list[str] = []

    async def step(ctx: NodeContext, delay: float) -> str:
        await anyio.sleep(delay)
        order.append(ctx.node_id)
        return ctx.node_id

    doc = flow([py("fast", "step", {"delay": 0}), py("slow", "step", {"delay": 0.05}), py("join", "step", {"delay": 0})],
               [{"from": "fast", "to": "join"}, {"from": "slow", "to": "join"}])
    _, _snap, _ = run_flow(doc, reg=registry(step=step))
    assert order == ["fast", "slow", "join"]


def test_node_when_false_skips_the_node() -> None:
    doc = flow([t("a", "1"), t("b", "'b'", when="a > 1"), t("c", "'c'")],
               [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}])
    _, snap, events = run_flow(doc)
    assert [(e.nodeId, e.reason) for e in events if isinstance(e, NodeSkipped)] == [("b", "when"), ("c", "edge")]
    assert snap.status == "completed"


def test_structured_when_forms() -> None:
    doc = flow(
        [t("a", "{'kind': 'x', 'n': 2}"), t("eq", "1"), t("neg", "1"), t("both", "1"), t("either", "1")],
        [{"from": "a", "to": "eq", "when": {"equals": {"var": "a.kind", "value": "x"}}},
         {"from": "a", "to": "neg", "when": {"not": {"equals": {"var": "a.kind", "value": "x"}}}},
         {"from": "a", "to": "both", "when": {"and": ["a.n = 2", {"equals": {"var": "a.kind", "value": "x"}}]}},
         {"from": "a", "to": "either", "when": {"or": ["a.n = 3", "a.n = 2"]}}],
    )
    _, snap, _ = run_flow(doc)
    assert snap.nodeStatus == {"a": "done", "eq": "done", "neg": "skipped", "both": "done", "either": "done"}


def test_loop_edge_iterates_then_exhausts_gracefully_and_the_flow_continues() -> None:
    doc = flow(
        [t("start", "0"), {"id": "work", "type": "state.set", "input": {"path": "n", "op": "append", "value": 1}},
         t("check", "false"), t("after", "$count(state.n)")],
        [{"from": "start", "to": "work"}, {"from": "work", "to": "check"},
         {"from": "check", "to": "work", "when": "$not(check)", "maxIterations": 2},
         {"from": "check", "to": "after"}],
    )
    _, snap, events = run_flow(doc)
    assert snap.status == "completed"
    assert [e.iteration for e in events if isinstance(e, LoopIterate)] == [1, 2]
    exhausted = [e for e in events if isinstance(e, LoopExhausted)]
    assert len(exhausted) == 1 and exhausted[0].iteration == 2
    assert snap.loopCounters == {"check->work": 2}
    assert snap.outputs["after"] == 3  # work ran three times
    assert started(events).count("work") == 3


def test_loop_condition_turning_false_leaves_the_loop_before_the_bound() -> None:
    doc = flow(
        [{"id": "work", "type": "state.set", "input": {"path": "n", "op": "append", "value": 1}},
         t("done", "$count(state.n) >= 2"), t("after", "'out'")],
        [{"from": "work", "to": "done"},
         {"from": "done", "to": "work", "when": "$not(done)", "maxIterations": 10},
         {"from": "done", "to": "after", "when": "done"}],
    )
    _, snap, events = run_flow(doc)
    assert snap.loopCounters == {"done->work": 1}
    assert not any(isinstance(e, LoopExhausted) for e in events)
    assert snap.outputs["after"] == "out"


def test_for_each_runs_one_node_run_per_item_and_collects_iterations() -> None:
    seen: list[tuple[Any, str]] = []

    def shout(ctx: NodeContext, word: str) -> str:
        seen.append((word, ctx.run_id))
        if word == "bad":
            raise ValueError("no bad words")
        return word.upper()

    doc = flow(
        [t("words", "['hi', 'bad', 'skip', 'yo']"),
         py("shout", "shout", {"word": "{{ w }}"}, when="w != 'skip'", policy={"continueOnError": True}),
         t("count", "$count(shout.iterations)")],
        [{"from": "words", "to": "shout", "forEach": {"in": "{{ words }}", "as": "w"}}, {"from": "shout", "to": "count"}],
    )
    _, snap, events = run_flow(doc, reg=registry(shout=shout))
    assert snap.status == "completed"
    assert snap.outputs["shout"] == {"iterations": [
        {"item": "hi", "output": "HI"}, {"item": "bad", "error": "no bad words"},
        {"item": "skip", "skipped": True}, {"item": "yo", "output": "YO"}]}
    assert len({run_id for _, run_id in seen}) == 3  # each item its own node run
    item_completes = [e for e in events if isinstance(e, NodeComplete) and e.nodeId == "shout" and e.item is not None]
    assert sorted(e.item for e in item_completes) == [0, 3]
    assert snap.outputs["count"] == 4


def test_a_running_for_each_group_keeps_its_finished_items_out_of_the_cyclic_collectors_view() -> None:
    """A group of 20,000 items keeps 20,000 results while it runs: tracked by the cyclic collector, they
    would make its full collections longer and more frequent as the group goes on."""
    doc = flow([t("xs", "[1, 2, 3]"), t("each", "{'x': x, 'nested': {'list': [x]}}")],
               [{"from": "xs", "to": "each", "forEach": {"in": "xs", "as": "x"}}])
    kernel, snap, events = run_flow(doc)
    assert snap.outputs["each"]["iterations"][0] == {"item": 1, "output": {"x": 1, "nested": {"list": [1]}}}
    group_done = next(i for i, e in enumerate(events)
                      if isinstance(e, NodeComplete) and e.nodeId == "each" and e.item is None)
    during = fold(kernel.compile(doc), events[:group_done])  # every item finished, the group not yet
    results = during.forEach["each"].results
    assert [msgspec.to_builtins(r) for r in results] == snap.outputs["each"]["iterations"]
    assert not any(gc.is_tracked(r) for r in results)


def test_for_each_item_variables_first_last_iteration() -> None:
    doc = flow(
        [t("xs", "[10, 20, 30]"), t("each", "{'x': x, 'i': $iteration, 'first': $first, 'last': $last}")],
        [{"from": "xs", "to": "each", "forEach": {"in": "xs", "as": "x"}}],
    )
    _, snap, _ = run_flow(doc)
    outs = [it["output"] for it in snap.outputs["each"]["iterations"]]
    assert outs == [{"x": 10, "i": 0, "first": True, "last": False}, {"x": 20, "i": 1, "first": False, "last": False},
                    {"x": 30, "i": 2, "first": False, "last": True}]


def test_failing_item_without_continue_on_error_fails_the_run() -> None:
    def boom(x: int) -> int:
        raise RuntimeError(f"item {x} broke")

    doc = flow([t("xs", "[1, 2]"), py("each", "boom", {"x": "{{ x }}"})],
               [{"from": "xs", "to": "each", "forEach": {"in": "xs", "as": "x"}}])
    _, snap, _ = run_flow(doc, reg=registry(boom=boom))
    assert snap.status == "failed"
    assert "2 of 2 items failed" in (snap.error or "")


def test_retry_with_backoff_then_success() -> None:
    calls: list[float] = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ConnectionError("try again")
        return "ok"

    doc = flow([py("f", "flaky", policy={"retry": {"maxAttempts": 3, "backoffMs": 20}})])
    _, snap, events = run_flow(doc, reg=registry(flaky=flaky))
    assert snap.status == "completed" and snap.outputs["f"] == "ok"
    errors = [e for e in events if isinstance(e, NodeError)]
    assert [(e.attempt, e.willRetry) for e in errors] == [(1, True), (2, True)]
    assert calls[1] - calls[0] >= 0.02 and calls[2] - calls[1] >= 0.04  # exponential backoff
    starts = [e for e in events if e.type == "node:start"]
    assert [getattr(e, "attempt", None) for e in starts] == [1, 2, 3]
    assert len({e.runId for e in starts}) == 3  # every attempt is its own node run


def test_timeout_really_cancels_the_node_and_counts_as_a_failed_attempt() -> None:
    finished: list[int] = []

    async def hang(ctx: NodeContext) -> str:
        await anyio.sleep(10)
        finished.append(ctx.attempt)
        return "never"

    doc = flow([py("h", "hang", policy={"timeoutMs": 50, "retry": {"maxAttempts": 2, "backoffMs": 0}})])
    began = time.monotonic()
    _, snap, events = run_flow(doc, reg=registry(hang=hang))
    assert time.monotonic() - began < 10  # a deadline: one attempt left to run would sleep its 10 s
    assert finished == []
    assert snap.status == "failed"
    errors = [e for e in events if isinstance(e, NodeError)]
    assert [(e.errorType, e.attempt, e.willRetry) for e in errors] == [("timeout", 1, True), ("timeout", 2, False)]


def test_continue_on_error_decides_outgoing_edges_as_usual() -> None:
    def boom() -> None:
        raise RuntimeError("broken")

    doc = flow([py("bad", "boom", policy={"continueOnError": True}), t("next", "'went on'")],
               [{"from": "bad", "to": "next"}])
    _, snap, _ = run_flow(doc, reg=registry(boom=boom))
    assert snap.status == "completed"
    assert snap.nodeStatus["bad"] == "failed" and snap.outputs["next"] == "went on"


def test_node_failing_for_good_fails_the_run_and_starts_nothing_after_it() -> None:
    def boom() -> None:
        raise RuntimeError("broken for good")

    doc = flow([py("bad", "boom"), t("next", "1")], [{"from": "bad", "to": "next"}])
    _, snap, events = run_flow(doc, reg=registry(boom=boom))
    assert snap.status == "failed"
    assert "broken for good" in (snap.error or "")
    assert "next" not in started(events)
    assert isinstance(events[-1], FlowComplete) and events[-1].status == "failed"


def test_bindings_keep_type_for_whole_binding_and_interpolate_mixed_strings() -> None:
    doc = flow([t("a", "{'n': 3, 'xs': [1, 2]}"),
                {"id": "b", "type": "noop", "input": {"whole": "{{ a.xs }}", "mixed": "n={{ a.n }} xs={{ a.xs }} "
                                                      "missing=[{{ a.nope }}]", "inp": "{{ flow.input.who }}"}}],
               [{"from": "a", "to": "b"}])
    _, snap, _ = run_flow(doc, {"who": "me"})
    assert snap.outputs["b"] == {"whole": [1, 2], "mixed": "n=3 xs=[1, 2] missing=[]", "inp": "me"}


def test_state_set_ops_emit_state_patches() -> None:
    doc = flow([{"id": "s1", "type": "state.set", "input": {"path": "a.b", "value": 1}},
                {"id": "s2", "type": "state.set", "input": {"path": "a", "op": "merge", "value": {"c": 2}}},
                {"id": "s3", "type": "state.set", "input": {"path": "log", "op": "append", "value": "x"}}],
               [{"from": "s1", "to": "s2"}, {"from": "s2", "to": "s3"}], state={"initial": {"log": []}})
    _, snap, events = run_flow(doc)
    assert snap.state == {"log": ["x"], "a": {"b": 1, "c": 2}}
    patches = [(e.op, e.path) for e in events if e.type == "state:patch"]
    assert patches == [("set", "a.b"), ("merge", "a"), ("append", "log")]
    # Each outputs what it wrote, never the whole value at its path.
    assert (snap.outputs["s1"], snap.outputs["s2"], snap.outputs["s3"]) == (1, {"c": 2}, "x")


def test_a_state_write_through_a_value_that_is_not_an_object_fails_the_node_and_keeps_the_data() -> None:
    initial = {"tags": ["keep", "me"], "user": {"name": "Ada"}}
    for path, op, where, kind in [("tags.first", "set", "state.tags", "a list"),
                                  ("user.name.first", "merge", "state.user.name", "a string"),
                                  ("user.name.parts", "append", "state.user.name", "a string")]:
        value = {"x": 1} if op == "merge" else "x"
        doc = flow([{"id": "write", "type": "state.set", "input": {"path": path, "op": op, "value": value}},
                    t("after", "1")], [{"from": "write", "to": "after"}], state={"initial": initial})
        _, snap, events = run_flow(doc)
        assert snap.status == "failed", path
        assert snap.state == initial  # nothing overwritten
        [error] = [e for e in events if isinstance(e, NodeError)]
        assert error.nodeId == "write" and error.errorType == "state_error"
        assert error.message.startswith(f"{where} is {kind}, not an object: cannot "), error.message
        assert f"state.{path} through it" in error.message
        assert not any(e.type == "state:patch" for e in events)

    # The same rule for a python node's ctx.patch_state.
    def write(ctx: NodeContext) -> str:
        ctx.patch_state("set", "tags.first", "lost?")
        return "unreachable"

    _, snap, _ = run_flow(flow([py("p", "write")], state={"initial": initial}), reg=registry(write=write))
    assert snap.status == "failed" and "state.tags is a list, not an object" in (snap.error or "")
    assert snap.state == initial
    # A missing or null parent is still created.
    assert apply_patch({"empty": None}, "set", "empty.inner", 1) == {"empty": {"inner": 1}}
    assert apply_patch({}, "append", "fresh.log", 1) == {"fresh": {"log": [1]}}


def test_python_function_must_be_registered() -> None:
    with pytest.raises(FlowValidationError, match=r"\$\.nodes\[0\]\.input\.function: unknown python function 'os.system'"):
        run_flow(flow([py("p", "os.system")]))
    # A name that a binding gives is only known at run time: the node fails then.
    _, snap, _ = run_flow(flow([py("p", "{{ 'os.' & 'system' }}")]))
    assert snap.status == "failed"
    assert "no python function 'os.system'" in (snap.error or "")


def test_events_have_gapless_seq_and_edges_decided_in_definition_order() -> None:
    doc = flow([t("a", "1"), t("x", "1"), t("y", "1"), t("z", "1")],
               [{"from": "a", "to": "z"}, {"from": "a", "to": "x"}, {"from": "a", "to": "y", "when": "false"}])
    _, _, events = run_flow(doc)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    decided = [(e.type, e.to) for e in events if e.type in ("edge:fire", "edge:skip")]  # type: ignore[attr-defined]
    assert decided == [("edge:fire", "z"), ("edge:fire", "x"), ("edge:skip", "y")]
    assert all(e.flowRunId == events[0].flowRunId for e in events)
    fire = next(e for e in events if isinstance(e, EdgeFire))
    assert fire.cause is None or fire.cause < fire.seq


def test_output_that_is_not_json_fails_the_node() -> None:
    def weird() -> object:
        return object()

    _, snap, _ = run_flow(flow([py("w", "weird")]), reg=registry(weird=weird))
    assert snap.status == "failed" and "not JSON" in (snap.error or "")


def test_python_nodes_call_every_kind_of_registered_callable() -> None:
    """Sync and async functions, a partial, and a callable object that cannot be hashed (what is
    known of each function is cached by the function itself)."""
    import functools

    class Scale:
        __hash__ = None  # type: ignore[assignment]

        def __init__(self, factor: int) -> None:
            self.factor = factor

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Scale) and other.factor == self.factor

        def __call__(self, x: int, ctx: NodeContext) -> int:
            ctx.patch_state("append", "seen", ctx.node_id)
            return x * self.factor

    async def later(x: int) -> int:
        await anyio.lowlevel.checkpoint()
        return x + 1

    def add(x: int, y: int) -> int:
        return x + y

    reg = registry(scale=Scale(3), later=later, plus_ten=functools.partial(add, y=10))
    doc = flow([py("a", "scale", {"x": 2}), py("b", "later", {"x": 1}), py("c", "plus_ten", {"x": 1}),
                py("d", "scale", {"x": 5})], [{"from": "a", "to": "b"}, {"from": "b", "to": "c"},
                                              {"from": "c", "to": "d"}])
    _, snap, _ = run_flow(doc, reg=reg)
    assert snap.status == "completed", snap.error
    assert snap.outputs == {"a": 6, "b": 2, "c": 11, "d": 15}
    assert snap.state == {"seen": ["a", "d"]}
