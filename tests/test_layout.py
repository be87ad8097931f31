"""The package layout shows the architecture: no import circles, the core never imports the shell,
and product code never imports the test kit. Read from the sources (every import, also those inside
functions), so a lazy import cannot hide a dependency."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The pure core (core/): the flow model, the compiler, expressions (and their bounds), the reducer and the
# scheduling rules, events and the snapshot, and the node-type protocol. None of it may import the run
# shell, the stores, the CLI or anything that executes runs: only core/ and errors.
def _core() -> set[str]:
    return {m for m in _modules() if m == "flowkernel.core" or m.startswith("flowkernel.core.")} | {"flowkernel.errors"}


def _modules() -> dict[str, Path]:
    """Every module of the installed ``flowkernel`` package, by its import name (via ``package-dir``)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mapping = config["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for package in sorted(mapping, key=len):  # parents first: a mapped sub-package replaces their view of it
        folder = ROOT / mapping[package]
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _imports(path: Path, known: set[str]) -> set[str]:
    """The flowkernel modules ``path`` imports at run time (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {n for n in names if n in known}
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, known) - {name} for name, path in modules.items()}


def test_modules_of_the_package_do_not_import_each_other_in_a_circle() -> None:
    graph = _graph()
    # A module importing its own package's __init__ (``from flowkernel.cli import x``) is not a cycle.
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        for dep in sorted(graph.get(module, ())):
            if seen.get(dep) == 1:
                cycles.append([*path[path.index(dep):], dep])
            elif dep not in seen:
                visit(dep, [*path, dep])
        seen[module] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module, [module])
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_core_never_imports_the_shell() -> None:
    graph = _graph()
    core = _core()
    leaks = {m: sorted(graph[m] - core) for m in core if graph[m] - core}
    assert not leaks, f"core modules importing outside the core: {leaks}"


def test_product_code_never_imports_the_test_kit() -> None:
    graph = _graph()
    leaks = {m: sorted(d for d in deps if d.startswith("flowkernel.testing"))
             for m, deps in graph.items() if not m.startswith("flowkernel.testing")}
    assert not {m: d for m, d in leaks.items() if d}, f"product modules importing flowkernel.testing: {leaks}"


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert packages <= listed, f"add to [tool.setuptools] packages: {sorted(packages - listed)}"


def test_no_module_imports_another_modules_private_names() -> None:
    """What modules share is public where it is defined; a ``_name`` is its own module's business."""
    private = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("flowkernel"):
                private += [f"{name} imports {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert private == []


def test_each_default_is_defined_once() -> None:
    """A ``DEFAULT_…`` constant has one home that every face imports, so they cannot drift apart."""
    homes: dict[str, list[str]] = {}
    for name, path in _modules().items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                for leaf in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(leaf, ast.Name) and leaf.id.startswith("DEFAULT_"):
                        homes.setdefault(leaf.id, []).append(name)
    assert {k: v for k, v in homes.items() if len(v) > 1} == {}
    assert homes["DEFAULT_GRACE_S"] == ["flowkernel.workers.defaults"]


# Modules that stay at the package's root: leaves every folder may import (DESIGN §2).
ROOT_MODULES = {"flowkernel", "flowkernel.__main__", "flowkernel.errors", "flowkernel.ids", "flowkernel.redaction"}


def test_every_module_lives_in_a_folder() -> None:
    """The folders are the architecture: a module at the root is one nobody placed."""
    loose = sorted(name for name in _modules() if name.count(".") == 1 and name not in ROOT_MODULES
                   and not _is_package(name))
    assert loose == [], f"modules outside every folder: {loose}"


def _is_package(name: str) -> bool:
    return _modules()[name].name == "__init__.py"


def test_each_package_says_in_its_first_line_what_lives_there() -> None:
    silent = []
    for name, path in _modules().items():
        if path.name == "__init__.py":
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            if not doc or not doc.splitlines()[0].strip():
                silent.append(name)
    assert silent == [], f"packages without a docstring saying what they hold: {silent}"


# -- a thin Kernel, and a server that never starts an event loop of its own ---------------------------

KERNEL_MAX_LINES = 200


def kernel_fat(source: str) -> list[str]:
    """What makes the ``Kernel`` class in ``source`` more than a facade: a body of ``KERNEL_MAX_LINES``
    lines or more, or a method (``__init__`` aside) doing more than one thing (its docstring aside)."""
    [kernel] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Kernel"]
    found = []
    length = (kernel.end_lineno or kernel.lineno) - kernel.lineno + 1
    if length >= KERNEL_MAX_LINES:
        found.append(f"Kernel is {length} lines (fewer than {KERNEL_MAX_LINES})")
    for node in kernel.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name != "__init__":
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if len(body) > 1:
                found.append(f"Kernel.{node.name} does {len(body)} things: delegate it")
    return found


def loops_per_request(sources: dict[str, str]) -> list[str]:
    """Modules of ``flowkernel.server`` that start an event loop (``anyio.run``, ``asyncio.run``): a route
    awaits the Kernel on the server's own loop instead."""
    found = []
    for name, source in sorted(sources.items()):
        if name == "flowkernel.server" or name.startswith("flowkernel.server."):
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call) and ast.unparse(node.func) in ("anyio.run", "asyncio.run", "run"):
                    found.append(f"{name}:{node.lineno} calls {ast.unparse(node.func)}")
    return found


def _sources() -> dict[str, str]:
    return {name: path.read_text(encoding="utf-8") for name, path in _modules().items()}


def test_the_kernel_is_a_thin_facade() -> None:
    assert kernel_fat(_sources()["flowkernel.run.kernel"]) == []


def test_a_planted_fat_kernel_is_reported() -> None:
    method = "    def run(self) -> int:\n        x = 1\n        return x\n"
    assert kernel_fat(f"class Kernel:\n{method}") == ["Kernel.run does 2 things: delegate it"]
    long = "class Kernel:\n" + "".join(f"    def m{i}(self) -> int:\n        return {i}\n" for i in range(100))
    assert kernel_fat(long) == ["Kernel is 201 lines (fewer than 200)"]


def test_no_module_of_the_server_starts_an_event_loop() -> None:
    assert loops_per_request(_sources()) == []


def test_a_planted_loop_per_request_is_reported() -> None:
    planted = "import anyio\n\ndef route(f):\n    return anyio.run(f)\n"
    assert loops_per_request({**_sources(), "flowkernel.server.planted": planted}) == [
        "flowkernel.server.planted:4 calls anyio.run"]
