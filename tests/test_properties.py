"""Properties of the scheduling rules over random valid flows, and unit tests of ``decide``.

Hypothesis builds flows with conditional edges, ``all`` and ``any`` joins, loop edges (maxIterations
0..3), forEach edges over small lists, node ``when`` and python nodes that fail deterministically
(some with ``continueOnError``), runs them in process, and checks against the event log:

- no node starts before its gate is satisfied (judged by an edge-status model kept here, from the
  log alone, not by the reducer under test), and no node starts twice without a loop reset;
- every run ends, completed or failed, within a bound of events that follows from the flow;
- loop counters never exceed ``maxIterations``;
- folding the stored events through the reducer reproduces the checkpoint the shell wrote.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from flowkernel.core.compiler import CompiledFlow, compile_flow
from flowkernel.core.events import (
    BaseEvent,
    EdgeFire,
    EdgeSkip,
    FlowComplete,
    FlowStart,
    LoopExhausted,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
    NodeStart,
    encode,
)
from flowkernel.core.reducer import apply, fold, initial_snapshot, own
from flowkernel.core.scheduling import Progress, awake, decide, running_count
from flowkernel.core.snapshot import ForEachState, RunSnapshot
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.checkpoint import load_checkpoint
from flowkernel.store.memory import MemoryStore
from flowkernel.store.sql.sqlite import SqliteStore
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from tests.plugins.crashy import check, check_later

RUN_TIMEOUT_S = 5  # generated runs take well under 0.2 s; a hang fails fast
MAX_ITEMS = 3

# Conditions that hold or not depending on the input, the state or whether ``{src}`` produced output
# (it has none when it failed under continueOnError or was skipped); none of them can raise.
EDGE_WHEN: list[Any] = [
    "true", "false", "flow.input.x > 2", "flow.input.x % 2 = 0", "$exists({src})", "$not($exists({src}))",
    "$count(state.log) % 2 = 1", {"equals": {"var": "flow.input.x", "value": 3}},
    {"not": {"equals": {"var": "flow.input.x", "value": 1}}},
    {"or": [{"equals": {"var": "flow.input.x", "value": 0}}, "$exists({src})"]},
]
LOOP_WHEN: list[Any] = ["true", "false", "$iteration < 2", "$count(state.log) < 4", "$exists({src})",
                        {"and": ["true", "flow.input.x != 5"]}]
NODE_WHEN: list[Any] = ["flow.input.x != 4", "$count(state.log) < 3", {"equals": {"var": "flow.input.x", "value": 2}}]
KINDS = ["transform", "python", "python", "state", "noop"]


def _with_src(when: Any, src: str) -> Any:
    return json.loads(json.dumps(when).replace("{src}", src))


@dataclass
class Case:
    document: dict[str, Any]
    input: dict[str, Any]
    sqlite: bool


def _node(node_id: str, kind: str, for_each: bool, const: int, fail_when: int, yields: int) -> dict[str, Any]:
    value = "{{ it }}" if for_each else "{{ flow.input.x + " + str(const) + " }}"
    if kind == "transform":
        return {"id": node_id, "type": "transform", "input": {"expr": "it * 2" if for_each else f"flow.input.x + {const}"}}
    if kind == "python":
        # crashy.check fails when its value ≡ fail_when (mod 3); fail_when 3 never fails. The async
        # variant yields to the event loop first, so concurrent node runs finish in varied orders.
        args: dict[str, Any] = {"value": value, "fail_when": fail_when}
        if yields:
            args["yields"] = yields
        return {"id": node_id, "type": "python",
                "input": {"function": "crashy.check_later" if yields else "crashy.check", "args": args}}
    if kind == "state":
        return {"id": node_id, "type": "state.set",
                "input": {"path": "log", "op": "append", "value": value if for_each else node_id}}
    return {"id": node_id, "type": "noop", "input": {"v": const}}


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A random valid flow, its input, and which store to run it on."""
    n = draw(st.integers(2, 7))
    ids = [f"n{i}" for i in range(n)]
    edges: list[dict[str, Any]] = []
    for_each_targets: set[str] = set()
    for j in range(1, n):
        sources = [ids[i] for i in range(j) if draw(st.integers(0, 2)) == 0]
        if not sources and draw(st.booleans()):
            sources = [ids[draw(st.integers(0, j - 1))]]
        gate = draw(st.sampled_from([None, "all", "any"]))
        fe_source = draw(st.sampled_from([None, *sources]))
        for src in sources:
            edge: dict[str, Any] = {"from": src, "to": ids[j]}
            if gate is not None:
                edge["gate"] = gate
            if draw(st.integers(0, 2)) == 0:
                edge["when"] = _with_src(draw(st.sampled_from(EDGE_WHEN)), src)
            if src == fe_source:
                items = draw(st.lists(st.integers(0, 9), max_size=MAX_ITEMS))
                edge["forEach"] = {"in": json.dumps(items), "as": "it"}
                for_each_targets.add(ids[j])
            edges.append(edge)
    for k in range(draw(st.integers(0, 2))):
        target = draw(st.integers(0, n - 1))
        source = draw(st.integers(target, n - 1))
        edges.append({"id": f"loop{k}", "from": ids[source], "to": ids[target],
                      "maxIterations": draw(st.integers(0, 3)),
                      "when": _with_src(draw(st.sampled_from(LOOP_WHEN)), ids[source])})
    nodes = []
    for node_id in ids:
        kind = draw(st.sampled_from(KINDS))
        node = _node(node_id, kind, node_id in for_each_targets, draw(st.integers(0, 5)), draw(st.integers(0, 3)),
                     draw(st.integers(0, 3)))
        if draw(st.integers(0, 4)) == 0:
            node["when"] = draw(st.sampled_from(NODE_WHEN))
        if kind == "python" and draw(st.booleans()):
            node["policy"] = {"continueOnError": True}
        nodes.append(node)
    document = {"name": "generated", "maxConcurrency": draw(st.integers(1, 4)), "state": {"initial": {"log": []}},
                "nodes": nodes, "edges": edges}
    return Case(document, {"x": draw(st.integers(0, 5))}, sqlite=draw(st.integers(0, 4)) == 0)


