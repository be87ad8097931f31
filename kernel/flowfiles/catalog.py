"""The flows in a set of folders, by name: what ``flowkernel serve --flows DIR`` offers to start.

Each ``*.json`` / ``*.yaml`` / ``*.yml`` file directly in a folder is a candidate; a file that does
not validate is left out of the catalogue (with the reason, for the server's log) rather than hide
the others. Files are read again only when they change.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass
from pathlib import Path

from flowkernel.core.compiler import CompiledFlow
from flowkernel.errors import FlowkernelError
from flowkernel.flowfiles.load import load_flow

SUFFIXES = (".json", ".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class _Entry:
    mtime_ns: int
    flow: CompiledFlow | None
    problem: str | None


class FlowCatalog:
    def __init__(self, folders: Iterable[str | Path], node_types: Container[str]) -> None:
        self.folders = [Path(f) for f in folders]
        self.node_types = node_types
        self._files: dict[Path, _Entry] = {}

    def _scan(self) -> dict[str, CompiledFlow]:
        found: dict[str, CompiledFlow] = {}
        for folder in self.folders:
            for path in sorted(folder.iterdir()) if folder.is_dir() else ():
                if path.suffix not in SUFFIXES or not path.is_file():
                    continue
                entry = self._load(path)
                # The first folder given wins a name used twice, as on a search path.
                if entry.flow is not None and entry.flow.name not in found:
                    found[entry.flow.name] = entry.flow
        return found

    def _load(self, path: Path) -> _Entry:
        mtime = path.stat().st_mtime_ns
        entry = self._files.get(path)
        if entry is None or entry.mtime_ns != mtime:
            try:
                entry = _Entry(mtime, load_flow(path, self.node_types), None)
            except FlowkernelError as exc:
                entry = _Entry(mtime, None, str(exc))
            self._files[path] = entry
        return entry

    def flows(self) -> list[CompiledFlow]:
        """The valid flows, by name."""
        return sorted(self._scan().values(), key=lambda f: f.name)

    def get(self, name: str) -> CompiledFlow | None:
        return self._scan().get(name)

    def problems(self) -> dict[str, str]:
        """Files left out, and why."""
        self._scan()
        return {str(p): e.problem for p, e in self._files.items() if e.problem is not None}
