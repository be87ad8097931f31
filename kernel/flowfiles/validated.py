"""Flow files known to be valid: a file that passed ``validate`` is not validated again until something
validation reads changes.

Validation needs pydantic, networkx and jsonschema, whose imports cost more than starting the
interpreter; ``run`` and ``validate`` of a file validated before skip them (the compiled form is built
as for a stored flow). A file is remembered as an empty file named by a hash of everything its
validation depends on:

- the document (its canonical JSON) and whether the registered function and tool names were checked
  (``run --queue`` leaves them to the worker);
- each node type the flow uses: that it is registered, where its code comes from (its module and the
  module's file; for a plugin inside a package, every source file of the package), its input schema
  and the input keys it says hold expressions;
- the answers the node types' ``check_names`` got about registered functions and tools;
- the contents of the files the flow names (``flow.call`` children given as constant paths, read as a
  child flow is read);
- the interpreter, the installed distributions (names, versions and install times: pydantic,
  jsonschema, jsonata, plugins' packages) and every source file of flowkernel.

A record lives under ``FLOWKERNEL_CACHE_DIR`` (else ``$XDG_CACHE_HOME/flowkernel``, else
``~/.cache/flowkernel``); set ``FLOWKERNEL_CACHE_DIR`` to an empty string to turn the cache off. A record
is touched when used; past ``MAX_RECORDS`` records the least recently used are removed. A
document the key cannot be computed for is simply validated. A cache that cannot be read or written
is as good as empty: it never stops a command. Only a flow that passed validation is ever recorded.

The child flows a flow calls by constant paths are validated with it (``flowkernel.flowfiles.tree``), each
through its own record, looked up every time: a grandchild changed since is seen, though the flow's
own record keys only its direct children's contents.

The node types' own ``check`` and ``check_names`` are cheap (no pydantic, no networkx) and may read more
than their code (a plugin's settings): they run every time, cached or not, and any problem they find
sends the flow through the whole validation, which reports it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from flowkernel.core.canonical import canonical_json, flow_hash
from flowkernel.errors import FlowkernelError, FlowValidationError, Problem
from flowkernel.flowfiles.localfiles import (
    DEFAULT_MAX_FLOW_BYTES,
    MAX_FLOW_BYTES_ENV,
    limit_from_env,
    read_limited,
    resolve_inside,
)
from flowkernel.flowfiles.read import read_flow_document

if TYPE_CHECKING:
    from flowkernel.core.compiler import CompiledFlow
    from flowkernel.core.names import Registered

CACHE_ENV = "FLOWKERNEL_CACHE_DIR"
_FORMAT = b"flowkernel validation record 1"
MAX_RECORDS = 2000  # flows remembered as valid; the least recently used beyond are forgotten
# Node types whose constant ``flow`` input names a file (its contents are part of the key).
_FILE_KEYS = {"flow.call": "flow"}


class FlowSummary(NamedTuple):
    """What ``validate`` says of a valid flow: its name, its counts, and what is worth a warning (each a
    ``Problem``: where, and what)."""

    name: str
    nodes: int
    edges: int
    warnings: list[Problem]


def load_valid_flow(path: str | Path, registry: Registered, *, check_names: bool = True,
                    warnings: list[Problem] | None = None) -> CompiledFlow:
    """Read a flow file and compile it, validating it unless it passed validation before with all that
    validation reads unchanged (see the module), and the child flows it calls by constant paths with
    it (``flowkernel.flowfiles.tree``): every problem of them all is reported at once. ``check_names``:
    functions and tools must be registered (as ``load_flow`` with the registry's names). ``warnings``,
    given, gets what is worth a warning but does not make the flow invalid."""
    from flowkernel.core.compiler import compile_flow

    found = _look_up(path, registry, check_names)

    def own() -> CompiledFlow:
        if found.known:
            return compile_flow(found.document, source=found.source, base_dir=found.base,
                                node_types=registry.node_types, trusted=True, stored=found.stored)
        return _validate(found, registry, check_names)

    return _with_children(found, registry, check_names, own, warnings)


def check_flow_file(path: str | Path, registry: Registered) -> FlowSummary:
    """Validate a flow file and the child flows it calls (as ``load_valid_flow``) and summarise it. A
    flow known to be valid is not compiled: its summary is read from the document."""
    found = _look_up(path, registry, True)

    def own() -> FlowSummary:
        if found.known:
            nodes, edges = found.document["nodes"], found.document.get("edges") or []
            # As the compiled flow counts them: nodes by id, edges by id (``from->to`` when unnamed).
            return FlowSummary(str(found.document["name"]), len({node["id"] for node in nodes}),
                               len({edge.get("id") or f"{edge['from']}->{edge['to']}" for edge in edges}), [])
        flow = _validate(found, registry, True)
        return FlowSummary(flow.name, len(flow.nodes), len(flow.edges), [])

    warnings: list[Problem] = []
    summary = _with_children(found, registry, True, own, warnings)
    return summary._replace(warnings=warnings)


_T = TypeVar("_T")


def _with_children(found: _Found, registry: Registered, check_names: bool, own: Callable[[], _T],
                   warnings: list[Problem] | None) -> _T:
    """``own()`` (the flow's own validation), with the problems of the child flows it calls added to
    its own, or raised on their own when it has none; warnings of them all go to ``warnings``."""
    from flowkernel.flowfiles.tree import check_tree, node_warnings

    problems: list[Problem] = []
    result: _T | None = None
    try:
        result = own()
    except FlowValidationError as exc:
        problems.extend(exc.problems)

    def visit(file: Path, shown: str) -> tuple[Any, list[Problem], list[Problem]]:
        child = _look_up(file, registry, check_names)._replace(source=shown)
        noted = node_warnings(child.document, registry.node_types)
        if child.known:
            return child.document, [], noted
        try:
            _validate(child, registry, check_names)
        except FlowValidationError as exc:
            return child.document, exc.problems, noted
        return child.document, [], noted

    children, noted = check_tree(found.document, found.source, found.base, visit)
    problems.extend(children)
    if problems:
        raise FlowValidationError(found.source, problems)
    if warnings is not None:
        warnings.extend([*node_warnings(found.document, registry.node_types), *noted])
    assert result is not None
    return result


class _Found(NamedTuple):
    document: Any
    source: str
    base: Path
    record: Path | None  # the validation record (None: no cache, or a document not worth keying)
    stored: tuple[str, str] | None  # the document's canonical text and hash, when keyed
    known: bool  # the record exists: the document passed validation with all it reads as now


def _look_up(path: str | Path, registry: Registered, check_names: bool) -> _Found:
    p = Path(path)
    document, _ = read_flow_document(p)
    source, base = str(p), p.resolve().parent
    folder = cache_dir()
    found = _key(document, base, registry, check_names) if folder is not None else None
    if folder is None or found is None:
        return _Found(document, source, base, None, None, False)
    key, canonical, digest = found
    record = folder / key
    return _Found(document, source, base, record, (canonical, digest), _used(record))


def _used(record: Path) -> bool:
    """Whether ``record`` exists; it is touched if so, so the records pruned first are the least used."""
    try:
        os.utime(record)
        return True
    except FileNotFoundError:
        return False
    except OSError:  # a cache that is read-only to this user: it still answers
        return record.exists()


def _validate(found: _Found, registry: Registered, check_names: bool) -> CompiledFlow:
    """Validate and compile a flow not known to be valid; remember it if it passes."""
    from flowkernel.core.compiler import compile_flow

    names: dict[str, Any] = {"functions": registry.functions, "tools": registry.tools} if check_names else {}
    flow = compile_flow(found.document, source=found.source, base_dir=found.base,
                        node_types=registry.node_types, **names)
    if found.record is not None:
        try:
            found.record.parent.mkdir(parents=True, exist_ok=True)
            found.record.touch()
        except OSError:
            return flow  # not remembered: validated again next time
        _forget_least_used(found.record.parent)
    return flow


def _forget_least_used(folder: Path) -> None:
    """Keep at most ``MAX_RECORDS`` records: past that, the least recently used tenth goes (every edit
    of a flow makes a new record, and the old ones would otherwise stay for ever)."""
    try:
        with os.scandir(folder) as listing:
            records = [(entry.stat().st_mtime_ns, entry.path) for entry in listing if entry.is_file()]
    except OSError:
        return
    if len(records) <= MAX_RECORDS:
        return
    records.sort()
    for _, path in records[: len(records) - MAX_RECORDS * 9 // 10]:
        try:
            os.unlink(path)
        except OSError:
            pass  # another process pruned it first, or it is not ours to remove


def cache_dir() -> Path | None:
    """Where validation records are kept; None when the cache is off."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        return Path(configured) / "valid" if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or (str(Path.home() / ".cache") if "HOME" in os.environ else "")
    return Path(base) / "flowkernel" / "valid" if base else None


class _Asked(Collection[str]):
    """Registered names that remember what they were asked: the answers validation's name checks got
    are part of the key, so a function or tool registered or removed since is validated again."""

    def __init__(self, kind: str, names: Collection[str], log: list[str]) -> None:
        self._kind, self._names, self._log = kind, names, log

    def __contains__(self, name: object) -> bool:
        answer = name in self._names
        self._log.append(f"{self._kind}?{name!r}={answer}")
        return answer

    def __iter__(self) -> Iterator[str]:
        listing = sorted(self._names)
        self._log.append(f"{self._kind}*{listing!r}")
        return iter(listing)

    def __len__(self) -> int:
        listing = sorted(self._names)
        self._log.append(f"{self._kind}*{listing!r}")
        return len(listing)


def _key(document: Any, base: Path, registry: Registered, check_names: bool) -> tuple[str, str, str] | None:
    """The record's name, the document's canonical text and its hash; None when the document is not
    worth caching (odd enough that validation will say what is wrong with it)."""
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list):
        return None
    try:
        canonical = canonical_json(document)
        digest = flow_hash(canonical)
    except (TypeError, ValueError, RecursionError, UnicodeError):
        return None
    h = hashlib.sha256(_FORMAT)
    h.update(f"\0{digest}\0names={check_names}".encode())
    from flowkernel.core.names import KnownNames

    asked: list[str] = []
    known = KnownNames(_Asked("f", registry.functions, asked), _Asked("t", registry.tools, asked))
    types: dict[str, Any] = {}
    files: set[str] = set()
    for i, node in enumerate(document["nodes"]):
        ntype = node.get("type") if isinstance(node, dict) else None
        if not isinstance(ntype, str) or ntype not in registry.node_types:
            return None  # validation reports it
        node_type = types[ntype] = registry.node_types[ntype]
        raw_input = node.get("input", {})
        if not isinstance(raw_input, dict):
            return None
        file_key = _FILE_KEYS.get(ntype)
        if file_key is not None and isinstance(raw_input.get(file_key), str):
            files.add(raw_input[file_key])
        # A node type's own checks are cheap and may read more than its code (a plugin's settings):
        # they run every time, as validation runs them; any problem and validation says what it is.
        path = f"$.nodes[{i}].input"
        hooks: list[tuple[str, tuple[Any, ...]]] = [("check", (raw_input, path))]
        if check_names:
            hooks.append(("check_names", (raw_input, path, known)))
        for hook_name, args in hooks:
            hook: Callable[..., None] | None = getattr(node_type, hook_name, None)
            if hook is None:
                continue
            problems: list[Any] = []
            try:
                hook(*args, problems)
            except Exception:
                return None
            if problems:
                return None
    for name in sorted(types):
        # What validation reads of a node type besides its checks: its input schema and the input keys
        # that hold expressions (attributes, which a plugin may set from its settings).
        schema = getattr(types[name], "input_schema", None)
        keys = getattr(types[name], "expression_keys", ())
        try:
            described = canonical_json([schema, sorted(keys)])
        except (TypeError, ValueError, RecursionError):
            return None
        h.update(f"\0type {name}\0{_origin(types[name])}\0{described}".encode())
    h.update("\0".join(asked).encode())
    for name in sorted(files):
        h.update(f"\0file {name}\0{_content(base, name)}".encode())
    h.update(_environment().encode())
    return h.hexdigest()[:48], canonical, digest


def _origin(node_type: Any) -> str:
    """Where a node type's code comes from: its class's module and the stamps of its source files
    (flowkernel's own are in ``_environment``)."""
    cls = node_type if isinstance(node_type, type) else type(node_type)
    module_name = getattr(cls, "__module__", "?")
    origin = f"{module_name}:{getattr(cls, '__qualname__', '?')}"
    if module_name == "flowkernel" or module_name.startswith("flowkernel."):
        return origin
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return origin + "\0unknown"
    top = sys.modules.get(module_name.partition(".")[0])
    top_file = getattr(top, "__file__", None)
    if "." in module_name and top_file and os.path.basename(top_file) == "__init__.py":
        return origin + _stamps([os.path.dirname(top_file)])  # a package: any of its modules may check
    return origin + _stamp(file)


def _content(base: Path, name: str) -> str:
    """A named file's contents, as a hash, or why it cannot be read (that is part of the key too). Read
    as a child flow is: never outside the folders allowed, never a FIFO or a device."""
    try:
        target = resolve_inside(base, name, "flow.call")
        data = read_limited(target, limit_from_env(MAX_FLOW_BYTES_ENV, DEFAULT_MAX_FLOW_BYTES), "flow file")
    except FlowkernelError as exc:
        return f"unreadable: {exc}"
    return hashlib.sha256(data).hexdigest()


def _environment() -> str:
    """The interpreter, the installed distributions and flowkernel's sources, as stamps."""
    parts = [sys.version, sys.implementation.cache_tag or ""]
    for entry in sys.path:
        if not entry or not os.path.isabs(entry):
            continue  # the working directory: a plugin module there is stamped by its node type
        try:
            with os.scandir(entry) as listing:
                for item in sorted(listing, key=lambda e: e.name):
                    if item.name.endswith((".dist-info", ".egg-info", ".egg-link", ".pth")):
                        parts.append(f"{item.name}:{item.stat().st_mtime_ns}")
        except OSError:
            continue
    parts.append(_stamps(_source_folders()))
    return "\0".join(parts)


def _stamps(folders: list[str]) -> str:
    """Path, size and modification time of every ``.py`` file under ``folders``."""
    out: list[str] = []
    todo = list(folders)
    while todo:
        folder = todo.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            out.append(f"{folder}:unreadable")
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__" and not entry.name.startswith("."):
                    todo.append(entry.path)
            elif entry.name.endswith(".py"):
                out.append(f"{entry.path}:{_stamp(entry.path)}")
    return "\0".join(out)


def _stamp(file: str) -> str:
    try:
        st = os.stat(file)
    except OSError:
        return "missing"
    return f"{st.st_size}:{st.st_mtime_ns}"


def _source_folders() -> list[str]:
    """flowkernel's package folders (``flowkernel.nodes`` may lie elsewhere in an editable install)."""
    import importlib.util

    import flowkernel

    # Found, not imported: importing flowkernel.nodes would make this module depend on the node types.
    spec = importlib.util.find_spec("flowkernel.nodes")
    nodes = list(spec.submodule_search_locations or []) if spec is not None else []
    return [os.path.dirname(flowkernel.__file__ or ""), *nodes[:1]]


def source_files() -> list[str]:
    """Every source file whose stamp is part of the key (for tests and diagnostics)."""
    return [line.rsplit(":", 2)[0] for line in _stamps(_source_folders()).split("\0") if line]
