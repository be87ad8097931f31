"""``/runs``: list, detail, events, and the commands of DESIGN §6."""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Query, Request, Response
from flowkernel.core.commands import Command
from flowkernel.core.events import Event
from flowkernel.run.kernel import Kernel
from flowkernel.server.document import problems
from flowkernel.server.pagination import (
    DEFAULT_LIMIT,
    MAX_INT,
    MAX_LIMIT,
    EventsCursor,
    RunsCursor,
    cursors_of,
)
from flowkernel.server.problems import ApiProblem
from flowkernel.server.views import Abort, Accepted, Page, Pause, Reply, RunDetail, RunSummary, Send
from flowkernel.server.views import Event as EventView

router = APIRouter(tags=["runs"])

# As summaries show them: "interrupted" is a run stored as running that no process executes (its
# executor died); "running" then lists only those executing (Kernel.run_records, as `flowkernel runs`).
STATUSES = ("queued", "running", "interrupted", "paused", "waiting", "completed", "failed", "aborted")
EVENT_TYPES = frozenset(str(t.__struct_config__.tag) for t in typing.get_args(Event))
_ONE_TYPE = "(" + "|".join(re.escape(t) for t in sorted(EVENT_TYPES)) + ")"
TYPES_PATTERN = f"^{_ONE_TYPE}(,{_ONE_TYPE})*$"  # what `types` takes, exactly as list_events checks it
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"items per page (at most {MAX_LIMIT})")]
_encode = msgspec.json.Encoder().encode


def kernel_of(request: Request) -> Kernel:
    kernel: Kernel = request.app.state.kernel
    return kernel


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encode(value), status_code=status, media_type="application/json", headers=headers)


def _page_body(items: list[bytes], cursor: str | None) -> bytes:
    """A page whose items are already JSON (stored events): spliced, not decoded and encoded again."""
    return b'{"items":[' + b",".join(items) + b'],"nextCursor":' + _encode(cursor) + b"}"


ORDERS = ("newest", "oldest")


@router.get("/runs", response_model=Page[RunSummary], responses=problems(400),
            summary="List runs, newest first (or oldest first: the queue as workers take it)")
def list_runs(request: Request, status: Annotated[str | None, Query(json_schema_extra={"enum": list(STATUSES)})] = None,
              flow: str | None = None, parentRunId: str | None = None,
              runIdPrefix: Annotated[str | None, Query(min_length=1, max_length=100,
                                                       description="only runs whose id starts with this")] = None,
              error: Annotated[str | None, Query(min_length=1, max_length=500,
                                                 description="only runs whose error contains this text, "
                                                             "whatever the case")] = None,
              order: Annotated[str, Query(json_schema_extra={"enum": list(ORDERS)},
                                          description="`newest` first (default) or `oldest` first: "
                                                      "`status=queued&order=oldest` is the queue in the order "
                                                      "workers claim it")] = "newest",
              limit: Limit = DEFAULT_LIMIT, cursor: RunsCursor = None) -> Response:
    if status is not None and status not in STATUSES:
        raise ApiProblem(400, f"status: {status!r} is not a run status; use one of {', '.join(STATUSES)}",
                         errors=[("status", "unknown status")], kind="invalid-parameter")
    if order not in ORDERS:
        raise ApiProblem(400, f"order: {order!r} is not an order; use newest or oldest",
                         errors=[("order", "unknown order")], kind="invalid-parameter")
    cursors = cursors_of(request)
    # A cursor keeps its list's order: one of a newest-first list is refused by an oldest-first one.
    kind = "runs" if order == "newest" else "runs-oldest"
    items, last = kernel_of(request).run_page(status=status, flow=flow, parent=parentRunId,
                                              before=cursors.decode(kind, cursor), limit=limit,
                                              oldest=order == "oldest", id_prefix=runIdPrefix, error=error)
    return json_response({"items": items, "nextCursor": cursors.encode(kind, last)})


@router.get("/runs/{runId}", response_model=RunDetail, summary="A run: summary, snapshot and child runs",
            responses=problems(400, 404))
def get_run(request: Request, runId: str,
            at: Annotated[int | None, Query(ge=1, le=MAX_INT, description="the snapshot right after event SEQ")] = None
            ) -> Response:
    kernel = kernel_of(request)
    if at is not None and at > kernel.store.get_run(runId).seq:
        raise ApiProblem(400, f"at: run {runId} has no event {at} yet", errors=[("at", "beyond the run's last event")],
                         kind="invalid-parameter")
    return json_response(kernel.detail(runId, at=at))


@router.get("/runs/{runId}/events", response_model=Page[EventView], summary="A run's stored events, in order",
            responses=problems(400, 404))
def list_events(request: Request, runId: str,
                after: Annotated[int, Query(ge=0, le=MAX_INT, description="only events after this seq")] = 0,
                types: Annotated[str | None, Query(description="comma-separated event types",
                                                   json_schema_extra={"pattern": TYPES_PATTERN})] = None,
                limit: Limit = DEFAULT_LIMIT, cursor: EventsCursor = None) -> Response:
    wanted = None
    if types is not None:
        given = types.split(",")
        unknown = sorted(set(given) - EVENT_TYPES)
        if unknown:
            raise ApiProblem(400, f"types: unknown event type {', '.join(repr(t) for t in unknown)}; give event "
                                  "types separated by commas (flow:start,node:complete)",
                             errors=[("types", "unknown event type")], kind="invalid-parameter")
        wanted = frozenset(given)
    cursors = cursors_of(request)
    start = cursors.decode("events", cursor)
    bodies, last = kernel_of(request).event_page(runId, after=after if start is None else start, types=wanted,
                                                 limit=limit)
    return Response(_page_body(bodies, cursors.encode("events", last)), media_type="application/json")


# -- commands -----------------------------------------------------------------------------------

async def _command(request: Request, run_id: str, cmd: Command) -> Response:
    # Judged where the run is, refusals recorded in its log (Kernel.accept, as the CLI's commands); a reply
    # or send that lands in a waiting run of the worker pool hands it back to the pool.
    accepted = await kernel_of(request).accept(run_id, cmd)
    return json_response({"accepted": True, "seq": accepted.seq}, status=202)


# A command is refused because of the run's state (409) or because it is wrong (422); either is recorded.
_COMMAND_RESPONSES: dict[int | str, dict[str, Any]] = {202: {"model": Accepted}, **problems(400, 404, 409, 422)}


@router.post("/runs/{runId}/send", status_code=202, response_model=Accepted, responses=_COMMAND_RESPONSES,
             summary="Send a message to a live node run")
async def send(request: Request, runId: str, body: Send) -> Response:
    return await _command(request, runId, Command(kind="send", target=body.to, content=body.message))


@router.post("/runs/{runId}/reply", status_code=202, response_model=Accepted, responses=_COMMAND_RESPONSES,
             summary="Answer a waiting node run")
async def reply(request: Request, runId: str, body: Reply) -> Response:
    return await _command(request, runId, Command(kind="reply", target=body.to, content=body.content))


@router.post("/runs/{runId}/pause", status_code=202, response_model=Accepted, responses=_COMMAND_RESPONSES,
             summary="Pause a running run")
async def pause(request: Request, runId: str, body: Pause | None = None) -> Response:
    return await _command(request, runId, Command(kind="pause", reason=body.reason if body else None))


@router.post("/runs/{runId}/abort", status_code=202, response_model=Accepted, responses=_COMMAND_RESPONSES,
             summary="Abort a run for good")
async def abort(request: Request, runId: str, body: Abort | None = None) -> Response:
    return await _command(request, runId, Command(kind="abort", reason=body.reason if body else None))


