"""The worker pool as the store records it: which registered workers are alive. Read by the workers
themselves, ``flowkernel workers`` and ``GET /workers``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowkernel.ids import now_ms
from flowkernel.run.kernel import owner_dead

if TYPE_CHECKING:
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.base import WorkerRecord


def live_workers(kernel: Kernel, now: int | None = None) -> list[WorkerRecord]:
    """Registered workers that are alive: heartbeat within their lease time and, on this host, a
    process that still exists."""
    now = now_ms() if now is None else now
    return [w for w in kernel.store.list_workers()
            if w.heartbeatAt + w.leaseMs >= now and not owner_dead(w.workerId)]
