"""What a JSONata expression reads from the binding context, found at load time from its syntax tree.

A binding is evaluated over ``{flow: {input}, state, <nodeId>: output}``. A path's first step is a
name looked up in that context, so a misspelt node id (``{{ jion }}``) silently yields nothing: the
compiler checks every such name. Only steps evaluated against the context itself count — the first
step of a path at the top level, in function arguments, operands, blocks and lambda bodies (a
lambda sees the context it was defined in), and the step after ``$$`` anywhere. Steps after the
first, predicates (``a[b = 1]``), group-by and sort terms, and ``(…)`` inside a path are relative to
the value on their left and are not names of the context.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jsonata

# The builtin functions: ``{{ $sum }}`` is the function itself, not a value.
BUILTIN_FUNCTIONS = frozenset(jsonata.Jsonata.static_frame.bindings)


class Reference(NamedTuple):
    """A name read from the binding context, and the name read from it next (``flow.input``)."""

    name: str
    then: str | None


def references(ast: Any) -> list[Reference]:
    """The names ``ast`` (a parsed expression, ``Expr.ast``) reads from the binding context."""
    found: list[Reference] = []
    _walk(ast, True, found)
    return found


def _walk(node: Any, at_root: bool, found: list[Reference]) -> None:
    if node is None:
        return
    kind = node.type
    if kind == "path":
        _walk_path(node, at_root, found)
        return
    if kind == "name":  # only inside paths after parsing, but harmless to handle
        if at_root:
            found.append(Reference(str(node.value), None))
        return
    if kind == "transform":  # |pattern|update, delete|: evaluated against the value it is applied to
        for part in (node.pattern, node.update, node.delete):
            _walk(part, False, found)
        return
    for part in (node.lhs, node.rhs, node.expression, node.condition, node.then, node._else, node.body,
                 node.procedure):
        if hasattr(part, "type"):
            _walk(part, at_root, found)
    for part in (node.arguments or ()) if kind != "lambda" else ():
        _walk(part, at_root, found)
    for part in node.expressions or ():
        _walk(part, at_root, found)
    for pair in node.lhs_object or ():
        for part in pair:
            _walk(part, at_root, found)
    _walk_relative(node, found)


def _walk_path(path: Any, at_root: bool, found: list[Reference]) -> None:
    steps = path.steps or []
    here = at_root  # whether the next step is evaluated against the binding context itself
    for i, step in enumerate(steps):
        kind = step.type
        if kind == "name":
            if here:
                after = steps[i + 1] if i + 1 < len(steps) else None
                found.append(Reference(str(step.value), str(after.value) if after is not None
                                       and after.type == "name" else None))
            here = False
        elif kind == "variable":
            if step.value == "$":  # $$: the binding context, wherever it appears
                here = True
            elif step.value != "":  # $ is the current value: `$.a` at the top is a name of the context
                here = False
        elif kind == "sort":
            for term in step.terms or ():
                _walk(term.expression, False, found)
            here = False
        elif kind in ("wildcard", "descendant", "parent"):
            here = False
        else:  # a block, a function call, an array or object constructor: evaluated where it stands
            _walk(step, here, found)
            here = False
        _walk_relative(step, found)
    _walk_group(path, found)


def _walk_relative(node: Any, found: list[Reference]) -> None:
    """Predicates and group-by of ``node``: evaluated against each of its values, not the context."""
    for stage in [*(node.predicate or ()), *(node.stages or ())]:
        if stage.type == "filter":
            _walk(stage.expr, False, found)
    _walk_group(node, found)


def _walk_group(node: Any, found: list[Reference]) -> None:
    if node.group is not None:
        for pair in node.group.lhs_object or ():
            for part in pair:
                _walk(part, False, found)


def yields_function(ast: Any) -> bool:
    """Whether ``ast`` evaluates to a function (``$sum``, ``function($x){…}``, ``$f(?, 1)``), or to
    a list or object holding one: no JSON value, so never what a binding, ``when`` or ``forEach``
    means."""
    return _is_function(ast, _bound_variables(ast))


def _is_function(node: Any, bound: set[str]) -> bool:
    if node is None:
        return False
    kind = node.type
    if kind in ("lambda", "partial", "transform"):
        return True
    if kind == "variable":
        return node.value in BUILTIN_FUNCTIONS and node.value not in bound
    if kind == "block":
        return bool(node.expressions) and _is_function(node.expressions[-1], bound)
    if kind == "bind":
        return _is_function(node.rhs, bound)
    if kind == "condition":
        return _is_function(node.then, bound) or _is_function(node._else, bound)
    if kind == "unary" and node.value == "[":
        return any(_is_function(e, bound) for e in node.expressions or ())
    if kind == "unary" and node.value == "{":
        return any(_is_function(pair[1], bound) for pair in node.lhs_object or ())
    return False


def _bound_variables(ast: Any) -> set[str]:
    """Names given a value in the expression (``$x := …``, lambda parameters): not the builtins."""
    bound: set[str] = set()
    todo = [ast]
    while todo:
        node = todo.pop()
        if node is None or not hasattr(node, "type"):
            continue
        if node.type == "bind" and node.lhs is not None:
            bound.add(str(node.lhs.value))
        if node.type == "lambda":
            bound.update(str(a.value) for a in node.arguments or ())
        for attr in ("lhs", "rhs", "expression", "condition", "then", "_else", "body", "procedure",
                     "pattern", "update", "delete", "expr", "group"):
            todo.append(getattr(node, attr, None))
        for attr in ("steps", "arguments", "expressions", "predicate", "stages", "terms"):
            todo.extend(getattr(node, attr, None) or ())
        for pair in node.lhs_object or ():
            todo.extend(pair)
    return bound
