"""A flow file read from disk and compiled: ``read`` gives the document, the core's compiler the flow."""

from __future__ import annotations

from collections.abc import Collection, Container
from pathlib import Path

from flowkernel.core.compiler import CompiledFlow, compile_flow
from flowkernel.flowfiles.read import read_flow_document


def load_flow(path: str | Path, node_types: Container[str], *, functions: Collection[str] | None = None,
              tools: Collection[str] | None = None) -> CompiledFlow:
    """Read, validate and compile a flow file; raises FlowFileError or FlowValidationError.

    ``node_types``: the node types runs may use (``Registry.node_types``); a type not in it is an error.
    ``functions``, ``tools``: the registered names; given, a name a node uses that is not among them is
    an error too.
    """
    p = Path(path)
    document, _ = read_flow_document(p)
    return compile_flow(document, source=str(p), base_dir=p.resolve().parent, node_types=node_types,
                        functions=functions, tools=tools)