def _registry() -> Registry:
    reg = default_registry().copy()
    reg.add_function("crashy.check", check)
    reg.add_function("crashy.check_later", check_later)
    return reg


@dataclass
class Outcome:
    flow: CompiledFlow
    final: RunSnapshot
    events: list[BaseEvent]
    checkpoint_seq: int
    checkpoint: RunSnapshot


def _execute(case: Case) -> Outcome:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "runs.db") if case.sqlite else MemoryStore()
        kernel = Kernel(store, registry=_registry())
        try:
            flow = kernel.compile(case.document)

            async def run() -> RunSnapshot:
                with anyio.fail_after(RUN_TIMEOUT_S):
                    return await kernel.run(flow, case.input)

            final = anyio.run(run)
            checkpoint = load_checkpoint(store, final.runId)
            assert checkpoint is not None, "a stopped run has a checkpoint"
            return Outcome(flow, final, list(kernel.events(final.runId)), checkpoint[0], checkpoint[1])
        finally:
            kernel.close()


# -- an independent model of edge statuses, driven by the log alone ------------------------------

def _structure(document: dict[str, Any]) -> tuple[dict[str, tuple[str, str, bool]], dict[str, str]]:
    edges = {e.get("id") or f"{e['from']}->{e['to']}": (e["from"], e["to"], "maxIterations" in e)
             for e in document["edges"]}
    gates = {e["to"]: e["gate"] for e in document["edges"] if e.get("gate")}
    return edges, gates


def _reset_set(edges: dict[str, tuple[str, str, bool]], target: str) -> set[str]:
    """The loop target and every node reachable from it without crossing a loop edge."""
    reached, frontier = {target}, [target]
    while frontier:
        node = frontier.pop()
        for src, dst, is_loop in edges.values():
            if src == node and not is_loop and dst not in reached:
                reached.add(dst)
                frontier.append(dst)
    return reached


