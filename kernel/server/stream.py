"""``GET /runs/{runId}/stream``: Server-Sent Events from the durable log.

Every stored event after ``Last-Event-ID`` (or ``?after=``) as ``id: <seq>`` / ``event: <type>`` /
``data: <the event's JSON>``, then each new event once it is committed, until ``flow:complete``;
``: keepalive`` while the run is quiet. A client that reconnects, however much later, misses nothing.

A completed or aborted run has nothing more to come (what follows its ``flow:complete`` is refused
commands at most): its stream ends with the last stored event, and one asked for after that event
is a 204 at once, which tells an ``EventSource`` to stop reconnecting (it reconnects that way after
every stream that ends). A failed run may still be retried or resumed, so, like a waiting or paused
one, its stream stays open after its last event and carries on if it does.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from flowkernel.core.events import event_type
from flowkernel.server.document import problems
from flowkernel.server.feed import Feed
from flowkernel.server.pagination import MAX_INT
from flowkernel.server.problems import ApiProblem
from flowkernel.server.runs import kernel_of

router = APIRouter(tags=["runs"])

KEEPALIVE = b": keepalive\n\n"
FINISHED = ("completed", "aborted")  # statuses no command continues
SEQ_PATTERN = r"^\s*[0-9]{1,16}\s*$"
_SEQ = re.compile(r"[0-9]{1,16}")


def frame(seq: int, body: bytes) -> bytes:
    kind = (event_type(body) or "").encode()
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, kind, body)


@router.get("/runs/{runId}/stream", summary="Follow a run's events as Server-Sent Events",
            response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                             "description": "id: <seq>, event: <type>, data: <event JSON>, per event"},
                       204: {"description": "the run is completed or aborted and has no event after the one "
                                            "asked for: nothing more will come"},
                       **problems(400, 404)})
async def stream(request: Request, runId: str,
                 after: Annotated[int | None, Query(ge=0, le=MAX_INT, description="start after this seq")] = None,
                 last_event_id: Annotated[str | None, Header(
                     alias="Last-Event-ID", pattern=SEQ_PATTERN,
                     description="the `id:` of the last event received (a browser's EventSource sends it when it "
                                 "reconnects); wins over `after`")] = None) -> Response:
    kernel = kernel_of(request)
    record = await anyio.to_thread.run_sync(kernel.store.get_run, runId)  # 404 before the stream starts
    start = after or 0
    if last_event_id is not None:
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
        if _SEQ.fullmatch(last_event_id.strip()) is None or int(last_event_id) > MAX_INT:
            raise ApiProblem(400, "Last-Event-ID: must be the seq of an event (an `id:` this stream sent)",
                             errors=[("Last-Event-ID", "not a seq")], kind="invalid-parameter")
        start = int(last_event_id)
    until = None
    if record.status in FINISHED:
        if start >= record.seq:
            return Response(status_code=204, headers={"Cache-Control": "no-cache"})
        until = record.seq
    feed: Feed = request.app.state.feed
    keepalive_s: float = request.app.state.config.keepalive_s

    async def frames() -> AsyncIterator[bytes]:
        seq = start
        # A batch (the events of one commit, a page of history) goes out in one write: with many
        # clients on a run, the server's work per event is what bounds how soon the last one has it.
        async for batch in feed.batches(runId, start, keepalive_s=keepalive_s, until=until):
            if batch is None:
                yield KEEPALIVE
                continue
            chunk = []
            for body in batch:
                seq += 1
                chunk.append(frame(seq, body))
            yield b"".join(chunk)

    return StreamingResponse(frames(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
