"""A real uvicorn server on a loopback port for the HTTP tests, and a small SSE reader."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio.from_thread
import httpx
import uvicorn
from flowkernel.run.kernel import Kernel
from flowkernel.server import ServerConfig, create_app
from flowkernel.store.open import open_store
from flowkernel.workers.worker import Worker


@dataclass
class Live:
    """A server listening on 127.0.0.1; ``kernel`` is a separate client of the same store (as a worker
    or a CLI process would be)."""

    url: str
    kernel: Kernel
    db: str
    headers: dict[str, str] = field(default_factory=dict)

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=30, **kw)


@contextmanager
def pool_worker(db: str, concurrency: int = 2, **kernel_kw: Any) -> Iterator[Worker]:
    """A ``flowkernel.workers.worker.Worker`` (what ``serve --workers N`` runs) with its own kernel and event
    loop in a thread; stopped (handing its runs over) on exit."""
    worker = Worker(Kernel(open_store(db), **kernel_kw), concurrency=concurrency, grace_s=5, poll_s=0.05)
    with anyio.from_thread.start_blocking_portal() as portal:
        done = portal.start_task_soon(worker.run)
        try:
            yield worker
        finally:
            portal.call(worker.stop)
            done.result(timeout=30)
            worker.kernel.close()


@contextmanager
def serving(db: str, config: ServerConfig | None = None, **kernel_kw: Any) -> Iterator[Live]:
    """``flowkernel serve`` as the CLI builds it, in a thread: its own store connections for requests
    and for the feed, on an ephemeral port."""
    server_kernel = Kernel(open_store(db), **kernel_kw)
    feed_store = open_store(db)
    app = create_app(server_kernel, config or ServerConfig(keepalive_s=0.5), feed_store=feed_store)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    other = Kernel(open_store(db), **kernel_kw)
    try:
        yield Live(url=f"http://127.0.0.1:{port}", kernel=other, db=db)
    finally:
        server.should_exit = True
        thread.join(15)
        other.close()
        server_kernel.close()
        feed_store.close()


@dataclass
class Frame:
    id: int | None
    event: str | None
    data: str | None
    comment: str | None = None


def sse_frames(response: httpx.Response) -> Iterator[Frame]:
    """Frames of a text/event-stream response as they arrive (comments included)."""
    fields: dict[str, str] = {}
    comment: str | None = None
    for line in response.iter_lines():
        if line == "":
            if fields or comment is not None:
                yield Frame(int(fields["id"]) if "id" in fields else None, fields.get("event"), fields.get("data"),
                            comment)
            fields, comment = {}, None
        elif line.startswith(":"):
            comment = line[1:].strip()
        else:
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


def wait_for(condition: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``condition()`` until it is truthy (returned) or the deadline passes (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
