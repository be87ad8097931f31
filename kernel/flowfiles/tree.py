"""A flow file and the child flows it calls: the ``flow.call`` nodes whose ``flow`` is a path written in the
file (not a binding) name files known before the run, so what a run would fail on in them is found
before anything runs.

``check_tree`` reports the problems (and the warnings) of every child flow, and of theirs, at the JSON
path of the calling node's ``input.flow``, naming the child file and the child's own JSON path. Each
file is visited once: flows that call each other (a recursion ended by a ``when``) are not a problem
here. A child is read as ``flow.call`` reads it (inside the folders allowed, a regular file, no
larger than the limit).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowkernel.errors import FlowkernelError, Problem
from flowkernel.flowfiles.localfiles import resolve_inside

if TYPE_CHECKING:
    from flowkernel.core.services import RunServices
from flowkernel.flowfiles.read import read_flow_document

FLOW_CALL = "flow.call"

# What a visit of one child file gives: its document, its own problems and its warnings. It raises
# FlowkernelError when the file cannot be read as a flow at all.
Visit = Callable[[Path, str], tuple[Any, list[Problem], list[Problem]]]


def constant_children(document: Any) -> Iterator[tuple[str, str]]:
    """``(JSON path of input.flow, the path as written)`` of each ``flow.call`` node whose child flow is
    a constant path. Reads any document, valid or not."""
    nodes = document.get("nodes") if isinstance(document, dict) else None
    for i, node in enumerate(nodes if isinstance(nodes, list) else ()):
        if not isinstance(node, dict) or node.get("type") != FLOW_CALL:
            continue
        raw_input = node.get("input")
        target = raw_input.get("flow") if isinstance(raw_input, dict) else None
        if isinstance(target, str) and target and "{{" not in target:
            yield f"$.nodes[{i}].input.flow", target


def check_tree(document: Any, source: str, base: Path, visit: Visit) -> tuple[list[Problem], list[Problem]]:
    """The problems and warnings of the child flows ``document`` (read from ``source``, in folder
    ``base``) calls by constant paths, and of theirs, depth first; see the module."""
    problems: list[Problem] = []
    warnings: list[Problem] = []
    seen = {Path(source).resolve()}
    # One level each: the children still to visit, the file as shown, its folder, the JSON path in
    # the root flow of the node that leads here, and what a problem found here is prefixed with.
    stack: list[tuple[Iterator[tuple[str, str]], str, Path, str | None, str]] = [
        (constant_children(document), source, base, None, "")]
    while stack:
        children, shown, folder, root_path, prefix = stack[-1]
        step = next(children, None)
        if step is None:
            stack.pop()
            continue
        path, target = step
        at = root_path or path
        lead = f"{prefix}{path}: " if root_path else ""
        child_shown = shown_path(shown, target)
        try:
            file = resolve_inside(folder, target, FLOW_CALL)
        except FlowkernelError as exc:
            problems.append(Problem(at, f"{lead}{_one_line(exc)}"))
            continue
        if file in seen:
            continue
        seen.add(file)
        within = f"{lead}child flow {child_shown}: "
        try:
            child, own, noted = visit(file, child_shown)
        except FlowkernelError as exc:  # not a flow at all: no such file, not JSON, …
            said = _one_line(exc).removeprefix(f"{file}:")  # the file is named already
            # `child flow c.json:3:7: not valid JSON …`, or `child flow c.json: no such flow file`
            message = f"{within.rstrip()}{said}" if said[:1].isdigit() else f"{within}{said.lstrip()}"
            problems.append(Problem(at, message))
            continue
        problems.extend(Problem(at, f"{within}{p}") for p in own)
        warnings.extend(Problem(at, f"{within}{w}") for w in noted)
        stack.append((constant_children(child), child_shown, file.parent, at, within))
    return problems, warnings


def tree_documents(document: Any, source: str, base: Path | None) -> Iterator[tuple[str, Any]]:
    """``(file, document)`` of the flow (``source``, in folder ``base``) and of each child flow it calls by
    a constant path, and theirs, each file once, unvalidated. A child that cannot be read is left out:
    validation, or the node when it runs, says why."""
    yield source, document
    if base is None:
        return
    seen = {Path(source).resolve()}
    todo = [(document, source, base)]
    while todo:
        doc, shown, folder = todo.pop()
        for _, target in constant_children(doc):
            try:
                file = resolve_inside(folder, target, FLOW_CALL)
                if file in seen:
                    continue
                seen.add(file)
                child, _ = read_flow_document(file)
            except FlowkernelError:
                continue
            child_shown = shown_path(shown, target)
            yield child_shown, child
            todo.append((child, child_shown, file.parent))


def shown_path(parent: str, target: str) -> str:
    """A child flow's file as the user reads it: ``target`` (relative to the calling flow's file
    ``parent``) joined to the folder ``parent`` is shown in."""
    return target if os.path.isabs(target) else os.path.normpath(os.path.join(os.path.dirname(parent), target))


def node_warnings(document: Any, node_types: Mapping[str, Any]) -> list[Problem]:
    """What the node types advise about their nodes' inputs without refusing the flow (a model the
    installed SDK deprecates): each node type's optional ``advise(raw_input, path, notes)``."""
    notes: list[Problem] = []
    nodes = document.get("nodes") if isinstance(document, dict) else None
    for i, node in enumerate(nodes if isinstance(nodes, list) else ()):
        ntype = node.get("type") if isinstance(node, dict) else None
        raw_input = node.get("input", {}) if isinstance(node, dict) else None
        if not isinstance(ntype, str) or not isinstance(raw_input, dict) or ntype not in node_types:
            continue
        advise = getattr(node_types[ntype], "advise", None)
        if advise is None:
            continue
        try:
            advise(raw_input, f"$.nodes[{i}].input", notes)
        except Exception:  # advice is a courtesy: a node type's bug in it never stops validation
            continue
    return notes


def _one_line(exc: FlowkernelError) -> str:
    """An error as the message of one problem line."""
    return " ".join(str(exc).split("\n"))


def first_unavailable(document: Any, source: str, base: Path | None, node_types: Mapping[str, Any],
                      services: RunServices) -> str | None:
    """Why a node of the flow, or of a child flow it calls by a constant path, cannot run in a process
    with ``services`` (a node type's optional ``unavailable(who, services)``: an agent without
    credentials for the API it calls), or None. Each node type is asked once."""
    asked: set[str] = set()
    for file, doc in tree_documents(document, source, base):
        nodes = doc.get("nodes") if isinstance(doc, dict) else None
        for node in nodes if isinstance(nodes, list) else ():
            ntype = node.get("type") if isinstance(node, dict) else None
            if not isinstance(ntype, str) or ntype in asked or ntype not in node_types:
                continue
            asked.add(ntype)
            check = getattr(node_types[ntype], "unavailable", None)
            if check is None:
                continue
            who = f"node {node.get('id')!r}" + ("" if file == source else f" of child flow {file}")
            reason: str | None = check(who, services)
            if reason is not None:
                return reason
    return None
