"""Validate a flow document and compile it into the graph the scheduler walks.

Every problem is collected (``flowkernel.core.validation``: shape, ids, types, edges, gates, cycles,
expressions and the names they read, node inputs) and reported at once, each with its JSON path,
before anything runs.
"""

from __future__ import annotations

from collections.abc import Collection, Container
from pathlib import Path
from typing import Any

import msgspec
from flowkernel.core.canonical import canonical_json, flow_hash
from flowkernel.core.expressions import (
    ALWAYS,
    Condition,
    Expr,
    Template,
    compile_expr,
    compile_template,
    compile_when,
    lazy_node_input,
    strip_braces,
)
from flowkernel.errors import FlowValidationError, Problem


# A flow of 10,000 nodes compiles 20,000 of these when a run of it resumes: msgspec structs are built
# several times faster than frozen dataclasses, and, holding nothing that refers back to them, need no
# tracking by the cycle collector (whose passes over a process's whole heap a burst of tracked
# allocations would set off).
class RetrySpec(msgspec.Struct, frozen=True, gc=False):
    maxAttempts: int = 1
    backoffMs: int = 0


class PolicySpec(msgspec.Struct, frozen=True, gc=False):
    """A node's ``policy``, with the defaults of the flow file format."""

    retry: RetrySpec | None = None
    timeoutMs: int | None = None
    continueOnError: bool = False
    maxCostUsd: float | None = None  # the node's budget in this run (DESIGN §12)


class CompiledEdge(msgspec.Struct, frozen=True, gc=False):
    id: str
    index: int
    source: str
    target: str
    when: Condition
    is_loop: bool
    max_iterations: int | None
    for_each: Expr | None
    for_each_as: str


class CompiledNode(msgspec.Struct, frozen=True, gc=False):
    id: str
    index: int
    type: str
    input: Template
    raw_input: dict[str, Any]
    when: Condition
    policy: PolicySpec


class CompiledFlow(msgspec.Struct):
    """A validated flow: nodes, edges and the precomputed structure the reducer needs."""

    document: dict[str, Any]
    canonical: str  # the document as stored: canonical JSON, what ``hash`` is computed from
    hash: str
    source: str
    base_dir: Path | None
    nodes: dict[str, CompiledNode]
    edges: dict[str, CompiledEdge]
    outgoing: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    incoming: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)  # non-loop edges only
    gates: dict[str, str] = msgspec.field(default_factory=dict)
    reset_sets: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)  # loop edge -> nodes
    for_each_into: dict[str, str] = msgspec.field(default_factory=dict)  # node -> its forEach edge
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
    def max_cost_usd(self) -> float | None:
        """``budget.maxCostUsd``: what the run may spend, child runs included, before it pauses (None: no limit)."""
        budget = self.document.get("budget")
        return _usd(budget.get("maxCostUsd")) if isinstance(budget, dict) else None

    @property
    def inputs_schema(self) -> dict[str, Any] | None:
        schema = self.document.get("inputs")
        return schema if isinstance(schema, dict) else None


def compile_flow(
    document: Any,
    node_types: Container[str],
    source: str = "<flow>",
    base_dir: Path | None = None,
    *,
    trusted: bool = False,
    functions: Collection[str] | None = None,
    tools: Collection[str] | None = None,
    stored: tuple[str, str] | None = None,
) -> CompiledFlow:
    """Validate ``document`` and compile it; ``node_types`` are the types it may use (a registry's
    ``node_types``, whose entries may also ``check`` their node's input); ``functions`` and ``tools``,
    when given, the registered names nodes may use.

    ``trusted``: the document was validated before (a stored, content-addressed flow), so the checks
    are skipped; resuming a run then does not pay for them (nor import pydantic or networkx), and node
    inputs are compiled when a node first starts, not all up front. ``stored``: the document's
    canonical text and hash, known already (what the store keeps, or what the validation cache keyed).
    """
    if not trusted:
        from flowkernel.core.names import KnownNames
        from flowkernel.core.validation import check_document

        known = KnownNames(functions, tools) if functions is not None and tools is not None else None
        check_document(document, node_types, source, known)
    problems: list[Problem] = []
    compiled = _compile(document, source, base_dir, problems, lazy=trusted, stored=stored)
    if problems:
        raise FlowValidationError(source, problems)
    return compiled


