"""Real MCP servers for the claude.agent tests: ``tests/mcp_server.py`` over stdio, or over streamable
HTTP on 127.0.0.1 (uvicorn in a thread of the test process)."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SERVER = Path(__file__).resolve().parent / "mcp_server.py"


def stdio_server(folder: Path, **env: str) -> dict[str, Any]:
    """The ``mcpServers`` entry of the test server over stdio, writing its pid and calls to ``folder``."""
    return {"command": sys.executable, "args": [str(SERVER)], "env": {"MCP_TEST_DIR": str(folder), **env}}


def server_pids(folder: Path) -> list[int]:
    return sorted(int(p.read_text(encoding="utf-8")) for p in folder.glob("pid-*"))


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def recorded_calls(folder: Path) -> list[dict[str, Any]]:
    path = folder / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@contextmanager
def http_server(folder: Path) -> Iterator[str]:
    """The test server over streamable HTTP on a free 127.0.0.1 port; yields its URL."""
    import os

    import uvicorn

    os.environ["MCP_TEST_DIR"] = str(folder)  # read by the record tool, which runs in this process
    from tests.mcp_server import build

    app = build("http-server").streamable_http_app(host="127.0.0.1")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started:
                break
            threading.Event().wait(0.01)
        assert server.started, "the MCP HTTP server did not start"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        os.environ.pop("MCP_TEST_DIR", None)
