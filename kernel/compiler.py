"""Validate a flow document and compile it into the graph the scheduler walks.

Every problem is collected (shape, ids, types, edges, gates, cycles, expressions) and reported at
once, each with its JSON path, before anything runs.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowkernel.errors import FlowValidationError, Problem
from flowkernel.expressions import (
    Condition,
    Expr,
    Template,
    compile_expr,
    compile_template,
    compile_when,
    strip_braces,
)
from flowkernel.flowfile import canonical_json, flow_hash, read_flow_document

RESERVED_IDS = frozenset({"flow", "state"})


@dataclass(frozen=True, slots=True)
class RetrySpec:
    maxAttempts: int = 1
    backoffMs: int = 0


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A node's ``policy``, with the defaults of the flow file format."""

    retry: RetrySpec | None = None
    timeoutMs: int | None = None
    continueOnError: bool = False


@dataclass(frozen=True, slots=True)
class CompiledEdge:
    id: str
    index: int
    source: str
    target: str
    when: Condition
    is_loop: bool
    max_iterations: int | None
    for_each: Expr | None
    for_each_as: str


@dataclass(frozen=True, slots=True)
class CompiledNode:
    id: str
    index: int
    type: str
    input: Template
    raw_input: dict[str, Any]
    when: Condition
    policy: PolicySpec


@dataclass(slots=True)
class CompiledFlow:
    """A validated flow: nodes, edges and the precomputed structure the reducer needs."""

    document: dict[str, Any]
    canonical: str  # the document as stored: canonical JSON, what ``hash`` is computed from
    hash: str
    source: str
    base_dir: Path | None
    nodes: dict[str, CompiledNode]
    edges: dict[str, CompiledEdge]
    outgoing: dict[str, tuple[str, ...]] = field(default_factory=dict)
    incoming: dict[str, tuple[str, ...]] = field(default_factory=dict)  # non-loop edges only
    gates: dict[str, str] = field(default_factory=dict)
    reset_sets: dict[str, tuple[str, ...]] = field(default_factory=dict)  # loop edge -> nodes
    for_each_into: dict[str, str] = field(default_factory=dict)  # node -> its forEach edge
    max_concurrency: int = 8  # node runs in flight at once

    @property
    def name(self) -> str:
        return str(self.document["name"])

    @property
    def initial_state(self) -> dict[str, Any]:
        state = self.document.get("state") or {}
        return dict(state.get("initial") or {})

    @property
    def max_concurrent_runs(self) -> int | None:
        """``maxConcurrentRuns``: how many runs of this flow the workers execute at once (None: no bound)."""
        value = self.document.get("maxConcurrentRuns")
        return value if isinstance(value, int) else None

    @property
    def inputs_schema(self) -> dict[str, Any] | None:
        schema = self.document.get("inputs")
        return schema if isinstance(schema, dict) else None


def load_flow(path: str | Path, node_types: Container[str]) -> CompiledFlow:
    """Read, validate and compile a flow file; raises FlowFileError or FlowValidationError.

    ``node_types``: the node types runs may use (``Registry.node_types``); a type not in it is an error.
    """
    p = Path(path)
    document, _ = read_flow_document(p)
    return compile_flow(document, source=str(p), base_dir=p.resolve().parent, node_types=node_types)


def compile_flow(
    document: Any,
    node_types: Container[str],
    source: str = "<flow>",
    base_dir: Path | None = None,
    *,
    trusted: bool = False,
) -> CompiledFlow:
    """Validate ``document`` and compile it; ``node_types`` are the types it may use (a registry's
    ``node_types``, whose entries may also ``check`` their node's input).

    ``trusted``: the document was validated before (a stored, content-addressed flow), so the
    cross-node checks are skipped; resuming a run then does not pay for them (nor import networkx).
    """
    problems: list[Problem] = []
    if not trusted:
        from flowkernel.flow import parse_flow  # pydantic: only where a user's file is checked

        try:
            parse_flow(document, source)
        except FlowValidationError as exc:
            problems.extend(exc.problems)
        if isinstance(document, dict):
            _check_structure(document, node_types, problems)
        if problems:
            raise FlowValidationError(source, _dedupe(problems))
    compiled = _compile(document, source, base_dir, problems)
    if problems:
        raise FlowValidationError(source, _dedupe(problems))
    return compiled


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.path, p.message) not in seen:
            seen.add((p.path, p.message))
            out.append(p)
    return out


