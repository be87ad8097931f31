"""The flow cache: flows compiled once per process, by hash (those a run stored, those loaded or
compiled here), and which flow a run follows now."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from flowkernel.core.compiler import CompiledFlow, compile_flow
from flowkernel.core.reducer import FlowLookup
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.flowfiles.load import load_flow
from flowkernel.plugins.registry import Registry
from flowkernel.run.gc_pause import collector_paused
from flowkernel.store.base import RunRecord, Store


class FlowCache:
    """Compiled flows by hash, with the registry whose names they may use."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self._flows: dict[str, CompiledFlow] = {}

    def remember(self, flow: CompiledFlow) -> None:
        """Keep ``flow`` (just stored, or about to be) under its hash."""
        self._flows[flow.hash] = flow

    def load(self, path: str | Path) -> CompiledFlow:
        """Read and validate a flow file (every problem at once, with JSON paths)."""
        reg = self.registry
        return load_flow(path, node_types=reg.node_types, functions=reg.functions, tools=reg.tools)

    def compile(self, document: dict[str, Any], source: str = "<flow>", base_dir: Path | None = None,
                *, trusted: bool = False, stored: tuple[str, str] | None = None) -> CompiledFlow:
        """Validate and compile a flow document (every problem at once, with JSON paths)."""
        reg = self.registry
        return compile_flow(document, source=source, base_dir=base_dir, node_types=reg.node_types,
                            trusted=trusted, functions=reg.functions, tools=reg.tools, stored=stored)

    def of_run(self, run_id: str) -> CompiledFlow:
        """The flow the run follows now (the last one a ``flow:updated`` switched it to, if any)."""
        record = self.store.get_run(run_id)
        return self.stored(record.flowHash, record)

    def message_takers(self, flow: CompiledFlow) -> Callable[[str], bool]:
        """Whether each node of ``flow`` (by id) reads ``send`` messages, as this kernel's registry says."""
        def takes(node_id: str) -> bool:
            node = flow.nodes[node_id]
            return self.registry.takes_messages(node.type, node.raw_input)
        return takes

    def stored(self, flow_hash: str, record: RunRecord) -> CompiledFlow:
        """The flow stored under ``flow_hash``, compiled; ``record``: the run it is for (where its file is)."""
        cached = self._flows.get(flow_hash)
        if cached is not None:
            return cached
        text = self.store.get_flow(flow_hash)
        source = record.flowSource or f"<flow {record.flowName}>"
        base = Path(record.flowSource).parent if record.flowSource else None
        # The hash matched when it was stored, and it was validated then: compile without re-checking,
        # and without computing again the canonical text and hash it was stored under.
        with collector_paused():
            flow = self.compile(msgspec.json.decode(text), source=source, base_dir=base, trusted=True,
                                stored=(text, flow_hash))
        self._flows[flow_hash] = flow
        return flow

    def lookup(self, record: RunRecord) -> FlowLookup:
        """The lookup a fold of ``record``'s run switches flows with (``flow:updated``)."""
        return lambda flow_hash: self.stored(flow_hash, record)

    def follow(self, snap: RunSnapshot, record: RunRecord) -> CompiledFlow:
        """The flow ``snap`` follows; the run row is made to name it too, if it does not yet (right
        after a ``flow:updated``, or when a crash came between that commit and this)."""
        flow = self.stored(snap.flowHash, record)
        if record.flowHash != snap.flowHash:
            source = str(Path(flow.source).resolve()) if flow.base_dir else record.flowSource
            self.store.update_run_flow(record.runId, flow.hash, flow.name, flow.canonical, source)
        return flow
