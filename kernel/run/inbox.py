"""The command inbox: commands that other processes store for a run this process executes (polled
cheaply, through the store's change token), and a command queued for the process that executes a run,
waiting for its verdict."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
from flowkernel.core.commands import Command, CommandOutcome
from flowkernel.core.events import CommandReceived, decode
from flowkernel.errors import StoreError
from flowkernel.run.loop import COMMAND_POLL_S
from flowkernel.store.base import Store

if TYPE_CHECKING:
    from flowkernel.run.loop import RunExecution


class CommandInbox:
    """The commands stored for runs, as this process reads them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._token_read: tuple[float, int] = (float("-inf"), 0)  # (when, value) of the last change token read

    def change_token(self) -> int:
        """The store's change token, read at most once per poll interval however many runs execute here."""
        now = time.monotonic()
        if now - self._token_read[0] >= COMMAND_POLL_S / 2:
            self._token_read = (now, self.store.change_token())
        return self._token_read[1]

    async def poll(self, execution: RunExecution) -> None:
        """Deliver commands that other processes stored for this run (checked every 50 ms, cheaply)."""
        run_id = execution.snap.runId
        token: int | None = None
        seen: set[int] = set()
        while True:
            try:
                current = self.change_token()
                if current != token:
                    rows = self.store.pending_commands(run_id)
                    token = current
                    for row in rows:
                        if row.id not in seen:
                            seen.add(row.id)
                            execution.deliver(Command.from_json(row.body), row.id)
            except StoreError:
                pass  # a dropped connection is replaced on the next poll; a store that stays down fails the next commit
            await anyio.sleep(COMMAND_POLL_S)

    async def via_store(self, run_id: str, cmd: Command, timeout_s: float) -> CommandOutcome:
        """Queue the command for the process executing the run, and wait for its verdict (the store is
        read in worker threads: the caller's event loop never blocks on it)."""
        cid = await anyio.to_thread.run_sync(self.store.enqueue_command, run_id, cmd.to_json())
        with anyio.fail_after(timeout_s):
            while True:
                rows = {r.id for r in await anyio.to_thread.run_sync(self.store.pending_commands, run_id)}
                if cid not in rows:
                    break
                await anyio.sleep(COMMAND_POLL_S)
        for body in reversed(await anyio.to_thread.run_sync(self.store.read_events, run_id)):
            ev = decode(body)
            if isinstance(ev, CommandReceived) and ev.commandId == str(cid):
                return CommandOutcome(ev.accepted, ev, ev.reason, invalid=ev.refusal == "invalid")
        raise StoreError(f"run {run_id}: command {cmd.kind} was taken but its record is missing")