def assert_no_node_starts_before_its_gate(document: dict[str, Any], events: list[BaseEvent]) -> None:
    """Every node:start finds its gate satisfied; no node starts twice without a loop reset in
    between; and only the live run of a node (or forEach item) completes: a loop reset cancels it."""
    edges, gates = _structure(document)
    status = dict.fromkeys(edges, "pending")
    allowed = {n["id"]: 1 for n in document["nodes"]}
    starts = dict.fromkeys(allowed, 0)
    live: dict[tuple[str, int | None], str] = {}  # (node, item) -> its node run, until a loop resets it
    for ev in events:
        if isinstance(ev, EdgeFire):
            status[ev.edgeId] = "fired"
        elif isinstance(ev, EdgeSkip):
            status[ev.edgeId] = "skipped"
        elif isinstance(ev, LoopIterate):
            for node in _reset_set(edges, edges[ev.edgeId][1]):
                allowed[node] += 1
                live = {key: run for key, run in live.items() if key[0] != node}
                for eid, (src, _, is_loop) in edges.items():
                    if src == node and not is_loop:
                        status[eid] = "pending"
        elif isinstance(ev, NodeComplete | NodeError) and ev.runId is not None:
            key = (ev.nodeId or "", ev.item)
            assert live.get(key) == ev.runId, (
                f"{ev.type} of {key} at seq {ev.seq} comes from node run {ev.runId}, but the live run is "
                f"{live.get(key)}: a run that a loop reset must be cancelled, not finish")
        if isinstance(ev, NodeStart) and ev.runId is not None:
            live[(ev.nodeId or "", ev.item)] = ev.runId
        if isinstance(ev, NodeStart) and ev.item is None and ev.attempt == 1 and ev.resumedFrom is None:
            node = ev.nodeId or ""
            incoming = [status[eid] for eid, (_, dst, is_loop) in edges.items() if dst == node and not is_loop]
            where = f"node:start of {node} at seq {ev.seq} with incoming edges {incoming}"
            assert "pending" not in incoming, f"{where}: an incoming edge is undecided"
            if gates.get(node, "all") == "any":
                assert "fired" in incoming, f"{where}: gate any needs a fired edge"
            else:
                assert "skipped" not in incoming, f"{where}: gate all with a skipped edge"
                assert not incoming or "fired" in incoming, where
            starts[node] += 1
            assert starts[node] <= allowed[node], f"{where}: started again without a loop reset"


def assert_loop_counters_stay_bounded(document: dict[str, Any], outcome: Outcome) -> None:
    bounds = {e["id"]: e["maxIterations"] for e in document["edges"] if "maxIterations" in e}
    last = dict.fromkeys(bounds, 0)
    for ev in outcome.events:
        if isinstance(ev, LoopIterate):
            assert ev.iteration == last[ev.edgeId] + 1 <= bounds[ev.edgeId], ev
            last[ev.edgeId] = ev.iteration
        elif isinstance(ev, LoopExhausted):
            assert ev.iteration == bounds[ev.edgeId], ev
    assert all(count <= bounds[eid] for eid, count in outcome.final.loopCounters.items())
    assert outcome.final.loopCounters == {eid: n for eid, n in last.items() if n}


def event_bound(document: dict[str, Any]) -> int:
    """At most this many events: each loop iteration re-runs at most every node once (counters are
    never reset, so there are at most sum(maxIterations) iterations in all)."""
    passes = 1 + sum(e.get("maxIterations", 0) for e in document["edges"])
    per_pass = len(document["nodes"]) * (3 + 3 * MAX_ITEMS) + 3 * len(document["edges"])
    return 2 + passes * per_pass


def assert_run_ended(document: dict[str, Any], outcome: Outcome) -> None:
    events, final = outcome.events, outcome.final
    assert final.status in ("completed", "failed")
    assert len(events) <= event_bound(document)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    ends = [i for i, e in enumerate(events) if isinstance(e, FlowComplete)]
    assert ends == [len(events) - 1], "exactly one flow:complete, and it is the last event"
    if final.status == "completed":
        assert not {n: s for n, s in final.nodeStatus.items() if s in ("pending", "running")}
    else:
        assert final.error


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(cases())
def test_random_flows_respect_gates_end_bound_loops_and_replay_to_their_snapshot(case: Case) -> None:
    outcome = _execute(case)
    assert_no_node_starts_before_its_gate(case.document, outcome.events)
    assert_run_ended(case.document, outcome)
    assert_loop_counters_stay_bounded(case.document, outcome)
    assert outcome.checkpoint_seq == outcome.events[-1].seq, "the shell checkpoints the run when it stops"
    replayed = fold(outcome.flow, outcome.events)
    assert replayed == outcome.checkpoint, "replaying the stored events must give the stored snapshot"
    assert replayed == outcome.final