def _dicts(value: Any) -> list[tuple[int, dict[str, Any]]]:
    return [(i, v) for i, v in enumerate(value) if isinstance(v, dict)] if isinstance(value, list) else []


def _check_structure(doc: dict[str, Any], node_types: Container[str], problems: list[Problem]) -> None:
    """Checks across nodes and edges, on the raw document so they run even when the shape is off."""
    node_ids: dict[str, int] = {}
    for i, node in _dicts(doc.get("nodes")):
        nid = node.get("id")
        if not isinstance(nid, str):
            continue
        path = f"$.nodes[{i}].id"
        if nid in RESERVED_IDS or nid.startswith("$"):
            problems.append(Problem(path, f"{nid!r} is reserved; choose another node id"))
        if nid in node_ids:
            problems.append(Problem(path, f"duplicate node id {nid!r} (first at $.nodes[{node_ids[nid]}])"))
        else:
            node_ids[nid] = i
        if isinstance(node.get("input"), dict):
            compile_template(node["input"], f"$.nodes[{i}].input", problems)
        if node.get("when") is not None:
            compile_when(node["when"], f"$.nodes[{i}].when", problems)
        ntype = node.get("type")
        checker = getattr(node_types.get(ntype), "check", None) if isinstance(node_types, dict) else None
        if checker is not None and isinstance(node.get("input", {}), dict):
            checker(node.get("input", {}), f"$.nodes[{i}].input", problems)
        if isinstance(ntype, str) and ntype not in node_types:
            known = ", ".join(sorted(node_types)) if isinstance(node_types, (set, frozenset, dict)) else ""
            hint = f"; known types: {known}" if known else ""
            problems.append(Problem(f"$.nodes[{i}].type", f"unknown node type {ntype!r}{hint}"))

    import networkx as nx  # only validation needs it; resuming a stored run should not pay the import

    edge_ids: dict[str, int] = {}
    gates: dict[str, tuple[str, int]] = {}
    for_each: dict[str, int] = {}
    graph: Any = nx.DiGraph()
    graph.add_nodes_from(node_ids)
    for i, edge in _dicts(doc.get("edges")):
        src, dst = edge.get("from"), edge.get("to")
        for key, ref in (("from", src), ("to", dst)):
            if isinstance(ref, str) and ref not in node_ids:
                problems.append(Problem(f"$.edges[{i}].{key}", f"no node with id {ref!r}"))
        eid = edge.get("id") if edge.get("id") is not None else f"{src}->{dst}"
        if isinstance(eid, str):
            if eid in edge_ids:
                problems.append(Problem(f"$.edges[{i}]" + (".id" if edge.get("id") is not None else ""),
                                        f"duplicate edge id {eid!r} (first at $.edges[{edge_ids[eid]}]); "
                                        "give one of them an explicit id"))
            else:
                edge_ids[eid] = i
        if edge.get("when") is not None:
            compile_when(edge["when"], f"$.edges[{i}].when", problems)
        fe = edge.get("forEach")
        if isinstance(fe, dict) and isinstance(fe.get("in"), str):
            compile_expr(strip_braces(fe["in"]), f"$.edges[{i}].forEach.in", problems)
        gate = edge.get("gate")
        if isinstance(dst, str) and gate in ("all", "any"):
            if dst in gates and gates[dst][0] != gate:
                problems.append(Problem(f"$.edges[{i}].gate",
                                        f"gate {gate!r} into {dst!r} conflicts with {gates[dst][0]!r} "
                                        f"at $.edges[{gates[dst][1]}].gate; a gate belongs to the target"))
            else:
                gates.setdefault(dst, (gate, i))
        if isinstance(dst, str) and edge.get("forEach") is not None:
            if dst in for_each:
                problems.append(Problem(f"$.edges[{i}].forEach",
                                        f"{dst!r} already has a forEach edge at $.edges[{for_each[dst]}]"))
            for_each.setdefault(dst, i)
            if edge.get("maxIterations") is not None:
                problems.append(Problem(f"$.edges[{i}]", "a loop edge cannot also be a forEach edge"))
        if (isinstance(src, str) and isinstance(dst, str) and src in node_ids and dst in node_ids
                and edge.get("maxIterations") is None):
            graph.add_edge(src, dst)
    for component in nx.strongly_connected_components(graph):
        members = sorted(component, key=lambda n: node_ids[n])
        if len(members) > 1 or graph.has_edge(members[0], members[0]):
            cycle = " -> ".join([*members, members[0]])
            problems.append(Problem("$.edges", f"cycle {cycle} does not pass through a loop edge; "
                                               "give one of its edges maxIterations"))


