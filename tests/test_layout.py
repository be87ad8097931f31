"""The package layout shows the architecture (DESIGN §2): each folder imports only the folders below it,
nothing imports in a circle, the core is pure, product code never imports the test kit, modules stay
small, only the command line prints, services are typed, and an event's type is read in one place.

Every import counts, wherever it is: at the top, under ``if TYPE_CHECKING:`` and inside functions, so
neither a lazy import nor a type-only one can hide an arrow. The checks are pure functions over
``{module: source}``; the tests run them on the package and, for each rule, on the package plus one
planted module that breaks it, so a check that could not fail would show."""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# -- the rules ------------------------------------------------------------------------------------

FOLDERS = ("core", "flowfiles", "store", "telemetry", "agents", "plugins", "history", "fixtures", "nodes",
           "run", "workers", "server", "cli", "examples", "testing")
# Modules that stay at the package's root: leaves every folder may import (DESIGN §2).
ROOT_MODULES = {"flowkernel", "flowkernel.__main__", "flowkernel.errors", "flowkernel.ids", "flowkernel.redaction"}
_BELOW_STORE = {"core", "errors", "ids", "redaction"}
# folder -> the folders it may import (itself always).
ALLOWED: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "errors": set(),
    "ids": set(),
    "redaction": set(),
    "core": {"errors"},
    "flowfiles": {"core", "errors"},
    "store": _BELOW_STORE,
    "telemetry": {"store"} | _BELOW_STORE,
    "agents": _BELOW_STORE,
    "plugins": {"agents"} | _BELOW_STORE,
    "history": {"store"} | _BELOW_STORE,
    "fixtures": {"agents", "flowfiles", "store"} | _BELOW_STORE,
    "nodes": {"agents", "plugins", "history", "flowfiles", "telemetry"} | _BELOW_STORE,
    "run": {"fixtures", "agents", "plugins", "history", "flowfiles", "store", "telemetry"} | _BELOW_STORE,
    "workers": {"run", "plugins", "store"} | _BELOW_STORE,
    "server": {"run", "history", "flowfiles", "store"} | _BELOW_STORE,
    "cli": set(FOLDERS) - {"testing", "nodes"} | _BELOW_STORE,
    "__main__": {"cli"},
    "examples": {"plugins", "agents", "errors", "redaction"},
    "testing": set(FOLDERS) | _BELOW_STORE,
    "__init__": set(FOLDERS) | _BELOW_STORE,  # the lazy public API: type-only or inside functions only
}.items()}
# The core is pure: no I/O, clock, randomness, threads or event loop. The expression guard is the one
# allowance: a timer thread and the clock bound an expression's evaluation (a limit that fires is
# recorded as an event, so a replay never re-evaluates it).
IMPURE = frozenset({"os", "io", "time", "random", "threading", "socket", "subprocess", "sqlite3", "tempfile",
                    "shutil", "asyncio", "anyio", "uuid", "datetime"})
CORE_ALLOWANCE = {"flowkernel.core.expression_bounds": {"threading", "time"},
                  # Its limits' defaults come from FLOWKERNEL_EXPR_* (``limits_from_env``).
                  "flowkernel.core.expression_scope": {"os", "threading"},
                  # A JSON Schema's pattern checks are bounded the same way: a deadline, per thread.
                  "flowkernel.core.jsonschemas": {"threading", "time"},
                  # Until the matcher that runs long matches in a child process moves to run/ (the core
                  # keeps the in-thread matcher and the Matcher protocol): the list only shrinks.
                  "flowkernel.core.bounded_regex": {"os", "subprocess", "threading", "time"}}
MAX_LINES = 500
# Modules still over MAX_LINES while they are being split; the list only shrinks.
LARGE: set[str] = set()
# Modules that still print to stderr where they should log; the list only shrinks.
PRINTING: set[str] = set()
# Modules that still match an event's type by the first bytes of its body; the list only shrinks.
PREFIX_MATCHING: set[str] = set()


# -- reading the sources --------------------------------------------------------------------------

@dataclass(frozen=True)
class Import:
    line: int
    kind: str  # "top", "type-only" or "in-function": for the message only, every kind counts
    module: str  # the flowkernel module imported


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


@functools.cache
def _package_sources() -> tuple[tuple[str, str], ...]:
    return tuple((name, path.read_text(encoding="utf-8")) for name, path in _modules().items())


