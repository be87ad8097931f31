"""``/workers``: the live workers of the store, as ``flowkernel workers --json`` lists them (DESIGN §11)."""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Request, Response
from flowkernel.run.pool import live_workers
from flowkernel.server.runs import json_response, kernel_of
from flowkernel.server.views import Workers

router = APIRouter(tags=["workers"])


@router.get("/workers", response_model=Workers, summary="The live workers: host, pid, heartbeat, runs held")
def list_workers(request: Request) -> Response:
    """Every live worker of the store (those of ``serve --workers N`` and ``flowkernel worker``
    processes), with every field, as ``flowkernel workers --json`` prints each. Queued runs:
    ``GET /runs?status=queued&order=oldest``."""
    workers = live_workers(kernel_of(request))
    return json_response({"items": [msgspec.structs.asdict(w) for w in workers]})