def test_generated_flows_cover_the_rules() -> None:
    """The generator reaches every rule the properties are about (else they pass vacuously)."""
    seen: set[str] = set()

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(cases())
    def observe(case: Case) -> None:
        events = _execute(case).events
        for ev in events:
            if isinstance(ev, NodeSkipped):
                seen.add(f"skipped:{ev.reason}")
            elif isinstance(ev, NodeStart) and ev.item is not None:
                seen.add("forEach item")
            elif isinstance(ev, LoopIterate | LoopExhausted):
                seen.add(ev.type)
            elif isinstance(ev, FlowComplete):
                seen.add(f"run {ev.status}")
            elif ev.type == "node:error":
                seen.add("node:error")
        starts = {e.nodeId for e in events if isinstance(e, NodeStart)}
        for edge in case.document["edges"]:
            if edge.get("gate") == "any" and edge["to"] in starts:
                seen.add("any join ran")
        if case.sqlite:
            seen.add("sqlite")

    observe()
    assert seen >= {"skipped:edge", "skipped:when", "forEach item", "loop:iterate", "loop:exhausted",
                    "run completed", "run failed", "node:error", "any join ran", "sqlite"}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(cases())
def test_pure_apply_leaves_every_earlier_snapshot_as_it_was_and_agrees_with_the_in_place_fold(case: Case) -> None:
    # The shell applies events to maps it owns, in place; everyone else (time travel, audits, tests)
    # gets the pure reducer, which must never change a snapshot it was given.
    outcome = _execute(case)
    first = outcome.events[0]
    assert isinstance(first, FlowStart)
    snap = initial_snapshot(outcome.flow, first)
    seen: list[tuple[RunSnapshot, bytes]] = [(snap, msgspec.json.encode(snap))]
    for ev in outcome.events[1:]:
        snap, _ = apply(outcome.flow, snap, ev)
        seen.append((snap, msgspec.json.encode(snap)))
    for i, (earlier, encoded) in enumerate(seen):
        assert msgspec.json.encode(earlier) == encoded, f"applying later events changed the snapshot at seq {i + 1}"
    assert snap == fold(outcome.flow, outcome.events) == outcome.final


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(cases())
def test_progress_kept_event_by_event_equals_progress_counted_from_the_snapshot(case: Case) -> None:
    # The shell hands ``decide`` counts it keeps up to date (joins, forEach cursors) instead of the
    # snapshot's maps: after every event they must be what counting the snapshot gives.
    outcome = _execute(case)
    flow = outcome.flow
    first = outcome.events[0]
    assert isinstance(first, FlowStart)
    snap = own(initial_snapshot(flow, first))
    kept = Progress()
    for ev in outcome.events[1:]:
        snap, _ = apply(flow, snap, ev, owned=True)
        kept.follow(flow, ev)
        fresh = Progress()
        for n in flow.nodes:
            assert kept.edges(flow, snap, n) == fresh.edges(flow, snap, n), f"{n} after seq {ev.seq} ({ev.type})"
        for n in snap.forEach:
            finished, cursor = kept.items(snap, n)
            assert finished == fresh.items(snap, n)[0], f"{n} after seq {ev.seq} ({ev.type})"
            fe = snap.forEach[n]
            assert all(r is not None or str(i) in fe.running for i, r in enumerate(fe.results[:cursor]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(cases())
def test_deciding_the_awake_nodes_decides_as_deciding_every_node(case: Case) -> None:
    # After a change to the whole run (a load, a resume) the shell hands ``decide`` the nodes it may act
    # on, not every node: on every snapshot of a run, and with and without the completion check, the
    # drafts and the nodes put off must be the same.
    outcome = _execute(case)
    flow = outcome.flow
    first = outcome.events[0]
    assert isinstance(first, FlowStart)
    snap = own(initial_snapshot(flow, first))
    for ev in outcome.events[1:]:
        snap, _ = apply(flow, snap, ev, owned=True)
        running = running_count(snap)
        for finish in (True, False):
            every = decide(flow, snap, flow.nodes, running, finish)
            some = decide(flow, snap, awake(flow, snap), running, finish)
            where = f"after seq {ev.seq} ({ev.type}), finish={finish}"
            assert [encode(d) for d in some.drafts] == [encode(d) for d in every.drafts], where
            assert some.deferred == every.deferred, where


# -- regressions the properties found (shrunk by hypothesis) ---------------------------------------

def _later(node_id: str, yields: int) -> dict[str, Any]:
    return {"id": node_id, "type": "python",
            "input": {"function": "crashy.check_later", "args": {"value": 1, "fail_when": 3, "yields": yields}}}


def _check_run(document: dict[str, Any]) -> Outcome:
    outcome = _execute(Case(document, {"x": 0}, sqlite=False))
    assert_no_node_starts_before_its_gate(document, outcome.events)
    assert_run_ended(document, outcome)
    assert fold(outcome.flow, outcome.events) == outcome.checkpoint
    return outcome


def test_loop_reset_cancels_a_node_still_running_so_its_old_run_never_completes() -> None:
    # n2 loops back to n0 while n1 (reset with n0) is still running; n1 must run again, and the
    # run from before the reset must not complete it.
    document = {"name": "reset-running", "nodes": [{"id": "n0", "type": "noop", "input": {}}, _later("n1", 5),
                                                     _later("n2", 1)],
                "edges": [{"from": "n0", "to": "n1"}, {"id": "loop0", "from": "n2", "to": "n0", "maxIterations": 1}]}
    outcome = _check_run(document)
    assert outcome.final.status == "completed"
    assert outcome.final.nodeRuns["n1"] == [e.runId for e in outcome.events
                                            if isinstance(e, NodeComplete) and e.nodeId == "n1"][-1]


def test_loop_reset_cancels_a_for_each_item_still_running() -> None:
    document = {"name": "reset-item", "nodes": [{"id": "n0", "type": "noop", "input": {}}, _later("n1", 1),
                                                  _later("n2", 1)],
                "edges": [{"from": "n0", "to": "n1", "forEach": {"in": "[0]", "as": "it"}},
                          {"id": "loop0", "from": "n2", "to": "n0", "maxIterations": 1}],
                "maxConcurrency": 2}
    assert _check_run(document).final.status == "completed"


# -- decide, on hand-built snapshots (no I/O) -----------------------------------------------------

def _compile(nodes: list[str], edges: list[dict[str, Any]]) -> CompiledFlow:
    return compile_flow({"name": "unit", "nodes": [{"id": n, "type": "noop"} for n in nodes], "edges": edges},
                        node_types=default_registry().node_types)


def _snapshot(flow: CompiledFlow, nodes: dict[str, str] | None = None, edges: dict[str, str] | None = None,
              **extra: Any) -> RunSnapshot:
    snap = initial_snapshot(flow, FlowStart(seq=1, timestamp=0, flowRunId="run_unit", flowName="unit",
                                            flowHash=flow.hash, input={}))
    return replace(snap, nodeStatus={**snap.nodeStatus, **(nodes or {})},
                   edgeStatus={**snap.edgeStatus, **(edges or {})}, **extra)


def _drafts(flow: CompiledFlow, snap: RunSnapshot, running: int = 0) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for d in decide(flow, snap, flow.nodes, running).drafts:
        if isinstance(d, NodeStart | NodeSkipped):
            out.append((d.type, d.nodeId))
        elif isinstance(d, EdgeFire | EdgeSkip):
            out.append((d.type, d.edgeId))
        elif isinstance(d, LoopIterate | LoopExhausted):
            out.append((d.type, d.edgeId, d.iteration))
        else:
            out.append((d.type,))
    return out


def _numbered(drafts: list[BaseEvent], after: int) -> list[BaseEvent]:
    for i, d in enumerate(drafts, start=after + 1):
        d.seq = i
    return drafts


def _join(gate: str) -> CompiledFlow:
    return _compile(["a", "b", "j"], [{"from": "a", "to": "j", "gate": gate}, {"from": "b", "to": "j", "gate": gate}])


@pytest.fixture(params=["all", "any"])
def join(request: pytest.FixtureRequest) -> Iterator[CompiledFlow]:
    yield _join(request.param)


def test_decide_join_waits_while_an_incoming_edge_is_pending(join: CompiledFlow) -> None:
    snap = _snapshot(join, {"a": "done", "b": "running"}, {"a->j": "fired"})
    assert _drafts(join, snap, running=1) == []


def test_decide_gate_all_starts_when_every_edge_fired_and_skips_on_any_skipped_edge() -> None:
    flow = _join("all")
    done = {"a": "done", "b": "done"}
    assert _drafts(flow, _snapshot(flow, done, {"a->j": "fired", "b->j": "fired"})) == [("node:start", "j")]
    assert _drafts(flow, _snapshot(flow, done, {"a->j": "fired", "b->j": "skipped"})) == [("node:skipped", "j")]


def test_decide_gate_any_starts_on_one_fired_edge_and_skips_when_all_skipped() -> None:
    flow = _join("any")
    done = {"a": "done", "b": "done"}
    assert _drafts(flow, _snapshot(flow, done, {"a->j": "skipped", "b->j": "fired"})) == [("node:start", "j")]
    assert _drafts(flow, _snapshot(flow, done, {"a->j": "skipped", "b->j": "skipped"})) == [("node:skipped", "j")]


def test_decide_skipped_node_skips_all_its_outgoing_edges() -> None:
    flow = _compile(["a", "b", "c"], [{"from": "a", "to": "b", "when": "true"}, {"from": "a", "to": "c"}])
    snap = _snapshot(flow, {"a": "skipped"})
    assert _drafts(flow, snap) == [("edge:skip", "a->b"), ("edge:skip", "a->c")]


def test_decide_skip_propagates_down_a_chain_step_by_step() -> None:
    flow = _compile(["a", "b", "c"], [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}])
    snap = _snapshot(flow, {"a": "done"}, {"a->b": "skipped"})
    assert _drafts(flow, snap) == [("node:skipped", "b")]
    snap = _snapshot(flow, {"a": "done", "b": "skipped"}, {"a->b": "skipped"})
    assert _drafts(flow, snap) == [("edge:skip", "b->c")]
    snap = _snapshot(flow, {"a": "done", "b": "skipped"}, {"a->b": "skipped", "b->c": "skipped"})
    assert _drafts(flow, snap) == [("node:skipped", "c")]


def _loop() -> CompiledFlow:
    return _compile(["work", "check", "after"], [
        {"from": "work", "to": "check"},
        {"id": "again", "from": "check", "to": "work", "maxIterations": 2},
        {"from": "check", "to": "after"},
    ])


def test_decide_loop_edge_iterates_while_under_its_bound() -> None:
    flow = _loop()
    snap = _snapshot(flow, {"work": "done", "check": "done"}, {"work->check": "fired"}, loopCounters={"again": 1})
    assert _drafts(flow, snap) == [("edge:fire", "again"), ("loop:iterate", "again", 2)]


def test_decide_loop_edge_at_its_bound_is_exhausted_and_the_flow_continues() -> None:
    flow = _loop()
    snap = _snapshot(flow, {"work": "done", "check": "done"}, {"work->check": "fired"}, loopCounters={"again": 2})
    assert _drafts(flow, snap) == [("loop:exhausted", "again", 2), ("edge:skip", "again"),
                                   ("edge:fire", "check->after")]


def test_decide_loop_with_max_iterations_zero_is_exhausted_at_once() -> None:
    flow = _compile(["a"], [{"id": "self", "from": "a", "to": "a", "maxIterations": 0}])
    snap = _snapshot(flow, {"a": "done"})
    assert _drafts(flow, snap) == [("loop:exhausted", "self", 0), ("edge:skip", "self")]


def test_decide_iterate_resets_the_loop_body_to_pending_through_the_reducer() -> None:
    flow = _loop()
    snap = _snapshot(flow, {"work": "done", "check": "done"}, {"work->check": "fired"})
    events = [EdgeFire(edgeId="again", from_="check", to="work", seq=2),
              LoopIterate(edgeId="again", iteration=1, seq=3)]
    after = fold(flow, events, snap)
    assert after.nodeStatus == {"work": "pending", "check": "pending", "after": "pending"}
    assert after.edgeStatus == {"work->check": "pending", "again": "pending", "check->after": "pending"}
    assert after.loopCounters == {"again": 1}
    assert _drafts(flow, after) == [("node:start", "work")]


def _loop_beside_a_branch(for_each: bool) -> CompiledFlow:
    """``a`` feeds ``b``; ``src`` (between them in definition order) loops back into ``a``."""
    into_b: dict[str, Any] = {"from": "a", "to": "b"}
    if for_each:
        into_b["forEach"] = {"in": "[1, 2]", "as": "it"}
    return _compile(["a", "src", "b"], [into_b, {"id": "back", "from": "src", "to": "a", "maxIterations": 1}])


def test_decide_starts_nothing_in_the_same_decision_as_a_loop_reset() -> None:
    # The loop resets a and b; b must not start on the snapshot from before the reset.
    flow = _loop_beside_a_branch(for_each=False)
    snap = _snapshot(flow, {"a": "done", "src": "done"}, {"a->b": "fired"})
    decision = decide(flow, snap, flow.nodes, 0)
    assert [(d.type, d.nodeId) for d in decision.drafts] == [("edge:fire", None), ("loop:iterate", None)]
    after = fold(flow, _numbered(decision.drafts, snap.seq), snap)
    assert after.nodeStatus == {"a": "pending", "src": "done", "b": "pending"}
    assert _drafts(flow, after) == [("node:start", "a")]


def test_decide_starts_no_for_each_item_of_a_node_the_same_decision_resets() -> None:
    flow = _loop_beside_a_branch(for_each=True)
    snap = _snapshot(flow, {"a": "done", "src": "done"}, {"a->b": "fired"})
    snap = fold(flow, _numbered([NodeStart(nodeId="b", runId="nr_b", attempt=1, input={"items": [1, 2]})], snap.seq),
                replace(snap, forEach={"b": ForEachState(items=[1, 2], results=[None, None])}))
    drafts = decide(flow, snap, flow.nodes, 0).drafts
    assert not [d for d in drafts if isinstance(d, NodeStart)]
    fold(flow, _numbered(drafts, snap.seq), snap)  # applying the decision in order must not fail


def test_decide_starts_nothing_beyond_max_concurrency() -> None:
    flow = compile_flow({"name": "unit", "maxConcurrency": 2, "nodes": [{"id": f"n{i}", "type": "noop"}
                                                                          for i in range(4)]},
                        node_types=default_registry().node_types)
    assert _drafts(flow, _snapshot(flow)) == [("node:start", "n0"), ("node:start", "n1")]
    assert _drafts(flow, _snapshot(flow, {"n0": "running"}), running=2) == []


def test_decide_completes_the_run_when_nothing_is_pending_or_running() -> None:
    flow = _join("any")
    snap = _snapshot(flow, {"a": "done", "b": "done", "j": "done"}, {"a->j": "fired", "b->j": "fired"})
    assert _drafts(flow, snap) == [("flow:complete",)]


def test_decide_does_nothing_for_a_run_that_is_not_running() -> None:
    flow = _join("all")
    assert _drafts(flow, _snapshot(flow, status="paused")) == []


def test_fold_of_node_complete_records_output_and_status() -> None:
    flow = _compile(["a"], [])
    snap = fold(flow, [NodeStart(nodeId="a", runId="nr_1", attempt=1, input=1, seq=2),
                       NodeComplete(nodeId="a", runId="nr_1", output=1, seq=3)], _snapshot(flow))
    assert (snap.nodeStatus, snap.outputs, snap.nodeRuns, snap.seq) == ({"a": "done"}, {"a": 1}, {"a": "nr_1"}, 3)
