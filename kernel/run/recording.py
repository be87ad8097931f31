"""Recording a flow's model calls as fixtures (``flowkernel record``): run it live through a
``RecordingQuery`` on a Kernel of its own, answer its waits, write the calls as fixture files."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowkernel.agents.query import QueryFn
from flowkernel.core.events import BaseEvent
from flowkernel.fixtures.files import FixtureError, fixture_path, write_fixtures
from flowkernel.fixtures.record import RecordingQuery

if TYPE_CHECKING:
    from flowkernel.core.compiler import CompiledFlow
    from flowkernel.core.snapshot import RunSnapshot
    from flowkernel.plugins.registry import Registry


@dataclass(slots=True)
class Recording:
    """What ``record_flow`` did: the run as it ended, the fixture files written, replies left over."""

    snapshot: RunSnapshot
    written: list[Path]
    unused_replies: list[str]


Answer = Callable[[str, Any], "str | None"]  # (node id, its prompt) -> the reply, or None to stop


async def record_flow(flow: CompiledFlow, input: Any, output: str | Path, *, query: QueryFn | None = None,
                      registry: Registry | None = None, replies: Iterable[str] = (), ask: Answer | None = None,
                      force: bool = False, on_event: Callable[[BaseEvent], None] | None = None,
                      on_call: Callable[[str, int | None, int], None] | None = None) -> Recording:
    """Run ``flow`` live (``query``, default the Messages API) and write its model calls as fixtures.

    A node that waits for a reply gets the next of ``replies``, else what ``ask`` answers; when
    neither has one the recording stops there, waiting, with what was recorded so far written.
    Existing fixture files are refused before any model call unless ``force``.
    """
    from flowkernel.agents.anthropic import AnthropicQuery
    from flowkernel.agents.credentials import require_credentials
    from flowkernel.plugins.registry import default_registry
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.memory import MemoryStore

    if not force:  # refuse before spending tokens
        existing = [p for p in (fixture_path(output, n) for n in flow.nodes) if p.exists()]
        if existing:
            raise FixtureError(f"{existing[0]}: already exists; pass --force to overwrite")
    own: AnthropicQuery | None = None  # made here, so closed here
    if query is None:
        require_credentials("recording", fixtures=False)
        query = own = AnthropicQuery()
    recorder = RecordingQuery(query, on_call=on_call)
    sessions = _session_recorder()  # claude.code nodes' sessions
    kernel = Kernel(MemoryStore(), registry=registry or default_registry(),
                    services={"query_fn": recorder, "session_query": sessions})
    try:
        snap = await kernel.run(flow, input, on_event=on_event)
        pending = list(replies)
        while snap.status == "waiting":
            node, waiting = sorted(snap.waiting.items())[0]
            answer = pending.pop(0) if pending else ask(node, waiting.prompt) if ask is not None else None
            if answer is None:
                break
            snap = await kernel.reply(snap.runId, waiting.runId, answer, on_event=on_event)
        documents = {**recorder.files(), **sessions.files(flow.name)}
        written = write_fixtures(documents, output, force=force) if documents else []
        return Recording(snapshot=snap, written=written, unused_replies=pending)
    finally:
        kernel.close()
        if own is not None:
            await own.aclose()


def _session_recorder() -> Any:
    from flowkernel.agents.claude_sdk import SdkSessionQuery
    from flowkernel.fixtures.sessions import RecordingSessionQuery

    return RecordingSessionQuery(SdkSessionQuery())
