"""A small MCP server for the tests (``mcp``'s own server API).

``python tests/mcp_server.py`` serves it over stdio; ``build()`` gives the server for streamable HTTP.
With ``MCP_TEST_DIR`` set, the process writes its pid to ``pid-<pid>`` there when it starts, and
``record`` appends each call (text and idempotency key) to ``calls.jsonl`` there.
``MCP_TEST_FAIL_AT_START=1`` makes it die before it answers anything.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer


def _folder() -> Path | None:
    folder = os.environ.get("MCP_TEST_DIR")
    return Path(folder) if folder else None


def build(name: str = "test-server") -> MCPServer:
    server = MCPServer(name, log_level="WARNING")

    @server.tool(description="Read a file of the test's fake file system.")
    def read(path: str) -> str:
        return {"a.txt": "alpha", "b.txt": "bravo"}.get(path, f"no such file: {path}")

    @server.tool(description="Record a side effect once per idempotency key; says whether it was new.")
    async def record(text: str, ctx: Context) -> str:
        key = (ctx.request_context.meta or {}).get("idempotencyKey")
        folder = _folder()
        if folder is not None:
            with (folder / "calls.jsonl").open("a", encoding="utf-8") as f:
                f.write(json.dumps({"text": text, "key": key}) + "\n")
        return f"recorded {text} with key {key}"

    @server.tool(description="Fail as a tool (the model is told).")
    def refuse(reason: str) -> str:
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError(f"refused: {reason}")

    @server.tool(description="Never answers the first time it is called (with MCP_TEST_DIR: once per folder).")
    async def hang(ctx: Context) -> str:
        folder = _folder()
        key = (ctx.request_context.meta or {}).get("idempotencyKey")
        if folder is not None and (folder / "hanging").exists():
            return f"answered the second time, key {key}"
        if folder is not None:
            (folder / "hanging").write_text(str(key), encoding="utf-8")
        await anyio.sleep(3600)
        return "woke"

    @server.tool(description="The server process dies during the call.")
    def crash() -> str:
        print("about to die: crash was called", file=sys.stderr, flush=True)
        os._exit(3)

    return server


def main() -> None:
    folder = _folder()
    if folder is not None:
        (folder / f"pid-{os.getpid()}").write_text(str(os.getpid()), encoding="utf-8")
    print(f"test server starting, pid {os.getpid()}", file=sys.stderr, flush=True)
    if os.environ.get("MCP_TEST_FAIL_AT_START"):
        print("cannot open the database: permission denied", file=sys.stderr, flush=True)
        sys.exit(7)
    build().run()


if __name__ == "__main__":
    main()
