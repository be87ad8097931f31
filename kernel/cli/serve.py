"""``serve``: the HTTP API (DESIGN §10) on uvicorn."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from flowkernel.cli.arguments import add_executor_options, non_negative_int
from flowkernel.cli.session import EXIT_INVALID, EXIT_OK, add_db

DEFAULT_PORT = 8765
DEFAULT_WORKERS = 4


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("serve", help="serve the HTTP API (needs the `server` extra)")
    sp.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1; any other needs FLOWKERNEL_API_TOKEN)")
    sp.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    sp.add_argument("--flows", action="append", default=[], metavar="DIR",
                    help="a folder of flow files that POST /api/v1/runs may start by name (repeatable)")
    sp.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                    help="allow browser pages from ORIGIN (e.g. http://localhost:5173) to call the API, commands "
                         "included (repeatable; default: none)")
    sp.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="also answer requests whose Host is NAME (e.g. the name a reverse proxy forwards; "
                         "repeatable; default: only localhost and loopback addresses, or any name with a token)")
    sp.add_argument("--workers", type=non_negative_int, default=DEFAULT_WORKERS, metavar="N",
                    help=f"runs this process executes at once, as `flowkernel worker --concurrency N` would "
                         f"(default {DEFAULT_WORKERS}; 0: serve only, separate `flowkernel worker` processes execute)")
    add_executor_options(sp, stopped_by="SIGTERM or Ctrl-C")
    add_db(sp)
    sp.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    token = os.environ.get("FLOWKERNEL_API_TOKEN") or None
    try:
        import anyio
        import uvicorn
        from flowkernel.server import ServerConfig, create_app
        from flowkernel.server.crosssite import cors_origin
        from flowkernel.server.hosts import allowed_host, is_loopback
    except ImportError as exc:
        print(f"flowkernel: serve needs the server extra (pip install 'flowkernel[server]'): {exc}", file=sys.stderr)
        return EXIT_INVALID
    if not is_loopback(args.host) and token is None:
        print(f"flowkernel: serve --host {args.host}: listening beyond this machine needs a token; set "
              "FLOWKERNEL_API_TOKEN (clients then send `Authorization: Bearer <token>`), or use --host 127.0.0.1",
              file=sys.stderr)
        return EXIT_INVALID
    for option, values, check in (("--allowed-host", args.allowed_host, allowed_host),
                                  ("--cors-origin", args.cors_origin, cors_origin)):
        for value in values:
            try:
                check(value)
            except ValueError as exc:
                print(f"flowkernel: serve {option} {value}: {exc}", file=sys.stderr)
                return EXIT_INVALID
    from pathlib import Path

    from flowkernel.core.services import RunServices
    from flowkernel.history.agent_runs import AgentRunBackfill
    from flowkernel.plugins.registry import default_registry
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.open import open_store

    for folder in args.flows:
        if not Path(folder).is_dir():
            print(f"flowkernel: --flows {folder}: no such folder", file=sys.stderr)
            return EXIT_INVALID
    store = open_store(args.db, create=True, backfill=AgentRunBackfill(default_registry()))
    # The event feed reads through a connection of its own: SQLite tells a connection about the
    # commits of the others, not its own.
    feed_store = store if store.location == "memory" else open_store(args.db)
    kernel = Kernel(store)
    worker = None
    if args.workers:
        # The workers are `flowkernel worker`'s own, with a kernel (and store connection) of their own:
        # to the API they are one more process executing runs.
        from flowkernel.workers.worker import Worker

        services = RunServices()
        if args.fixtures:
            from flowkernel.fixtures.library import FixtureLibrary

            services = RunServices(query_fn=FixtureLibrary(args.fixtures), fixtures=args.fixtures)
        worker_store = store if store.location == "memory" else open_store(args.db)
        worker = Worker(Kernel(worker_store, services=services), concurrency=args.workers, grace_s=args.grace_s)
    config = ServerConfig(token=token, flows=[Path(f) for f in args.flows], cors_origins=list(args.cors_origin),
                          allowed_hosts=list(args.allowed_host))
    app = create_app(kernel, config, feed_store=feed_store)
    if worker is not None:
        worker.kernel.on_commit(app.state.feed.nudge)  # followers get this process's commits at once, not at a poll
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    from flowkernel.redaction import install_log_redaction

    install_log_redaction()  # uvicorn's handlers, which its Config has just made
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again for the handler it found:
    # a stop asked for is a clean exit, so that handler takes note and the command returns 0.
    import signal

    stops: list[int] = []
    previous = {sig: signal.signal(sig, lambda number, frame: stops.append(number))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        anyio.run(_serve, server, worker, store.location)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if worker is not None and worker.kernel.store is not store:
            worker.kernel.close()
        kernel.close()
        if feed_store is not store:
            feed_store.close()
    return EXIT_OK


async def _serve(server: Any, worker: Any, location: str) -> None:
    """The API and the workers in one event loop. A stop (SIGTERM, Ctrl-C) ends the API first, then
    the workers hand their runs over: node runs in flight get the grace time, what remains is paused
    at a step boundary and left to the next worker (or the next `serve`), which resumes it."""
    import anyio

    async with anyio.create_task_group() as tg:
        if worker is not None:
            await tg.start(worker.run)
        served = anyio.Event()

        async def api() -> None:
            await server.serve()
            served.set()

        tg.start_soon(api)
        while not (server.started or served.is_set()):  # uvicorn has no start-up callback
            await anyio.sleep(0.01)
        if server.started:
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            base = f"http://{f'[{host}]' if ':' in host else host}:{port}"  # an IPv6 address goes in brackets
            where = f"{worker.concurrency} run(s) at once" if worker is not None else "no workers: serving only"
            print(f"flowkernel: serving {base}/api/v1 on {location} ({where})\n"
                  f"flowkernel: web UI at {base}/", file=sys.stderr, flush=True)
        await served.wait()
        if worker is not None:
            print(f"flowkernel serve: stopping; handing over {len(worker.running)} run(s) "
                  f"(grace {worker.grace_s:g} s)", file=sys.stderr, flush=True)
            worker.stop()
            await worker.wait_stopped()
        tg.cancel_scope.cancel()
