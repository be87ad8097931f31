"""``LazyMap``: a registry's map whose entries are ``module:attr`` strings imported on first use."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

V = TypeVar("V")


class LazyMap(dict[str, V]):
    """A dict whose entries may be given as ``"module:attr"`` and imported on first use, and which
    asks ``on_miss`` (once) to load more entries before it says a name is unknown.

    Resuming a run should not import the anthropic SDK or scan every installed package when the
    flow only uses ``transform`` nodes: this is what keeps start-up cheap.

    Safe to share between threads (a server answers requests in several at once): a lazy name stays
    known while its module imports, and a name asked for while ``on_miss`` runs is answered once it
    has run. No lock of the map is held while a lazy entry's module imports (Python's import lock
    makes a second importer of the same module wait for the first), so a module that registers into
    the map as it is imported cannot deadlock it.
    """

    def __init__(self, on_miss: Callable[[], None] | None = None, *, lock: threading.RLock | None = None) -> None:
        """``lock``: held while ``on_miss`` runs; maps whose hooks share work share it (one lock, no
        order to get wrong)."""
        super().__init__()
        self._lazy: dict[str, tuple[str, bool]] = {}
        self._on_miss = on_miss
        self._entries = threading.Lock()  # guards moving a name from ``_lazy`` into the dict
        self._missing = lock or threading.RLock()

    def add_lazy(self, name: str, target: str, *, instantiate: bool = False) -> None:
        with self._entries:
            self._lazy[name] = (target, instantiate)

    def __setitem__(self, key: str, value: V) -> None:
        with self._entries:
            dict.__setitem__(self, key, value)
            self._lazy.pop(key, None)  # a value registered now wins over a lazy one not yet imported

    def loaded(self, name: str) -> V | None:
        """The value under ``name`` if it is registered or imported already; None otherwise (nothing is
        imported and no hook runs)."""
        with self._entries:
            return dict.get(self, name)

    def lazy(self, name: str) -> bool:
        """Whether ``name`` is a ``module:attr`` entry not imported yet."""
        with self._entries:
            return name in self._lazy and not dict.__contains__(self, name)

    def _resolve(self, name: str) -> V:
        with self._entries:
            if dict.__contains__(self, name):
                return dict.__getitem__(self, name)
            entry = self._lazy.get(name)
        if entry is None:
            raise KeyError(name)
        # The name stays in ``_lazy`` until its value is in the dict: a thread that asks meanwhile
        # sees it as known, and imports it too (waiting on the import lock) or finds it resolved.
        target, instantiate = entry
        module, _, attr = target.partition(":")
        value = getattr(importlib.import_module(module), attr)
        if instantiate:
            value = value()
        with self._entries:
            if self._lazy.get(name) is entry:
                dict.__setitem__(self, name, value)
                del self._lazy[name]
            elif dict.__contains__(self, name):
                value = dict.__getitem__(self, name)  # resolved (or registered) by another thread first
        return value  # type: ignore[no-any-return]

    def _miss(self) -> None:
        # Always under the lock: a thread that comes while another runs the hook waits for the
        # entries it adds instead of finding none.
        with self._missing:
            hook, self._on_miss = self._on_miss, None
            if hook is not None:
                hook()

    def _known(self, key: object) -> bool:
        with self._entries:
            return dict.__contains__(self, key) or key in self._lazy

    def __missing__(self, key: str) -> V:
        if not self._known(key):
            self._miss()
        return self._resolve(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        if self._known(key):
            return True
        self._miss()
        return self._known(key)

    def __iter__(self) -> Iterator[str]:
        self._miss()
        with self._entries:
            names = [*dict.keys(self), *(name for name in self._lazy if not dict.__contains__(self, name))]
        yield from names

    def __len__(self) -> int:
        with self._entries:
            return dict.__len__(self) + len(self._lazy)

    def keys(self) -> Any:
        return list(iter(self))

    def clone(self, on_miss: Callable[[], None] | None = None, *, lock: threading.RLock | None = None) -> LazyMap[V]:
        other: LazyMap[V] = LazyMap(on_miss, lock=lock)
        with self._entries:
            dict.update(other, dict.items(self))
            other._lazy = dict(self._lazy)
        return other
