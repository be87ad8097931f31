"""Routes that make a run go on: ``POST /runs`` (a queued run), ``/resume``, ``/retry``, and the
time travel of ``flowkernel fork`` and ``rerun``: ``/fork`` and ``/rerun`` (a new run each).

None of them executes anything in the request: the run is left to the worker pool (DESIGN §11), the
in-process workers of ``serve --workers N`` or any ``flowkernel worker`` on the same store, exactly
as ``flowkernel run --queue`` leaves it. ``?wait=S`` answers when the run stops or S seconds pass,
watching the same feed the event streams read.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Query, Request, Response
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import event_type
from flowkernel.errors import FlowValidationError
from flowkernel.server.document import problems
from flowkernel.server.feed import Feed
from flowkernel.server.problems import ApiProblem
from flowkernel.server.runs import json_response, kernel_of
from flowkernel.server.views import Accepted, CreateRun, Fork, Rerun, Resume, Retry, RunSummary

router = APIRouter(tags=["runs"])

MAX_WAIT_S = 300
# Events after which a run is no longer executing; the run row tells which status it stopped in.
_STOPS = frozenset({"flow:complete", "flow:paused", "flow:waiting"})
_MOVING = ("queued", "running")

Wait = Annotated[float | None, Query(ge=0, le=MAX_WAIT_S,
                                     description=f"answer when the run stops or after this many seconds "
                                                 f"(at most {MAX_WAIT_S})")]


def _invalid_document(exc: FlowValidationError) -> ApiProblem:
    noun = "problem" if len(exc.problems) == 1 else "problems"
    return ApiProblem(422, f"flowDocument: the flow has {len(exc.problems)} {noun}",
                      errors=[("$.flowDocument" + p.path.removeprefix("$"), p.message) for p in exc.problems],
                      kind="invalid-flow")


def _flow_of(request: Request, body: CreateRun) -> CompiledFlow:
    if (body.flow is None) == (body.flowDocument is None):
        raise ApiProblem(422, "give either `flow` (the name of a flow this server knows) or `flowDocument`",
                         errors=[("$.flow", "give flow or flowDocument, not both or neither")], kind="invalid-request")
    if body.flow is not None:
        flow: CompiledFlow | None = request.app.state.catalog.get(body.flow)
        if flow is None:
            raise ApiProblem(422, f"flow: no flow named {body.flow!r} in this server's --flows folders "
                                  "(GET /api/v1/flows lists them)", errors=[("$.flow", "unknown flow")],
                             kind="unknown-flow")
        return flow
    try:
        return kernel_of(request).compile(body.flowDocument or {}, source="<flowDocument>")
    except FlowValidationError as exc:
        raise _invalid_document(exc) from None


async def wait_until_stopped(request: Request, run_id: str, wait_s: float) -> None:
    """Return when the run is neither queued nor running, or after ``wait_s`` seconds."""
    kernel = kernel_of(request)
    feed: Feed = request.app.state.feed
    record = await anyio.to_thread.run_sync(kernel.store.get_run, run_id)
    if record.status not in _MOVING:
        return
    with anyio.move_on_after(wait_s):
        # The feed wakes this on each new event (no polling here); keepalives let the deadline through.
        async for body in feed.events(run_id, record.seq, keepalive_s=min(wait_s, 15.0) or 1.0):
            if body is not None and event_type(body) in _STOPS:
                record = await anyio.to_thread.run_sync(kernel.store.get_run, run_id)
                if record.status not in _MOVING:
                    return


@router.post("/runs", status_code=201, response_model=RunSummary, summary="Start a run (queued for a worker)",
             responses={200: {"model": RunSummary, "description": "the run this idempotencyKey made before"},
                        201: {"headers": {"Location": {"description": "the run's URL", "schema": {"type": "string"}}}},
                        **problems(400, 422)})
async def create_run(request: Request, body: CreateRun, wait: Wait = None) -> Response:
    kernel = kernel_of(request)
    flow = _flow_of(request, body)
    run_id, new = await anyio.to_thread.run_sync(kernel.enqueue_once, flow, body.input, body.idempotencyKey)
    if wait:
        await wait_until_stopped(request, run_id, wait)
    summary = await anyio.to_thread.run_sync(kernel.summary, run_id)
    return json_response(summary, status=201 if new else 200,
                         headers={"Location": f"{request.url.path}/{run_id}"})


# 409 also for a run a `flowkernel run` process started (not the workers'); 422 a flowDocument it cannot take.
_CONTINUE_RESPONSES = problems(400, 404, 409, 422)


async def _to_pool(request: Request, run_id: str, kind: str, body: Resume | Retry | None) -> Response:
    """Resume or retry ``run_id`` through the workers: 202 with the seq of its accepting ``command:received``."""
    message = body.message if body is not None else None
    if kind == "resume" and message is None:
        message = "continue"
    try:
        accepted = await kernel_of(request).continue_in_pool(
            run_id, kind, message=message, budget=body.budget if isinstance(body, Resume) else None,
            flow=body.flowDocument if body is not None else None)
    except FlowValidationError as exc:
        raise _invalid_document(exc) from None
    return json_response({"accepted": True, "seq": accepted.seq}, status=202)


@router.post("/runs/{runId}/resume", status_code=202, response_model=Accepted, responses=_CONTINUE_RESPONSES,
             summary="Continue a paused, failed or interrupted run (a worker executes it)")
async def resume(request: Request, runId: str, body: Resume | None = None) -> Response:
    return await _to_pool(request, runId, "resume", body)


@router.post("/runs/{runId}/retry", status_code=202, response_model=Accepted, responses=_CONTINUE_RESPONSES,
             summary="Run the failed nodes of a failed run again (a worker executes it)")
async def retry(request: Request, runId: str, body: Retry | None = None) -> Response:
    return await _to_pool(request, runId, "retry", body)


# -- time travel ------------------------------------------------------------------------------------

_NEW_RUN_RESPONSES: dict[int | str, dict[str, Any]] = {
    201: {"headers": {"Location": {"description": "the new run's URL", "schema": {"type": "string"}}}},
    **problems(400, 404, 422)}


def _created(request: Request, run_id: str) -> Response:
    summary = kernel_of(request).summary(run_id)
    location = request.url.path.rsplit("/", 2)[0] + f"/{run_id}"
    return json_response(summary, status=201, headers={"Location": location})


@router.post("/runs/{runId}/fork", status_code=201, response_model=RunSummary, responses=_NEW_RUN_RESPONSES,
             summary="Start a new run from the snapshot after event `at` (a worker executes it)")
async def fork(request: Request, runId: str, body: Fork) -> Response:
    """As ``flowkernel fork RUN --at SEQ``: the new run holds this run's history up to ``at`` (agent
    conversations as they stood then), records ``forkedFrom`` and ``forkedAt``, and goes on from there."""
    from flowkernel.run.timetravel import queue_fork

    kernel = kernel_of(request)
    fork_id = await anyio.to_thread.run_sync(lambda: queue_fork(kernel, runId, body.at, input=body.input))
    return await anyio.to_thread.run_sync(_created, request, fork_id)


@router.post("/runs/{runId}/rerun", status_code=201, response_model=RunSummary, responses=_NEW_RUN_RESPONSES,
             summary="Execute the run again from its own recording (a worker executes it)")
async def rerun(request: Request, runId: str, body: Rerun) -> Response:
    """As ``flowkernel rerun RUN``: the run's flow and input, its model calls and replies served from this
    run's recording. The new run's ``flow:complete`` carries ``rerun: {of, matches, divergence}``."""
    from flowkernel.run.timetravel import create_rerun

    rerun_id = await anyio.to_thread.run_sync(create_rerun, kernel_of(request), runId)
    return await anyio.to_thread.run_sync(_created, request, rerun_id)
