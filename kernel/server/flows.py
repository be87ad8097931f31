"""``/flows``: the flows in the server's ``--flows`` folders, validation of a flow document, and the
flow a run follows, or followed after a given event (``/runs/{runId}/flow``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from flowkernel.flowfiles.catalog import FlowCatalog
from flowkernel.server.document import problems
from flowkernel.server.pagination import DEFAULT_LIMIT, MAX_INT, FlowsCursor, cursors_of
from flowkernel.server.problems import ApiProblem
from flowkernel.server.runs import Limit, json_response, kernel_of
from flowkernel.server.views import FLOW_DOCUMENT, FlowInfo, Page, Valid
from starlette.exceptions import HTTPException as StarletteHTTPException

router = APIRouter(tags=["flows"])


def catalog_of(request: Request) -> FlowCatalog:
    catalog: FlowCatalog = request.app.state.catalog
    return catalog


@router.get("/flows", response_model=Page[FlowInfo], summary="The flows this server can start by name, by name",
            responses=problems(400))
def list_flows(request: Request, limit: Limit = DEFAULT_LIMIT, cursor: FlowsCursor = None) -> Response:
    cursors = cursors_of(request)
    after = cursors.decode_name("flows", cursor)
    # Keyed by name: a flow file added or removed between pages shifts no other flow.
    flows = [f for f in catalog_of(request).flows() if after is None or f.name > after]
    page = flows[:limit]
    last = page[-1].name if len(flows) > limit else None
    return json_response({"items": [{"name": f.name, "description": f.document.get("description"),
                                     "inputs": f.inputs_schema} for f in page],
                          "nextCursor": cursors.encode("flows", last)})


@router.get("/flows/{name}", response_model=dict[str, Any], summary="One flow's document", responses=problems(404))
def get_flow(request: Request, name: str) -> Response:
    if name == "validate":
        # /flows/validate is a path of its own (POST), and a concrete path wins over /flows/{name}.
        raise StarletteHTTPException(405, "GET is not a method of /api/v1/flows/validate; it takes POST",
                                     headers={"Allow": "POST"})
    flow = catalog_of(request).get(name)
    if flow is None:
        raise ApiProblem(404, f"no flow named {name!r} in this server's --flows folders", kind="unknown-flow")
    return json_response(flow.document)


@router.post("/flows/validate", summary="Validate a flow document: every problem with its JSON path",
             responses={200: {"model": Valid}, **problems(400, 422)})
def validate(request: Request, document: dict[str, Any] = Body(..., json_schema_extra=FLOW_DOCUMENT)) -> Response:
    kernel_of(request).compile(document, source="<request body>")  # raises FlowValidationError -> 422
    return json_response({"valid": True})


@router.get("/runs/{runId}/flow", response_model=dict[str, Any], responses=problems(400, 404),
            summary="The flow document a run follows (as started, or as its last `flow:updated` made it)")
def run_flow(request: Request, runId: str,
             at: Annotated[int | None, Query(ge=1, le=MAX_INT,
                                             description="the flow it followed right after event SEQ")] = None
             ) -> Response:
    """The flow as stored with the run (canonical JSON, the bytes ``flowHash`` is computed from): what a
    client needs to draw the run's graph, whether or not the flow is in a ``--flows`` folder. With
    ``at``, the flow the run followed right after that event (the one before a later ``flow:updated``)."""
    kernel = kernel_of(request)
    record = kernel.store.get_run(runId)
    flow_hash = record.flowHash
    if at is not None:
        if at > record.seq:
            raise ApiProblem(400, f"at: run {runId} has no event {at} yet",
                             errors=[("at", "beyond the run's last event")], kind="invalid-parameter")
        flow_hash = kernel.snapshot(runId, at=at).flowHash
    return Response(kernel.store.get_flow(flow_hash), media_type="application/json")