def package_sources() -> dict[str, str]:
    return dict(_package_sources())


@functools.cache
def _nodes(source: str) -> tuple[tuple[ast.AST, str], ...]:
    """Every node of ``source`` with where it is: ``top``, ``type-only`` or ``in-function``."""
    return tuple(_walk(ast.parse(source), "top"))


def _walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.AST, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for inner in child.body:
                yield inner, "type-only"
                yield from _walk(inner, "type-only")
            for inner in child.orelse:
                yield inner, kind
                yield from _walk(inner, kind)
            continue
        inner_kind = "in-function" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else kind
        yield child, inner_kind
        yield from _walk(child, inner_kind)


def imports_of(source: str, known: set[str]) -> list[Import]:
    """The flowkernel modules ``source`` imports, each import wherever it is. ``from flowkernel.x import y``
    imports ``flowkernel.x.y`` when that is a module, else ``flowkernel.x``."""
    out: list[Import] = []
    for node, kind in _nodes(source):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                target = sub if sub in known else node.module
                if target in known:
                    out.append(Import(node.lineno, kind, target))
        elif isinstance(node, ast.Import):
            out += [Import(node.lineno, kind, a.name) for a in node.names if a.name in known]
    return out


def graph_of(sources: Mapping[str, str]) -> dict[str, list[Import]]:
    known = set(sources)
    return {name: [i for i in imports_of(src, known) if i.module != name and not name.startswith(i.module + ".")]
            for name, src in sources.items()}


def folder_of(module: str) -> str:
    if module == "flowkernel":
        return "__init__"
    part = module.split(".")[1]
    return part if part in FOLDERS or module in ROOT_MODULES else "(no folder)"


# -- the checks -----------------------------------------------------------------------------------

def rule_breaks(graph: Mapping[str, list[Import]]) -> list[str]:
    out = []
    for module, imports in sorted(graph.items()):
        here = folder_of(module)
        for i in imports:
            there = folder_of(i.module)
            allowed = here == there or there in ALLOWED.get(here, frozenset())
            if here == "__init__" and i.kind == "top":
                allowed = False  # ``import flowkernel`` stays cheap: the public API is imported lazily
            if not allowed:
                out.append(f"{module}:{i.line} [{i.kind}] {here}/ may not import {there}/ ({i.module})")
    return out


def _cycles(edges: Mapping[str, set[str]]) -> list[str]:
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if seen.get(nxt) == 1:
                found.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in seen:
                visit(nxt, [*path, nxt])
        seen[node] = 2

    for node in sorted(edges):
        if node not in seen:
            visit(node, [node])
    return found


def module_circles(graph: Mapping[str, list[Import]]) -> list[str]:
    return _cycles({m: {i.module for i in imports} for m, imports in graph.items()})


def folder_circles(graph: Mapping[str, list[Import]]) -> list[str]:
    edges: dict[str, set[str]] = {}
    for module, imports in graph.items():
        here = folder_of(module)
        if here in ("__init__", "__main__"):
            continue  # the package's own entry points sit above every folder
        edges.setdefault(here, set()).update(folder_of(i.module) for i in imports if folder_of(i.module) != here)
    return _cycles(edges)


def core_impurities(sources: Mapping[str, str]) -> list[str]:
    out = []
    for module, src in sorted(sources.items()):
        if folder_of(module) != "core":
            continue
        for node, _ in _nodes(src):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                if top in IMPURE and top not in CORE_ALLOWANCE.get(module, set()):
                    out.append(f"{module}:{node.lineno} imports {name}")
    return out


def large_modules(paths: Mapping[str, Path]) -> list[str]:
    out = []
    for path in sorted(paths.values()):
        where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines >= MAX_LINES and where not in LARGE:
            out.append(f"{where}: {lines} lines")
    return out


def prints(sources: Mapping[str, str]) -> list[str]:
    """Calls of ``print`` in library code: only the command line prints (DESIGN §2); the rest logs."""
    return [f"{module}:{node.lineno}" for module, src in sorted(sources.items())
            if folder_of(module) not in ("cli", "__main__", "testing") and module not in PRINTING
            for node, _ in _nodes(src)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]


def _is_services(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "services") or \
        (isinstance(node, ast.Attribute) and node.attr == "services")