_NO_POLICY = PolicySpec()


def _policy(raw: Any) -> PolicySpec:
    if not raw:
        return _NO_POLICY
    raw = raw if isinstance(raw, dict) else {}
    retry = raw.get("retry")
    return PolicySpec(
        retry=RetrySpec(int(retry.get("maxAttempts", 1)), int(retry.get("backoffMs", 0)))
        if isinstance(retry, dict) else None,
        timeoutMs=raw.get("timeoutMs"), continueOnError=bool(raw.get("continueOnError", False)),
        maxCostUsd=_usd(raw.get("maxCostUsd")))


def _usd(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _compile(document: dict[str, Any], source: str, base_dir: Path | None, problems: list[Problem], *,
             lazy: bool = False, stored: tuple[str, str] | None = None) -> CompiledFlow:
    """Build the graph from a document whose shape is valid (checked now, or when it was stored);
    ``lazy``: node inputs are compiled when first used (a valid document compiles without problems)."""
    # (A stored flow of 10,000 nodes compiles when a run of it resumes: what is absent costs nothing.)
    # Nodes of only an id, a type and an input, and edges of only their ends, the most common by far,
    # skip looking up the keys they do not have; structs are built from positional arguments.
    nodes: dict[str, CompiledNode] = {}
    for i, node in enumerate(document["nodes"]):
        raw_input = node.get("input") or {}
        node_id = node["id"]
        plain = len(node) == 3 and "input" in node
        when, policy = (None, None) if plain else (node.get("when"), node.get("policy"))
        nodes[node_id] = CompiledNode(
            node_id, i, node["type"],
            lazy_node_input(raw_input, i) if lazy else compile_template(raw_input, f"$.nodes[{i}].input", problems),
            raw_input,
            ALWAYS if when is None else compile_when(when, f"$.nodes[{i}].when", problems),
            _policy(policy) if policy else _NO_POLICY,
        )
    edges: dict[str, CompiledEdge] = {}
    gates: dict[str, str] = {}
    for i, edge in enumerate(document.get("edges") or []):
        if len(edge) == 2:  # "from" and "to" (a shape already checked)
            tail, head = edge["from"], edge["to"]
            edge_id = f"{tail}->{head}"
            edges[edge_id] = CompiledEdge(edge_id, i, tail, head, ALWAYS, False, None, None, "item")
            continue
        edge_id = edge.get("id") or f"{edge['from']}->{edge['to']}"
        when, for_each, bound = edge.get("when"), edge.get("forEach"), edge.get("maxIterations")
        fe = compile_expr(strip_braces(for_each["in"]), f"$.edges[{i}].forEach.in", problems) if for_each else None
        edges[edge_id] = CompiledEdge(
            id=edge_id, index=i, source=edge["from"], target=edge["to"],
            when=ALWAYS if when is None else compile_when(when, f"$.edges[{i}].when", problems),
            is_loop=bound is not None, max_iterations=bound,
            for_each=fe, for_each_as=for_each.get("as", "item") if for_each else "item",
        )
        if edge.get("gate") is not None:
            gates[edge["to"]] = edge["gate"]
    if stored is not None:
        canonical, digest = stored
    else:
        canonical = canonical_json(document)
        digest = flow_hash(canonical)
    compiled = CompiledFlow(document=document, canonical=canonical, hash=digest, source=source,
                            base_dir=base_dir, nodes=nodes, edges=edges,
                            max_concurrency=int(document.get("maxConcurrency", 8)))
    out: dict[str, list[str]] = {n: [] for n in nodes}
    inc: dict[str, list[str]] = {n: [] for n in nodes}
    loops = False
    for e in edges.values():
        out[e.source].append(e.id)
        if e.is_loop:
            loops = True
        else:
            inc[e.target].append(e.id)
        if e.for_each is not None:
            compiled.for_each_into[e.target] = e.id
    compiled.outgoing = {n: tuple(v) for n, v in out.items()}
    compiled.incoming = {n: tuple(v) for n, v in inc.items()}
    compiled.gates = {n: gates.get(n, "all") for n in nodes}
    if loops:  # what each loop edge resets: the nodes reachable from its target along non-loop edges
        forward: dict[str, set[str]] = {n: set() for n in nodes}
        for e in edges.values():
            if not e.is_loop:
                forward[e.source].add(e.target)
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
