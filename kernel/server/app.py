"""The FastAPI application: ``create_app(kernel, config)``.

The routes are a face over ``flowkernel.run.kernel.Kernel``: what they may read and do is what the CLI
may, through the same calls, so a command refused here is refused with the CLI's reason. The
kernel given here serves requests only; runs are executed by workers (``flowkernel.workers.worker``: those
of ``serve --workers N`` or ``flowkernel worker`` processes), each with its own kernel, so commands
reach them through the store exactly as from another process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from flowkernel.flowfiles.catalog import FlowCatalog
from flowkernel.run.kernel import Kernel
from flowkernel.server import agents, docs_page, execute, flows, problems, runs, stream, webui, workers
from flowkernel.server.access import AccessLog
from flowkernel.server.auth import token_check
from flowkernel.server.crosssite import CrossSiteGuard, cors_origin
from flowkernel.server.feed import Feed
from flowkernel.server.headers import SecurityHeaders
from flowkernel.server.hosts import HostCheck, allowed_host
from flowkernel.server.limits import MAX_BODY_BYTES, BodyLimit
from flowkernel.server.views import Health

PREFIX = "/api/v1"


@dataclass
class ServerConfig:
    """How ``flowkernel serve`` was asked to behave."""

    token: str | None = None  # FLOWKERNEL_API_TOKEN
    flows: list[Path] = field(default_factory=list)  # --flows folders
    cors_origins: list[str] = field(default_factory=list)  # --cors-origin; none: CORS off
    allowed_hosts: list[str] = field(default_factory=list)  # --allowed-host, besides the loopback names
    max_body_bytes: int = MAX_BODY_BYTES
    keepalive_s: float = 15.0  # SSE comment lines while a run is quiet
    poll_s: float | None = None  # how often the feed looks for commits (None: by store kind)


def store_kind(kernel: Kernel) -> str:
    location = kernel.store.location
    if location == "memory":
        return "memory"
    return "postgresql" if type(kernel.store).__name__ == "PostgresStore" else "sqlite"


def flowkernel_version() -> str:
    try:
        return version("flowkernel")
    except PackageNotFoundError:
        return "0+unknown"


def create_app(kernel: Kernel, config: ServerConfig | None = None, *, feed_store: Any = None) -> FastAPI:
    """The API over ``kernel`` (requests only). ``feed_store``: a second connection to the same store
    for the event feed (a SQLite connection sees others' commits, not its own); default: ``kernel``'s."""
    config = config or ServerConfig()
    kind = store_kind(kernel)
    feed = Feed(feed_store or kernel.store, poll_s=config.poll_s or (0.02 if kind == "sqlite" else 0.05),
                token_covers_events=kind == "sqlite")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed.watch)
            yield
            tg.cancel_scope.cancel()

    # The document and its docs page are routes of their own (docs_page): the document behind the token.
    app = FastAPI(title="flowkernel", version=flowkernel_version(), openapi_url=None, docs_url=None,
                  redoc_url=None, lifespan=lifespan,
                  description="Runs of JSON agent workflows: start, inspect, command and follow them. "
                              "Errors are application/problem+json (RFC 9457).")
    app.state.kernel = kernel
    app.state.config = config
    app.state.open_paths = frozenset({f"{PREFIX}/health"})
    app.state.feed = feed
    app.state.catalog = FlowCatalog(config.flows, kernel.registry.node_types)
    app.state.private_paths = problems.PrivatePaths(config.flows, kernel.store.location)
    problems.install(app)

    @app.get(f"{PREFIX}/health", response_model=Health, tags=["server"])
    def health() -> dict[str, Any]:
        """Liveness, the flowkernel version and the store kind; needs no token."""
        return {"status": "ok", "version": flowkernel_version(), "store": kind}

    guarded = APIRouter(prefix=PREFIX, dependencies=[Depends(token_check(config.token))])
    guarded.include_router(runs.router)
    guarded.include_router(execute.router)
    guarded.include_router(stream.router)
    guarded.include_router(agents.router)
    guarded.include_router(flows.router)
    guarded.include_router(workers.router)
    docs_page.add_document(guarded)
    app.include_router(guarded)
    docs_page.mount(app, PREFIX)

    # Each middleware added wraps the ones before it: the access log comes first, then the security
    # headers, the Host check, the body limit (before anything reads a body), CORS (so a listed origin can read a
    # refusal), and the cross-site guard of state-changing requests.
    origins = [cors_origin(o) for o in config.cors_origins]
    app.add_middleware(CrossSiteGuard, prefix=PREFIX, origins=origins)
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_credentials=False,
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type",
                                                                         "Last-Event-ID"],
                           expose_headers=["Location"])
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    # Without a token, only the server's own names are answered (DNS rebinding); with one, the token
    # protects, and the names are checked only if the operator named some.
    if config.token is None or config.allowed_hosts:
        app.add_middleware(HostCheck, allowed=[allowed_host(h) for h in config.allowed_hosts])
    app.add_middleware(SecurityHeaders)  # on every answer, the Host check's 421 and the body limit's 413 too
    app.add_middleware(AccessLog)  # outermost: every request is logged, those refused early too
    webui.mount(app)
    return app
