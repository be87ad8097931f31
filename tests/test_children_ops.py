"""``flow.call``'s child runs (``flowkernel.run.children``) reach the Kernel only through ``_KernelOps``:
the narrow Protocol of exactly the operations they use. A use beyond it, a declared operation nobody
uses, the whole Kernel typed in, or the Kernel handed on to someone else is reported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "kernel" / "run" / "children.py"


def _is_held_kernel(node: ast.AST) -> bool:
    """``self._kernel``."""
    return (isinstance(node, ast.Attribute) and node.attr == "_kernel" and isinstance(node.value, ast.Name)
            and node.value.id == "self")


def kernel_reach(source: str) -> list[str]:
    """What ``KernelChildren`` does with the Kernel beyond ``_KernelOps``, one line each (none: nothing)."""
    tree = ast.parse(source)
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    declared = {f.name for f in classes["_KernelOps"].body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    children = classes["KernelChildren"]
    problems: list[str] = []
    init = next(f for f in children.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    arg = next(a for a in init.args.args + init.args.kwonlyargs if a.arg == "kernel")
    if arg.annotation is None or ast.unparse(arg.annotation) != "_KernelOps":
        problems.append(f"kernel is typed {ast.unparse(arg.annotation) if arg.annotation else 'nothing'}, "
                        f"not _KernelOps")
    used: set[str] = set()
    for method in children.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        aliases = {t.id for node in ast.walk(method) if isinstance(node, ast.Assign) and _is_held_kernel(node.value)
                   for t in node.targets if isinstance(t, ast.Name)}
        reached: set[int] = set()  # ids of the nodes that are the held Kernel with an operation called on it
        for node in ast.walk(method):
            if isinstance(node, ast.Attribute) and (
                    _is_held_kernel(node.value) or (isinstance(node.value, ast.Name) and node.value.id in aliases)):
                used.add(node.attr)
                reached.add(id(node.value))
        for node in ast.walk(method):
            if isinstance(node, ast.Assign) and _is_held_kernel(node.value):
                reached.add(id(node.value))
            elif isinstance(node, ast.Name) and node.id in aliases and isinstance(node.ctx, ast.Store):
                reached.add(id(node))
        for node in ast.walk(method):
            held = _is_held_kernel(node) and isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
            alias = isinstance(node, ast.Name) and node.id in aliases
            if (held or alias) and id(node) not in reached:
                problems.append(f"line {getattr(node, 'lineno', 0)}: the Kernel is handed on whole")
    problems += [f"uses kernel.{name}, which _KernelOps does not declare" for name in sorted(used - declared)]
    problems += [f"_KernelOps declares {name}, which nothing uses" for name in sorted(declared - used)]
    return problems


def test_child_runs_reach_the_kernel_only_through_exactly_the_operations_they_declare() -> None:
    assert kernel_reach(SOURCE.read_text()) == []


@pytest.mark.parametrize(("edit", "reported"), [
    (("return self._kernel.snapshot(child_id)", "return self._kernel.stored_snapshot(child_id)"),
     ["uses kernel.stored_snapshot, which _KernelOps does not declare"]),
    (("self._kernel = kernel\n", "self._kernel = kernel\n        self._kernel.close()\n"),
     ["uses kernel.close, which _KernelOps does not declare"]),
    (("kernel: _KernelOps,", "kernel: Kernel,"), ["kernel is typed Kernel, not _KernelOps"]),
    (("return self._kernel.snapshot(child_id)", "return helper(self._kernel).snapshot(child_id)"),
     ["line {line}: the Kernel is handed on whole"]),
])
def test_a_child_run_reaching_beyond_its_operations_is_reported(edit: tuple[str, str], reported: list[str]) -> None:
    source = SOURCE.read_text()
    assert edit[0] in source
    line = source[:source.index(edit[0])].count("\n") + 1
    assert kernel_reach(source.replace(edit[0], edit[1], 1)) == [r.format(line=line) for r in reported]
