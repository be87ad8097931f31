"""The event stream sends what was stored together in one write: a page of history, or the events of
one commit, go to a client as one HTTP chunk of frames, not one chunk per event. With a hundred
clients on a run, the server's work per event is what decides how soon the last of them has it
(scripts/bench/api.py measures it).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from urllib.parse import urlsplit

import anyio
from flowkernel.run.kernel import Kernel

from tests.server_support import Live, serving


def chunks(url: str, path: str) -> list[bytes]:
    """The chunks of a chunked HTTP/1.1 response body, as the server wrote them, until the last one."""
    where = urlsplit(url)
    with socket.create_connection((where.hostname or "127.0.0.1", where.port or 80), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {where.netloc}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n", 1)[0] and b"transfer-encoding: chunked" in head.lower(), head
    out = []
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(body[:size])
        body = body[size + 2:]
    return out


def test_a_runs_stored_events_reach_a_stream_client_in_one_write(tmp_path: Path) -> None:
    with serving(str(tmp_path / "runs.db")) as live:
        run_id = _chain_run(live, 20)
        stored = live.kernel.events(run_id)
        got = chunks(live.url, f"/api/v1/runs/{run_id}/stream")
    assert len(stored) > 40
    assert len(got) == 1, f"{len(got)} writes for {len(stored)} events"
    frames = got[0].decode().split("\n\n")[:-1]
    assert [int(f.split("\n")[0].removeprefix("id: ")) for f in frames] == [e.seq for e in stored]
    assert json.loads(frames[-1].split("data: ", 1)[1])["type"] == "flow:complete"


def _chain_run(live: Live, n: int) -> str:
    kernel: Kernel = live.kernel
    flow = kernel.compile({"name": "chain", "nodes": [{"id": f"n{i}", "type": "noop", "input": {}} for i in range(n)],
                           "edges": [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(n - 1)]})
    return anyio.run(kernel.run, flow, {}).runId
