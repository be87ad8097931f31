"""``serve``: the HTTP API (DESIGN §10) on uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import Any

from flowkernel.cli.session import EXIT_INVALID, EXIT_OK, add_db

DEFAULT_PORT = 8765


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("serve", help="serve the HTTP API (needs the `server` extra)")
    sp.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1; any other needs FLOWKERNEL_API_TOKEN)")
    sp.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    sp.add_argument("--flows", action="append", default=[], metavar="DIR",
                    help="a folder of flow files that POST /api/v1/runs may start by name (repeatable)")
    sp.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                    help="allow browser pages from ORIGIN (e.g. http://localhost:5173) to call the API (repeatable; "
                         "default: none)")
    add_db(sp)
    sp.set_defaults(handler=cmd_serve)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def cmd_serve(args: argparse.Namespace) -> int:
    token = os.environ.get("FLOWKERNEL_API_TOKEN") or None
    if not is_loopback(args.host) and token is None:
        print(f"flowkernel: serve --host {args.host}: listening beyond this machine needs a token; set "
              "FLOWKERNEL_API_TOKEN (clients then send `Authorization: Bearer <token>`), or use --host 127.0.0.1",
              file=sys.stderr)
        return EXIT_INVALID
    try:
        import uvicorn
        from flowkernel.server import ServerConfig, create_app
    except ImportError as exc:
        print(f"flowkernel: serve needs the server extra (pip install 'flowkernel[server]'): {exc}", file=sys.stderr)
        return EXIT_INVALID
    from pathlib import Path

    from flowkernel.api import Kernel
    from flowkernel.store.open import open_store

    for folder in args.flows:
        if not Path(folder).is_dir():
            print(f"flowkernel: --flows {folder}: no such folder", file=sys.stderr)
            return EXIT_INVALID
    store = open_store(args.db)
    # The event feed reads through a connection of its own: SQLite tells a connection about the
    # commits of the others, not its own.
    feed_store = store if store.location == "memory" else open_store(args.db)
    kernel = Kernel(store)
    config = ServerConfig(token=token, flows=[Path(f) for f in args.flows], cors_origins=list(args.cors_origin))
    app = create_app(kernel, config, feed_store=feed_store)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    print(f"flowkernel: serving http://{args.host}:{args.port}/api/v1 on {store.location}", file=sys.stderr)
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again for the handler it found:
    # a stop asked for is a clean exit, so that handler takes note and the command returns 0.
    import signal

    stops: list[int] = []
    previous = {sig: signal.signal(sig, lambda number, frame: stops.append(number))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        kernel.close()
        if feed_store is not store:
            feed_store.close()
    return EXIT_OK