def _policy(raw: Any) -> PolicySpec:
    raw = raw if isinstance(raw, dict) else {}
    retry = raw.get("retry")
    return PolicySpec(
        retry=RetrySpec(int(retry.get("maxAttempts", 1)), int(retry.get("backoffMs", 0)))
        if isinstance(retry, dict) else None,
        timeoutMs=raw.get("timeoutMs"), continueOnError=bool(raw.get("continueOnError", False)))


def _compile(document: dict[str, Any], source: str, base_dir: Path | None,
             problems: list[Problem]) -> CompiledFlow:
    """Build the graph from a document whose shape is valid (checked now, or when it was stored)."""
    nodes: dict[str, CompiledNode] = {}
    for i, node in enumerate(document["nodes"]):
        path = f"$.nodes[{i}]"
        raw_input = node.get("input") or {}
        nodes[node["id"]] = CompiledNode(
            id=node["id"], index=i, type=node["type"],
            input=compile_template(raw_input, f"{path}.input", problems),
            raw_input=raw_input,
            when=compile_when(node.get("when"), f"{path}.when", problems),
            policy=_policy(node.get("policy")),
        )
    edges: dict[str, CompiledEdge] = {}
    gates: dict[str, str] = {}
    for i, edge in enumerate(document.get("edges") or []):
        path = f"$.edges[{i}]"
        edge_id = edge.get("id") or f"{edge['from']}->{edge['to']}"
        for_each = edge.get("forEach")
        fe = compile_expr(strip_braces(for_each["in"]), f"{path}.forEach.in", problems) if for_each else None
        edges[edge_id] = CompiledEdge(
            id=edge_id, index=i, source=edge["from"], target=edge["to"],
            when=compile_when(edge.get("when"), f"{path}.when", problems),
            is_loop=edge.get("maxIterations") is not None, max_iterations=edge.get("maxIterations"),
            for_each=fe, for_each_as=for_each.get("as", "item") if for_each else "item",
        )
        if edge.get("gate") is not None:
            gates[edge["to"]] = edge["gate"]
    canonical = canonical_json(document)
    compiled = CompiledFlow(document=document, canonical=canonical, hash=flow_hash(canonical), source=source,
                            base_dir=base_dir, nodes=nodes, edges=edges,
                            max_concurrency=int(document.get("maxConcurrency", 8)))
    out: dict[str, list[str]] = {n: [] for n in nodes}
    inc: dict[str, list[str]] = {n: [] for n in nodes}
    forward: dict[str, set[str]] = {n: set() for n in nodes}
    for e in edges.values():
        out[e.source].append(e.id)
        if not e.is_loop:
            inc[e.target].append(e.id)
            forward[e.source].add(e.target)
        if e.for_each is not None:
            compiled.for_each_into[e.target] = e.id
    compiled.outgoing = {n: tuple(v) for n, v in out.items()}
    compiled.incoming = {n: tuple(v) for n, v in inc.items()}
    compiled.gates = {n: gates.get(n, "all") for n in nodes}
    for e in edges.values():
        if e.is_loop:
            reach = _reachable(forward, e.target)
            compiled.reset_sets[e.id] = tuple(sorted(reach, key=lambda n: nodes[n].index))
    return compiled


def _reachable(forward: dict[str, set[str]], start: str) -> set[str]:
    """``start`` and every node reachable from it along non-loop edges."""
    seen = {start}
    todo = [start]
    while todo:
        for nxt in forward[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
