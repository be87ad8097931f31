"""Shared helpers for the claude.code tests: a Kernel on a real SQLite file whose claude.code nodes run
real Claude Code sessions (the SDK and its bundled CLI) against the fake Messages API, and session
queries for the tests that need no CLI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from flowkernel.agents.claude_sdk import SdkSessionQuery
from flowkernel.agents.sessions import Permission, SessionRequest
from flowkernel.plugins.registry import default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.claude_code import DUMMY_API_KEY, cli_problem
from flowkernel.testing.fake_api import FakeAnthropic


def cli_env(fake: FakeAnthropic) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": DUMMY_API_KEY}


def require_cli(fake: FakeAnthropic) -> None:
    """Fail (never skip) with the reason when the bundled CLI cannot start here."""
    problem = cli_problem({**cli_env(fake), "HOME": "/tmp"})
    assert problem is None, problem


def code_flow(node_id: str = "code", **node_input: Any) -> dict[str, Any]:
    return {"name": "code-test", "nodes": [{"id": node_id, "type": "claude.code", "input": node_input}],
            "edges": []}


def cli_kernel(tmp_path: Path, fake: FakeAnthropic, *, db: str = "runs.db") -> Kernel:
    """A Kernel whose claude.code nodes talk to ``fake`` through the real CLI."""
    return Kernel(SqliteStore(tmp_path / db), registry=default_registry().copy(),
                  services={"session_query": SdkSessionQuery(env=cli_env(fake))})


class Recorded:
    """A session query that replays ``messages`` per call and keeps the requests it was opened with."""

    def __init__(self, *calls: list[dict[str, Any]]) -> None:
        self.calls = list(calls)
        self.requests: list[SessionRequest] = []

    @asynccontextmanager
    async def open(self, request: SessionRequest, *, node_id: str, store: Any, permission: Permission | None,
                   call: int = 0) -> AsyncIterator[Any]:
        self.requests.append(request)
        messages = self.calls[len(self.requests) - 1]

        class Live:
            async def messages(self) -> AsyncIterator[dict[str, Any]]:
                for m in messages:
                    yield m

            async def send(self, text: str) -> None:
                return None

            async def interrupt(self) -> None:
                return None

        yield Live()


def success(text: str, session_id: str = "s", **fields: Any) -> dict[str, Any]:
    return {"type": "result", "subtype": "success", "is_error": False, "num_turns": 1, "duration_ms": 5,
            "session_id": session_id, "result": text, "total_cost_usd": 0.0, **fields}
