"""Everything ``validate`` checks in a flow document, before anything runs; each problem names its JSON
path. Stored flows were validated when they were stored: resuming a run never comes here (nor imports
pydantic, networkx or jsonschema).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Container
from typing import Any

from flowkernel.core.expressions import (
    Expr,
    ExprCheck,
    compile_expr,
    compile_template,
    compile_when,
    quoted,
    strip_braces,
)
from flowkernel.core.names import KnownNames
from flowkernel.core.nesting import MAX_DEPTH
from flowkernel.core.references import references, yields_function
from flowkernel.errors import FlowValidationError, Problem

RESERVED_IDS = frozenset({"flow", "state"})
MAX_VALUE_PROBLEMS = 20


def check_document(document: Any, node_types: Container[str], source: str,
                   known: KnownNames | None = None) -> None:
    """Raise ``FlowValidationError`` listing every problem of ``document``; ``known`` (functions and
    tools by name) lets node types check the names their input gives."""
    problems = json_value_problems(document)
    if problems:  # not JSON: the checks below could recurse without end or fail to encode it
        raise FlowValidationError(source, problems)
    from flowkernel.core.flow import parse_flow  # pydantic: only where a user's file is checked

    try:
        parse_flow(document, source)
    except FlowValidationError as exc:
        problems.extend(exc.problems)
    if isinstance(document, dict):
        _check_schemas(document, problems)
        _check_structure(document, node_types, known, problems)
    if problems:
        raise FlowValidationError(source, _dedupe(problems))


def json_value_problems(value: Any, limit: int = MAX_DEPTH) -> list[Problem]:
    """Where ``value`` is not plain JSON that can be stored: nested deeper than ``limit``, a lone
    surrogate in a string or key (no UTF-8 encoding), a non-finite number, a non-string key."""
    problems: list[Problem] = []
    todo: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while todo and len(problems) < MAX_VALUE_PROBLEMS:
        item, path, depth = todo.pop()
        if isinstance(item, str):
            if not _encodable(item):
                problems.append(Problem(path, "contains a lone surrogate (such as \\ud800): not valid Unicode"))
        elif isinstance(item, dict):
            if depth >= limit:
                problems.append(Problem(path, f"nested more than {limit} levels deep"))
                continue
            children = []
            for key, child in item.items():
                if not isinstance(key, str):
                    problems.append(Problem(path, f"key {key!r} is not a string"))
                    continue
                if not _encodable(key):
                    problems.append(Problem(path, "a key contains a lone surrogate (such as \\ud800): "
                                                  "not valid Unicode"))
                    continue
                children.append((child, f"{path}.{key}", depth + 1))
            todo.extend(reversed(children))
        elif isinstance(item, list):
            if depth >= limit:
                problems.append(Problem(path, f"nested more than {limit} levels deep"))
                continue
            todo.extend(reversed([(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item)]))
        elif isinstance(item, float):
            if not math.isfinite(item):
                problems.append(Problem(path, f"{item} is not a JSON number"))
        elif item is not None and not isinstance(item, (bool, int)):
            problems.append(Problem(path, f"a {type(item).__name__} is not a JSON value"))
    return problems


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


def _check_schemas(doc: dict[str, Any], problems: list[Problem]) -> None:
    from flowkernel.core.jsonschemas import check_schema

    if doc.get("inputs") is not None:
        check_schema(doc["inputs"], "$.inputs", problems)
    state = doc.get("state")
    if isinstance(state, dict) and state.get("schema") is not None:
        check_schema(state["schema"], "$.state.schema", problems)


class _Scope:
    """The names a binding may read: node ids, ``flow``, ``state``, and (in a forEach target) the
    item's ``as`` name. ``check`` reports the others, and bindings that yield a function."""

    def __init__(self, node_ids: Collection[str], item_names: dict[str, str], problems: list[Problem]) -> None:
        self.node_ids = node_ids
        self.item_names = item_names  # forEach target -> its `as` name
        self.problems = problems

    def checker(self, target: str | None = None) -> ExprCheck:
        item_name = self.item_names.get(target) if target is not None else None

        def check(expr: Expr, path: str) -> None:
            self.check(expr, path, item_name)

        return check

    def check(self, expr: Expr, path: str, item_name: str | None) -> None:
        ast = expr.ast
        if yields_function(ast):
            self.problems.append(Problem(path, f"{quoted(expr.source)} is a function, not a value: call it "
                                               "(e.g. `$sum(items)`) or bind what it returns"))
        for ref in references(ast):
            name = ref.name
            if name in self.node_ids or name == "state" or name == item_name:
                continue
            if name == "flow":
                if ref.then not in (None, "input"):
                    self.problems.append(Problem(path, f"`flow.{ref.then}`{_in(expr.source, 'flow')}: `flow` "
                                                       "has only `input`; did you mean `flow.input`?"))
                continue
            self.problems.append(Problem(path, self._unknown(name, expr.source, item_name)))

    def _unknown(self, name: str, source: str, item_name: str | None) -> str:
        candidates = [*self.node_ids, "flow", "state", *([item_name] if item_name else [])]
        close = difflib.get_close_matches(name, candidates, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        owners = [t for t, n in self.item_names.items() if n == name]
        if owners:
            return (f"{name!r}{_in(source, name)} is the forEach item name of node {owners[0]!r}: it is bound "
                    "only in that node's input and when")
        nodes = ", ".join(list(self.node_ids)[:12]) + (", …" if len(self.node_ids) > 12 else "")
        return (f"unknown name {name!r}{_in(source, name)}: not a node id, `flow`, `state`"
                f"{' or the forEach item name ' + repr(item_name) if item_name else ''}{hint}"
                f" (nodes: {nodes or 'none'})")


def _in(source: str, name: str) -> str:
    return "" if source.strip() == name else f" in {quoted(source)}"


def _check_structure(doc: dict[str, Any], node_types: Container[str], known: KnownNames | None,
                     problems: list[Problem]) -> None:
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
    item_names: dict[str, str] = {}
    for _, edge in _dicts(doc.get("edges")):
        fe, dst = edge.get("forEach"), edge.get("to")
        if isinstance(fe, dict) and isinstance(dst, str) and dst not in item_names:
            as_name = fe.get("as", "item")
            item_names[dst] = as_name if isinstance(as_name, str) else "item"
    scope = _Scope(node_ids, item_names, problems)

    for i, node in _dicts(doc.get("nodes")):
        nid = node.get("id") if isinstance(node.get("id"), str) else None
        check = scope.checker(nid)
        raw_input = node.get("input", {})
        if isinstance(raw_input, dict):
            compile_template(raw_input, f"$.nodes[{i}].input", problems, check)
        if node.get("when") is not None:
            compile_when(node["when"], f"$.nodes[{i}].when", problems, check)
        ntype = node.get("type")
        if not isinstance(ntype, str):
            continue  # the shape check reports it
        if ntype not in node_types:
            names = sorted(node_types) if isinstance(node_types, (set, frozenset, dict)) else []
            close = difflib.get_close_matches(ntype, names, n=1)
            hint = (f"; did you mean {close[0]!r}?" if close else "") + (
                f" (known types: {', '.join(names)})" if names else "")
            problems.append(Problem(f"$.nodes[{i}].type", f"unknown node type {ntype!r}{hint}"))
            continue
        node_type = node_types.get(ntype) if isinstance(node_types, dict) else None
        if node_type is not None and isinstance(raw_input, dict):
            _check_node_input(node_type, ntype, raw_input, f"$.nodes[{i}].input", check, known, problems)

    import networkx as nx  # only validation needs it; resuming a stored run should not pay the import

    edge_ids: dict[str, int] = {}
    gates: dict[str, tuple[str, int]] = {}
    for_each: dict[str, int] = {}
    graph: Any = nx.DiGraph()
    graph.add_nodes_from(node_ids)
    edge_check = scope.checker()
    for i, edge in _dicts(doc.get("edges")):
        src, dst = edge.get("from"), edge.get("to")
        for key, ref in (("from", src), ("to", dst)):
            if isinstance(ref, str) and ref not in node_ids:
                close = difflib.get_close_matches(ref, list(node_ids), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                problems.append(Problem(f"$.edges[{i}].{key}", f"no node with id {ref!r}{hint}"))
        eid = edge.get("id") if edge.get("id") is not None else f"{src}->{dst}"
        if isinstance(eid, str) and isinstance(src, str) and isinstance(dst, str):
            if eid in edge_ids:
                problems.append(Problem(f"$.edges[{i}]" + (".id" if edge.get("id") is not None else ""),
                                        f"duplicate edge id {eid!r} (first at $.edges[{edge_ids[eid]}]); "
                                        "give one of them an explicit id"))
            else:
                edge_ids[eid] = i
        if edge.get("when") is not None:
            compile_when(edge["when"], f"$.edges[{i}].when", problems, edge_check)
        fe = edge.get("forEach")
        if isinstance(fe, dict) and isinstance(fe.get("in"), str):
            compile_expr(strip_braces(fe["in"]), f"$.edges[{i}].forEach.in", problems, edge_check)
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


def _check_node_input(node_type: Any, type_name: str, raw_input: dict[str, Any], path: str, check: ExprCheck,
                      known: KnownNames | None, problems: list[Problem]) -> None:
    """What the node type knows about its input: its schema, its expressions, its own checks."""
    for key in getattr(node_type, "expression_keys", ()):
        source = raw_input.get(key)
        if isinstance(source, str):
            compile_expr(strip_braces(source), f"{path}.{key}", problems, check)
    hooks: list[tuple[str, tuple[Any, ...]]] = [("check", (raw_input, path, problems))]
    if known is not None:
        hooks.append(("check_names", (raw_input, path, known, problems)))
    for name, args in hooks:
        hook = getattr(node_type, name, None)
        if hook is None:
            continue
        try:
            hook(*args)
        except Exception as exc:  # a node type's own bug must not hide the flow's problems
            problems.append(Problem(path, f"node type {type_name!r} failed to check its input: "
                                          f"{type(exc).__name__}: {exc}"))
    schema = getattr(node_type, "input_schema", None)
    if isinstance(schema, dict):
        from flowkernel.core.jsonschemas import input_problems

        # The node type's own checks say it better where they speak; the schema covers the rest.
        said = [p.path for p in problems if p.path == path or p.path.startswith((f"{path}.", f"{path}["))]
        problems.extend(p for p in input_problems(schema, raw_input, path)
                        if not any(_overlaps(p.path, q, path) for q in said))


def _overlaps(found: str, said: str, root: str) -> bool:
    """Whether a schema problem at ``found`` is about what a check already said at ``said``: the same
    place, or one inside the other (a problem with the whole input does not cover each of its keys)."""
    if found == said:
        return True
    inside = found.startswith((f"{said}.", f"{said}[")) and said != root
    return inside or said.startswith((f"{found}.", f"{found}["))
