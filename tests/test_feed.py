"""The server's event feed hears of this process's commits at once: a follower of a run gets each new
event when it is committed, not at the feed's next poll of the store."""

from __future__ import annotations

from pathlib import Path

import anyio
from flowkernel.ids import new_run_id
from flowkernel.plugins.registry import default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.server.feed import Feed
from flowkernel.store.sql.sqlite import SqliteStore


def test_commits_of_this_process_reach_a_follower_without_waiting_for_a_poll(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    registry = default_registry().copy()
    gate: list[anyio.Event] = []

    async def hold() -> str:
        await gate[0].wait()
        return "released"

    registry.add_function("hold", hold)
    kernel = Kernel(SqliteStore(db), registry=registry)
    feed_store = SqliteStore(db)
    feed = Feed(feed_store, poll_s=3600)  # it never polls within this test: only a commit's word makes it look
    kernel.on_commit(feed.nudge)
    flow = kernel.compile({"name": "held", "nodes": [{"id": "h", "type": "python", "input": {"function": "hold"}}],
                           "edges": []})
    run_id = new_run_id()
    seen: list[bytes] = []

    async def follow() -> None:
        async for body in feed.events(run_id, 0, keepalive_s=3600):
            assert body is not None
            seen.append(body)
            if body.startswith(b'{"type":"node:start"'):
                gate[0].set()  # the node finishes only once its start reached the follower

    async def main() -> None:
        gate.append(anyio.Event())
        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                tg.start_soon(feed.watch)
                async with anyio.create_task_group() as inner:
                    inner.start_soon(follow)
                    await anyio.lowlevel.checkpoint()
                    snap = await kernel.run(flow, {}, run_id=run_id)
                assert snap.status == "completed"
                tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        kernel.close()
        feed_store.close()
    types = [body.split(b'"', 4)[3].decode() for body in seen]
    assert types == ["flow:start", "node:start", "node:complete", "flow:complete"]
