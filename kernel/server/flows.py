"""``/flows``: the flows in the server's ``--flows`` folders, validation of a flow document, and the
flow a run was started with (``/runs/{runId}/flow``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request, Response
from flowkernel.catalog import FlowCatalog
from flowkernel.server.problems import ApiProblem
from flowkernel.server.runs import json_response, kernel_of
from flowkernel.server.views import FlowInfo

router = APIRouter(tags=["flows"])


def catalog_of(request: Request) -> FlowCatalog:
    catalog: FlowCatalog = request.app.state.catalog
    return catalog


@router.get("/flows", response_model=list[FlowInfo], summary="The flows this server can start by name")
def list_flows(request: Request) -> Response:
    return json_response([{"name": f.name, "description": f.document.get("description"),
                           "inputs": f.inputs_schema} for f in catalog_of(request).flows()])


@router.get("/flows/{name}", response_model=dict[str, Any], summary="One flow's document")
def get_flow(request: Request, name: str) -> Response:
    flow = catalog_of(request).get(name)
    if flow is None:
        raise ApiProblem(404, f"no flow named {name!r} in this server's --flows folders", kind="unknown-flow")
    return json_response(flow.document)


@router.post("/flows/validate", summary="Validate a flow document: every problem with its JSON path",
             responses={200: {"content": {"application/json": {"example": {"valid": True}}}}})
def validate(request: Request, document: Any = Body(..., description="a flow document")) -> Response:
    kernel_of(request).compile(document, source="<request body>")  # raises FlowValidationError -> 422
    return json_response({"valid": True})


@router.get("/runs/{runId}/flow", response_model=dict[str, Any],
            summary="The flow document a run follows (as started, or as its last `flow:updated` made it)")
def run_flow(request: Request, runId: str) -> Response:
    """The flow as stored with the run (canonical JSON, the bytes ``flowHash`` is computed from): what a
    client needs to draw the run's graph, whether or not the flow is in a ``--flows`` folder."""
    store = kernel_of(request).store
    return Response(store.get_flow(store.get_run(runId).flowHash), media_type="application/json")
