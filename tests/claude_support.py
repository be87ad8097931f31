"""Shared helpers for the claude.agent tests: a kernel on a real SQLite file talking to FakeAnthropic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowkernel.agents.anthropic import AnthropicQuery
from flowkernel.core.events import Event
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.fake_api import FakeAnthropic


def agent_flow(node_id: str = "agent", **node_input: Any) -> dict[str, Any]:
    return {"name": "agent-test", "nodes": [{"id": node_id, "type": "claude.agent", "input": node_input}],
            "edges": []}


def make_kernel(tmp_path: Path, fake: FakeAnthropic, *, registry: Registry | None = None,
                db: str = "runs.db", **services: Any) -> Kernel:
    query = AnthropicQuery(base_url=fake.base_url, api_key="test", backoff_s=0.01, max_retries=3)
    return Kernel(SqliteStore(tmp_path / db), registry=registry or default_registry().copy(),
                  services={"query_fn": query, **services})


def agent_events(kernel: Kernel, run_id: str) -> list[Event]:
    return [e for e in kernel.events(run_id) if e.type.startswith("agent:")]


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def stored_conversation(kernel: Kernel, session_id: str) -> list[dict[str, Any]]:
    rows = kernel.store.list_agent_messages(session_id=session_id, limit=10_000)
    return [{"role": r["role"], "content": r["content"]} for r in rows if r["role"] != "system"]


def sent(value: Any) -> Any:
    """A request body, or part of one, as the model reads it: without prompt-caching markers, and a
    content or system that a marker turned into one text block back to its string."""
    if isinstance(value, dict):
        out = {k: sent(v) for k, v in value.items() if k != "cache_control"}
        for key in ("content", "system"):
            block = out.get(key)
            if isinstance(block, list) and len(block) == 1 and isinstance(block[0], dict) \
                    and set(block[0]) == {"type", "text"} and block[0]["type"] == "text":
                out[key] = block[0]["text"]
        return out
    if isinstance(value, list):
        return [sent(v) for v in value]
    return value