def services_lookups(sources: Mapping[str, str]) -> list[str]:
    """``services["…"]`` and ``services.get("…")``: what a run uses is a typed field, not a string key."""
    out = []
    for module, src in sorted(sources.items()):
        for node, _ in _nodes(src):
            if isinstance(node, ast.Subscript) and _is_services(node.value) and isinstance(node.slice, ast.Constant):
                out.append(f"{module}:{node.lineno} services[{node.slice.value!r}]")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and _is_services(node.func.value) and node.args and isinstance(node.args[0], ast.Constant)):
                out.append(f"{module}:{node.lineno} services.get({node.args[0].value!r})")
    return out


def event_prefix_matches(sources: Mapping[str, str]) -> list[str]:
    """Bytes literals that start an event body (``b'{"type"…'``) outside ``core/events``: an event's type
    is read by ``flowkernel.core.events.event_type``, for plain and packed bodies alike."""
    return [f"{module}:{node.lineno}" for module, src in sorted(sources.items())
            if module != "flowkernel.core.events" and module not in PREFIX_MATCHING
            for node, _ in _nodes(src)
            if isinstance(node, ast.Constant) and isinstance(node.value, bytes) and node.value.startswith(b'{"type"')]


# -- the package ------------------------------------------------------------------------------------

def test_each_folder_imports_only_the_folders_below_it() -> None:
    assert rule_breaks(graph_of(package_sources())) == []


def test_modules_of_the_package_do_not_import_each_other_in_a_circle() -> None:
    assert module_circles(graph_of(package_sources())) == []


def test_folders_do_not_import_each_other_in_a_circle() -> None:
    assert folder_circles(graph_of(package_sources())) == []


def test_the_core_imports_nothing_impure() -> None:
    assert core_impurities(package_sources()) == []


def test_product_code_never_imports_the_test_kit() -> None:
    graph = graph_of(package_sources())
    assert [f"{m} -> {i.module}" for m, imports in sorted(graph.items()) if folder_of(m) != "testing"
            for i in imports if folder_of(i.module) == "testing"] == []


def test_every_module_is_under_the_line_limit() -> None:
    assert large_modules(_modules()) == []


def test_the_allowance_for_large_modules_names_only_modules_still_large() -> None:
    for where in LARGE:
        assert len((ROOT / where).read_text(encoding="utf-8").splitlines()) >= MAX_LINES, f"{where}: drop it from LARGE"


def test_only_the_command_line_prints() -> None:
    assert prints(package_sources()) == []


def test_no_service_is_looked_up_by_a_string_key() -> None:
    assert services_lookups(package_sources()) == []


def test_an_events_type_is_read_in_one_place() -> None:
    assert event_prefix_matches(package_sources()) == []


def test_the_pending_lists_name_only_modules_that_still_need_them() -> None:
    sources = package_sources()
    for module in PRINTING:
        assert "print(" in sources[module], f"{module}: drop it from PRINTING"
    for module in PREFIX_MATCHING:
        assert b'{"type"'.decode() in sources[module], f"{module}: drop it from PREFIX_MATCHING"


# -- each rule, shown to fail on a planted module ---------------------------------------------------------

def _planted(name: str, source: str) -> dict[str, str]:
    return {**package_sources(), name: source}


def test_a_planted_upward_import_is_reported() -> None:
    graph = graph_of(_planted("flowkernel.core.planted", "from flowkernel.run.kernel import Kernel\n"))
    assert rule_breaks(graph) == ["flowkernel.core.planted:1 [top] core/ may not import run/ (flowkernel.run.kernel)"]


def test_a_planted_type_only_import_is_reported() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flowkernel.store.base import Store\n"
    assert rule_breaks(graph_of(_planted("flowkernel.core.planted", source))) == [
        "flowkernel.core.planted:3 [type-only] core/ may not import store/ (flowkernel.store.base)"]


def test_a_planted_function_level_import_is_reported() -> None:
    source = "def f():\n    from flowkernel.history.agent_runs import AgentRunFold\n    return AgentRunFold\n"
    assert rule_breaks(graph_of(_planted("flowkernel.store.planted", source))) == [
        "flowkernel.store.planted:2 [in-function] store/ may not import history/ (flowkernel.history.agent_runs)"]


