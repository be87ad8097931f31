"""Leases: who executes a run. This process's owner id, taking a run's lease (a dead holder's on this host
is void), whether a live process holds one, and renewing the lease of a run executing here."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
from flowkernel.errors import LeaseLostError, RunBusyError, StoreError
from flowkernel.ids import now_ms
from flowkernel.run.defaults import DEFAULT_LEASE_S
from flowkernel.store.base import Lease, RunRecord, Store

if TYPE_CHECKING:
    from flowkernel.run.loop import RunExecution

LEASE_TTL_MS = int(DEFAULT_LEASE_S * 1000)


def owner_id() -> str:
    """A lease owner id for this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def owner_dead(owner: str) -> bool:
    """True if ``owner`` was a process on this host that no longer exists (so its lease is void)."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A zombie child still "exists" until reaped; treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


class Leases:
    """The leases this process takes, as ``owner``, for ``ttl_ms`` at a time."""

    def __init__(self, store: Store, ttl_ms: int = LEASE_TTL_MS) -> None:
        self.store = store
        self.owner = owner_id()
        self.ttl_ms = ttl_ms

    def held(self, record: RunRecord) -> bool:
        """Whether a live process holds the run's lease."""
        owner = record.leaseOwner
        return owner is not None and (record.leaseExpiresAt or 0) > now_ms() and not owner_dead(owner)

    def acquire(self, run_id: str) -> Lease:
        """Take the run's lease, or raise RunBusyError naming the live process that holds it."""
        lease = self.store.acquire_lease(run_id, self.owner, now_ms(), self.ttl_ms)
        if lease.owner != self.owner and owner_dead(lease.owner):
            # The holder died on this host: its lease is void, take the run over now.
            lease = self.store.acquire_lease(run_id, self.owner, now_ms(), self.ttl_ms, steal_from=lease.owner)
        if lease.owner != self.owner:
            raise RunBusyError(f"run {run_id} is being executed by {lease.owner}; wait for it to stop, "
                               f"or `flowkernel pause {run_id}`")
        return lease

    def keeper(self, lease: Lease) -> Callable[[RunExecution], Coroutine[Any, Any, None]]:
        """What renews ``lease`` while its run executes (a third of the time to live apart); a lease
        found lost is told to the execution, which stops."""
        async def renew(execution: RunExecution) -> None:
            run_id = execution.snap.runId
            while True:
                await anyio.sleep(self.ttl_ms / 3000)
                if execution.lease_released:
                    return
                try:
                    held = self.store.renew_lease(run_id, lease, now_ms(), self.ttl_ms)
                except StoreError:
                    continue  # the store is unreachable for now: the run's next commit says so, or this retries
                if not held:
                    if execution.lease_released or execution.lease_releasing:
                        return  # its own last commit ended the lease, just now
                    try:
                        holder = self.store.get_run(run_id).leaseOwner
                    except StoreError:
                        holder = None
                    execution.lose_lease(LeaseLostError(run_id, holder))
                    return
        return renew
