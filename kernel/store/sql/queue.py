"""Mixed into ``SqlStore``: commands, leases, the queue workers claim from, and the workers table."""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from flowkernel.errors import UnknownRunError
from flowkernel.ids import now_ms
from flowkernel.store.base import Claim, CommandRow, Lease, Listener, WorkerRecord
from flowkernel.store.sql.rows import SLOT_TAKEN


class SqlQueue:
    """The ``Commands``, ``Leases`` and queue methods of the SQL stores (statements as in ``SqlStore``)."""

    location: str
    param: ClassVar[str]

    _sql_insert_command: ClassVar[str] = ("INSERT INTO commands (run_id, body, created_at) VALUES (?, ?, ?) "
                                          "RETURNING id")
    _sql_pending_commands: ClassVar[str] = ("SELECT id, run_id, body, created_at FROM commands "
                                            "WHERE run_id = ? AND taken_seq IS NULL ORDER BY id")
    # Taken: its record is in the log now (a refused one with a preview only), so the body can go.
    _sql_finish_command: ClassVar[str] = "UPDATE commands SET taken_seq = ?, body = '{}' WHERE id = ?"
    _sql_lease_select: ClassVar[str] = "SELECT lease_owner, lease_expires_at, lease_epoch FROM runs WHERE run_id = ?"
    _sql_lease_take: ClassVar[str] = ("UPDATE runs SET lease_owner = ?, lease_expires_at = ?, lease_epoch = ? "
                                      "WHERE run_id = ?")
    _sql_lease_renew: ClassVar[str] = ("UPDATE runs SET lease_expires_at = ? "
                                       "WHERE run_id = ? AND lease_owner = ? AND lease_epoch = ?")
    _sql_lease_release: ClassVar[str] = ("UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL "
                                         "WHERE run_id = ? AND lease_owner = ? AND lease_epoch = ? RETURNING status, pool")
    # The queue. Runs a worker may claim: queued ones, and pooled top-level running ones whose executor
    # is gone (child runs are driven by their parent's flow.call node, so they follow their parent).
    # {dead} is replaced per call by ``OR lease_owner IN (…)``, or nothing.
    _sql_claimable: ClassVar[str] = (
        "(status = 'queued' OR (status = 'running' AND pool = 1 AND parent_run_id IS NULL)) "
        "AND (lease_owner IS NULL OR lease_expires_at < ?{dead})")
    # A queued run of a flow with maxConcurrentRuns waits while that many pooled runs of the flow are
    # running (orphans included: they keep their slot until recovered) or claimed and starting.
    _sql_slots_taken: ClassVar[str] = f"SELECT COUNT(*) FROM runs x WHERE x.flow_name = ? AND {SLOT_TAKEN}"
    # The same test inside the claim's SELECT, so that a flow at its limit cannot hold up the runs
    # queued behind it (the count is taken again under the flow's lock before a run is leased).
    _sql_has_slot: ClassVar[str] = ("(max_runs IS NULL OR status = 'running' OR "
                                    f"(SELECT COUNT(*) FROM runs x WHERE x.flow_name = runs.flow_name AND {SLOT_TAKEN}) "
                                    "< max_runs)")
    _sql_claim_take: ClassVar[str] = ("UPDATE runs SET lease_owner = ?, lease_expires_at = ?, lease_epoch = ? "
                                      "WHERE run_id = ?")
    _sql_register_worker: ClassVar[str] = (
        "INSERT INTO workers (worker_id, host, pid, started_at, heartbeat_at, concurrency, lease_ms) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, "
        "concurrency = excluded.concurrency, lease_ms = excluded.lease_ms")
    _sql_heartbeat: ClassVar[str] = "UPDATE workers SET heartbeat_at = ? WHERE worker_id = ?"
    _sql_remove_worker: ClassVar[str] = "DELETE FROM workers WHERE worker_id = ?"
    _sql_list_workers: ClassVar[str] = ("SELECT worker_id, host, pid, started_at, heartbeat_at, concurrency, lease_ms "
                                        "FROM workers ORDER BY started_at, worker_id")
    _sql_held_runs: ClassVar[str] = ("SELECT lease_owner, run_id FROM runs WHERE lease_owner IS NOT NULL "
                                     "ORDER BY created_at")

    @abstractmethod
    def _tx(self, conflict: str | None = None, run: str = "") -> AbstractContextManager[Any]: ...

    @abstractmethod
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    @abstractmethod
    def _bump_changes(self, db: Any) -> None: ...

    # -- commands ---------------------------------------------------------------------------

    def enqueue_command(self, run_id: str, body: dict[str, Any]) -> int:
        with self._tx() as db:
            row = db.execute(self._sql_insert_command, (run_id, json.dumps(body), now_ms())).fetchone()
            self._bump_changes(db)
            return int(row[0]) if row else 0

    def pending_commands(self, run_id: str) -> list[CommandRow]:
        rows = self._query(self._sql_pending_commands, (run_id,))
        return [CommandRow(id=r[0], runId=r[1], body=json.loads(r[2]), createdAt=r[3]) for r in rows]

    def finish_command(self, command_id: int, seq: int) -> None:
        with self._tx() as db:
            db.execute(self._sql_finish_command, (seq, command_id))

    # -- leases -----------------------------------------------------------------------------

    def acquire_lease(self, run_id: str, owner: str, now_ms: int, ttl_ms: int,
                      steal_from: str | None = None) -> Lease:
        with self._tx() as db:
            row = db.execute(self._sql_lease_select, (run_id,)).fetchone()
            if row is None:
                raise UnknownRunError(run_id, self.location)
            holder, expires, epoch = row
            if holder is not None and holder not in (owner, steal_from) and (expires or 0) > now_ms:
                return Lease(str(holder), int(epoch))
            db.execute(self._sql_lease_take, (owner, now_ms + ttl_ms, int(epoch) + 1, run_id))
            return Lease(owner, int(epoch) + 1)

    def renew_lease(self, run_id: str, lease: Lease, now_ms: int, ttl_ms: int) -> bool:
        with self._tx() as db:
            return bool(db.execute(self._sql_lease_renew, (now_ms + ttl_ms, run_id, lease.owner, lease.epoch)).rowcount)

    def release_lease(self, run_id: str, lease: Lease) -> None:
        with self._tx() as db:
            row = db.execute(self._sql_lease_release, (run_id, lease.owner, lease.epoch)).fetchone()
            if row is not None and row[0] == "running" and row[1]:
                self._notify_queue(db)  # handed over mid-run: another worker continues it at once

    # -- the queue and the workers ----------------------------------------------------------

    def _notify_queue(self, db: Any) -> None:
        """In a transaction that makes a run claimable: wake the workers when it commits (if the
        store can; workers poll otherwise)."""

    def claim_runs(self, owner: str, now_ms: int, ttl_ms: int, limit: int,
                   dead: Sequence[str] = ()) -> list[Claim]:
        if limit <= 0:
            return []
        p = self.param
        where = self._sql_claimable.replace("{dead}", f" OR lease_owner IN ({', '.join([p] * len(dead))})" if dead else "")
        where += f" AND {self._sql_has_slot}"
        params: list[Any] = [now_ms, *dead, now_ms]
        if not self._query(f"SELECT 1 FROM runs WHERE {where} LIMIT 1", params):
            return []  # nothing to claim: no write transaction taken
        select = f"SELECT run_id, status, lease_epoch, flow_name, max_runs FROM runs WHERE {where} " \
                 f"ORDER BY created_at, run_no LIMIT {p}{self._claim_lock}"
        claims: list[Claim] = []
        with self._tx() as db:
            for run_id, status, epoch, flow_name, max_runs in db.execute(select, [*params, limit]).fetchall():
                if status == "queued" and max_runs is not None:
                    self._lock_flow(db, flow_name)
                    if int(db.execute(self._sql_slots_taken, (flow_name, now_ms)).fetchone()[0]) >= max_runs:
                        continue
                lease = Lease(owner, int(epoch) + 1)
                db.execute(self._sql_claim_take, (owner, now_ms + ttl_ms, lease.epoch, run_id))
                claims.append(Claim(runId=run_id, status=status, lease=lease))
        return claims

    #: Appended to the claim's SELECT: PostgreSQL locks the rows it claims and skips rows another
    #: worker is claiming; SQLite's write transaction is the only writer already.
    _claim_lock: ClassVar[str] = ""

    def _lock_flow(self, db: Any, flow_name: str) -> None:
        """Serialise the claims of one flow's runs (maxConcurrentRuns) until the transaction ends."""

    def register_worker(self, worker: WorkerRecord) -> None:
        with self._tx() as db:
            db.execute(self._sql_register_worker, (worker.workerId, worker.host, worker.pid, worker.startedAt,
                                                   worker.heartbeatAt, worker.concurrency, worker.leaseMs))

    def heartbeat(self, worker_id: str, now_ms: int) -> None:
        with self._tx() as db:
            db.execute(self._sql_heartbeat, (now_ms, worker_id))

    def remove_worker(self, worker_id: str) -> None:
        with self._tx() as db:
            db.execute(self._sql_remove_worker, (worker_id,))

    def list_workers(self) -> list[WorkerRecord]:
        held: dict[str, list[str]] = {}
        for owner, run_id in self._query(self._sql_held_runs):
            held.setdefault(owner, []).append(run_id)
        return [WorkerRecord(workerId=r[0], host=r[1], pid=int(r[2]), startedAt=int(r[3]), heartbeatAt=int(r[4]),
                             concurrency=int(r[5]), leaseMs=int(r[6]), runs=held.get(r[0], []))
                for r in self._query(self._sql_list_workers)]

    def listen(self) -> Listener | None:
        return None