def test_a_planted_node_type_importing_the_shell_is_reported() -> None:
    graph = graph_of(_planted("flowkernel.nodes.planted", "from flowkernel.run.kernel import Kernel\n"))
    assert rule_breaks(graph) == ["flowkernel.nodes.planted:1 [top] nodes/ may not import run/ (flowkernel.run.kernel)"]


def test_a_planted_store_importing_a_node_type_is_reported() -> None:
    graph = graph_of(_planted("flowkernel.store.planted", "import flowkernel.nodes.basic\n"))
    assert rule_breaks(graph) == ["flowkernel.store.planted:1 [top] store/ may not import nodes/ (flowkernel.nodes.basic)"]


def test_a_planted_import_of_the_test_kit_is_reported() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flowkernel.testing.harness import FlowResult\n"
    assert rule_breaks(graph_of(_planted("flowkernel.run.planted", source))) == [
        "flowkernel.run.planted:3 [type-only] run/ may not import testing/ (flowkernel.testing.harness)"]


def test_a_planted_eager_import_in_the_package_root_is_reported() -> None:
    sources = package_sources()
    sources["flowkernel"] += "\nfrom flowkernel.run.kernel import Kernel\n"
    line = len(sources["flowkernel"].splitlines())
    assert rule_breaks(graph_of(sources)) == [f"flowkernel:{line} [top] __init__/ may not import run/ (flowkernel.run.kernel)"]


def test_a_planted_module_in_no_folder_is_reported() -> None:
    graph = graph_of(_planted("flowkernel.planted", "from flowkernel.core.events import decode\n"))
    assert rule_breaks(graph) == ["flowkernel.planted:1 [top] (no folder)/ may not import core/ (flowkernel.core.events)"]


def test_a_planted_module_circle_is_reported_even_through_a_type_only_import() -> None:
    sources = {**package_sources(),
               "flowkernel.run.planted_a": "from flowkernel.run.planted_b import B\nA = 1\n",
               "flowkernel.run.planted_b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                           "    from flowkernel.run.planted_a import A\nB = 1\n"}
    assert module_circles(graph_of(sources)) == ["flowkernel.run.planted_a -> flowkernel.run.planted_b -> "
                                                 "flowkernel.run.planted_a"]


def test_a_planted_folder_circle_is_reported() -> None:
    graph = graph_of(_planted("flowkernel.history.planted", "from flowkernel.run.kernel import Kernel\n"))
    assert any(c.startswith("history -> run -> ") and c.endswith("history") for c in folder_circles(graph))
    assert "flowkernel.history.planted:1 [top] history/ may not import run/ (flowkernel.run.kernel)" in rule_breaks(graph)


def test_a_planted_impure_core_module_is_reported() -> None:
    assert core_impurities(_planted("flowkernel.core.planted", "import threading\n")) == [
        "flowkernel.core.planted:1 imports threading"]


def test_a_planted_large_module_is_reported(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("x = 1\n" * MAX_LINES)
    assert large_modules({**_modules(), "flowkernel.run.planted": planted}) == [f"{planted}: {MAX_LINES} lines"]


def test_a_planted_print_is_reported() -> None:
    source = "import sys\n\n\ndef f():\n    print('x', file=sys.stderr)\n"
    assert prints(_planted("flowkernel.run.planted", source)) == ["flowkernel.run.planted:5"]
    assert prints({"flowkernel.cli.planted": source}) == []


def test_a_planted_services_lookup_is_reported() -> None:
    source = "def f(ctx, services):\n    return ctx.services['query_fn'], services.get('prices')\n"
    assert services_lookups(_planted("flowkernel.nodes.planted", source)) == [
        "flowkernel.nodes.planted:2 services['query_fn']", "flowkernel.nodes.planted:2 services.get('prices')"]


def test_a_planted_match_of_an_events_first_bytes_is_reported() -> None:
    source = "def ended(body):\n    return body.startswith(b'{\"type\":\"flow:complete\"')\n"
    assert event_prefix_matches(_planted("flowkernel.server.planted", source)) == ["flowkernel.server.planted:2"]


@pytest.mark.parametrize("module", ["flowkernel.core.events"])
def test_the_one_event_type_reader_is_allowed_its_bytes(module: str) -> None:
    assert 'b\'"type":"\'' in package_sources()[module] or "_TAG" in package_sources()[module]


# -- the rest of the layout -----------------------------------------------------------------------------

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
