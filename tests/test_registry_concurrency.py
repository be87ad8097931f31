"""Lazy registry entries resolve safely when many threads ask at once (a server answers requests in
several threads: two pages asking for the flows list at once must both see every node type)."""

from __future__ import annotations

import sys
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import flowkernel.plugins.registry
import pytest
from flowkernel.plugins.lazy import LazyMap
from flowkernel.plugins.registry import Registry

THREADS = 16


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Write a module whose import runs ``body``; returns its (unique) name. Forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(body: str) -> str:
        name = f"fk_lazy_{uuid.uuid4().hex}"
        (tmp_path / f"{name}.py").write_text(body)
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def at_once(work: Callable[[], Any], threads: int = THREADS) -> list[Any]:
    """``work()`` in ``threads`` threads released together; their results (an exception is a result)."""
    barrier = threading.Barrier(threads)
    results: list[Any] = [None] * threads

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work()
        except BaseException as exc:  # reported as the result, for the assertion to show
            results[i] = exc

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(30)
    assert not any(t.is_alive() for t in pool), "a lookup hung"
    return results


def test_a_lazy_name_stays_known_while_its_module_is_being_imported(
        modules: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    gate = types.ModuleType("fk_import_gate")
    gate.entered = threading.Event()  # type: ignore[attr-defined]
    gate.release = threading.Event()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fk_import_gate", gate)
    name = modules("import fk_import_gate\nfk_import_gate.entered.set()\nfk_import_gate.release.wait(30)\n"
                   "class Node:\n    name = 'gated'\n")
    lazy: LazyMap[Any] = LazyMap(lambda: None)
    lazy.add_lazy("gated", f"{name}:Node", instantiate=True)
    got: list[Any] = []
    first = threading.Thread(target=lambda: got.append(lazy["gated"]))
    first.start()
    try:
        assert gate.entered.wait(10)  # type: ignore[attr-defined]
        # The import is under way in `first`: another thread asking now must not find the name gone.
        assert "gated" in lazy
        assert "gated" in list(lazy) and len(lazy) == 1
        others = [threading.Thread(target=lambda: got.append(lazy.get("gated"))) for _ in range(4)]
        for t in others:
            t.start()
    finally:
        gate.release.set()  # type: ignore[attr-defined]
    for t in [first, *others]:
        t.join(10)
    assert len(got) == 5 and got[0] is not None
    assert all(value is got[0] for value in got), "one instance, the same for every thread"
    assert lazy["gated"] is got[0]


def look_up_all(lazy: LazyMap[Any], wanted: list[str]) -> Callable[[], list[Any]]:
    return lambda: [(key in lazy, lazy.get(key), sorted(lazy)) for key in wanted]


def test_many_threads_asking_for_lazy_names_at_once_all_get_them(modules: Callable[[str], str]) -> None:
    for _ in range(3):
        lazy: LazyMap[Any] = LazyMap(lambda: None)
        wanted = []
        for i in range(3):
            # an import that takes a while (as the agent node's does): the other threads come meanwhile
            name = modules(f"import time\ntime.sleep(0.05)\nclass Node:\n    name = 'n{i}'\n")
            lazy.add_lazy(f"n{i}", f"{name}:Node", instantiate=True)
            wanted.append(f"n{i}")

        for result in at_once(look_up_all(lazy, wanted)):
            assert not isinstance(result, BaseException), result
            for (known, value, names), key in zip(result, wanted, strict=True):
                assert known and value is not None and value.name == key, (key, known, value)
                assert names == sorted(wanted)
        assert all(lazy[key] is lazy[key] for key in wanted)


def test_names_an_entry_point_scan_adds_are_found_by_every_thread_that_asks_during_the_scan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[int] = []
    started = threading.Event()

    def slow_scan(reg: Registry) -> None:
        scans.append(1)
        started.set()
        time.sleep(0.3)  # an entry point's package that takes a while to import: the others come meanwhile
        reg.add_function("late_fn", lambda: "fn")
        reg.add_tool("late_tool", lambda: "tool")

        class Late:
            name = "late.node"

            async def run(self, ctx: Any) -> Any:
                return None

        reg.add_node_type(Late)

    monkeypatch.setattr(flowkernel.plugins.registry, "_load_entry_points", slow_scan)
    reg = Registry()
    counter = iter(range(THREADS))
    lock = threading.Lock()

    def look() -> tuple[bool, bool, bool]:
        with lock:
            i = next(counter)
        # Each map has its own first miss; one scan must serve all three.
        maps = [(reg.functions, "late_fn"), (reg.tools, "late_tool"), (reg.node_types, "late.node")]
        first, *rest = maps[i % 3:] + maps[:i % 3]
        found = [first[1] in first[0]]
        found += [m.get(key) is not None for m, key in rest]
        return found[0], found[1], found[2]

    results = at_once(look)
    assert started.is_set()
    assert all(result == (True, True, True) for result in results), results
    assert scans == [1], "the entry points were scanned once"
