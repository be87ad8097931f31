"""An in-memory store, for tests and embedding; same behaviour as SqliteStore, nothing durable."""

from __future__ import annotations

import itertools
import json
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flowkernel.core.events import USAGE_KEYS
from flowkernel.errors import LeaseLostError, StoreError, UnknownRunError
from flowkernel.ids import now_ms
from flowkernel.store.base import (
    AgentRun,
    Claim,
    CommandRow,
    CommitRequest,
    CreateRequest,
    EventRow,
    Lease,
    Listener,
    RunRecord,
    RunTotals,
    StoredSession,
    SummaryFold,
    WorkerRecord,
    session_of_another_run,
)
from flowkernel.store.packing import resolve_bodies
from msgspec.structs import replace


class MemoryStore:
    def __init__(self) -> None:
        self.location = "memory"
        self._lock = threading.Lock()
        self._flows: dict[str, str] = {}
        self._runs: dict[str, RunRecord] = {}
        self._events: dict[str, list[bytes]] = {}
        self._checkpoints: dict[str, list[tuple[int, bytes]]] = {}
        self._commands: dict[int, tuple[CommandRow, int | None]] = {}
        self._ids = itertools.count(1)
        self._run_nos = itertools.count(1)
        self._version = 0
        self._blobs: dict[str, bytes] = {}
        self._messages: list[dict[str, Any]] = []
        self._traces: dict[str, str] = {}
        self._tool_calls: list[dict[str, Any]] = []
        self._workers: dict[str, WorkerRecord] = {}
        self._agent_runs: dict[tuple[str, str], tuple[int, AgentRun]] = {}  # (run, node run) -> (key, row)
        self._secrets: dict[str, bytes] = {}
        self._transcripts: dict[tuple[str, str, str], _Transcript] = {}  # (project, session, subpath)

    def secret(self, name: str) -> bytes:
        with self._lock:
            return self._secrets.setdefault(name, secrets.token_bytes(32))

    def put_flow(self, flow_hash: str, name: str, document: str) -> None:
        self._flows.setdefault(flow_hash, document)

    def get_flow(self, flow_hash: str) -> str:
        try:
            return self._flows[flow_hash]
        except KeyError:
            raise StoreError(f"flow {flow_hash} is not in the store") from None

    def create_run(self, record: RunRecord, events: Sequence[EventRow], checkpoint: bytes,
                   blobs: Mapping[str, bytes] | None = None, *, document: str | None = None,
                   agent_runs: Sequence[AgentRun] = ()) -> None:
        with self._lock:
            if record.runId in self._runs:
                raise StoreError(f"run {record.runId} already exists")
            if document is not None:
                self._flows.setdefault(record.flowHash, document)
            if record.idempotencyKey is not None and self.find_idempotent(record.idempotencyKey) is not None:
                raise StoreError(f"idempotency key {record.idempotencyKey!r} is taken")
            self._blobs.update(blobs or {})
            self._runs[record.runId] = replace(record, runNo=next(self._run_nos))
            self._events[record.runId] = [row[2] for row in events]
            self._checkpoints[record.runId] = [(record.seq, checkpoint)] if events else []
            self._write_agent_runs(agent_runs)
            self._version += 1

    def _write_agent_runs(self, rows: Sequence[AgentRun]) -> None:
        for r in rows:
            key = (r.runId, r.agentRunId)
            found = self._agent_runs.get(key)
            row = replace(r, usage={k: r.usage.get(k, 0) for k in USAGE_KEYS})
            self._agent_runs[key] = (found[0] if found else len(self._agent_runs) + 1, row)

    def set_run_settings(self, run_id: str, settings: dict[str, Any] | None) -> None:
        with self._lock:
            self._runs[run_id] = replace(self.get_run(run_id), settings=settings)

    def update_run_flow(self, run_id: str, flow_hash: str, name: str, document: str, source: str | None) -> None:
        with self._lock:
            record = self.get_run(run_id)
            self._flows.setdefault(flow_hash, document)
            self._runs[run_id] = replace(record, flowHash=flow_hash, flowSource=source)

    def get_run(self, run_id: str) -> RunRecord:
        try:
            return self._runs[run_id]
        except KeyError:
            raise UnknownRunError(run_id, "the memory store") from None

    def list_runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]:
        runs = [r for r in self._runs.values()
                if (status is None or r.status == status) and (parent is None or r.parentRunId == parent)]
        return sorted(runs, key=lambda r: (r.createdAt, r.runId), reverse=True)[:limit]

    def page_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                  before: int | None = None, limit: int = 50, after: int | None = None, oldest: bool = False,
                  id_prefix: str | None = None, error: str | None = None) -> list[RunRecord]:
        needle = error.lower() if error is not None else None
        runs = [r for r in self._runs.values()
                if (status is None or r.status == status) and (flow is None or r.flowName == flow)
                and (parent is None or r.parentRunId == parent) and (before is None or (r.runNo or 0) < before)
                and (after is None or (r.runNo or 0) > after)
                and (id_prefix is None or r.runId.startswith(id_prefix))
                and (needle is None or (r.error is not None and needle in r.error.lower()))]
        return sorted(runs, key=lambda r: r.runNo or 0, reverse=not oldest)[:limit]

    def count_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                   before: int | None = None) -> int:
        return len(self.page_runs(status=status, flow=flow, parent=parent, before=before, limit=len(self._runs)))

    def find_idempotent(self, key: str) -> RunRecord | None:
        return next((r for r in self._runs.values() if r.idempotencyKey == key), None)

    def descendant_totals(self, run_ids: Sequence[str]) -> dict[str, RunTotals]:
        children: dict[str, list[RunRecord]] = {}
        for r in self._runs.values():
            if r.parentRunId is not None:
                children.setdefault(r.parentRunId, []).append(r)
        out: dict[str, RunTotals] = {}
        for root in run_ids:
            todo, usage, cost = list(children.get(root, [])), dict.fromkeys(USAGE_KEYS, 0), 0.0
            if not todo:
                continue
            while todo:
                r = todo.pop()
                todo.extend(children.get(r.runId, []))
                for k in USAGE_KEYS:
                    usage[k] += r.usage.get(k, 0)
                cost += r.totalCostUsd
            out[root] = RunTotals(usage=usage, totalCostUsd=cost)
        return out

    def commit(self, run_id: str, events: Sequence[EventRow], status: str, seq: int, error: str | None,
               checkpoint: bytes | None, blobs: Mapping[str, bytes] | None = None, *, lease: Lease | None = None,
               release: bool = False, taken: Sequence[tuple[int, int]] = (),
               totals: RunTotals | None = None, agent_runs: Sequence[AgentRun] = ()) -> None:
        with self._lock:
            self._check_lease(run_id, lease)
            rec = self.get_run(run_id)
            log = self._events[run_id]
            if events and events[0][0] != len(log) + 1:
                raise StoreError(f"run {run_id}: seq {events[0][0]} does not follow {len(log)}")
            self._blobs.update(blobs or {})
            log.extend(row[2] for row in events)
            rec = replace(rec, status=status, seq=seq, error=error, updatedAt=now_ms())
            if totals is not None:
                rec = replace(rec, usage=dict(totals.usage), totalCostUsd=totals.totalCostUsd)
            if release and lease is not None:
                rec = replace(rec, leaseOwner=None, leaseExpiresAt=None)
            self._runs[run_id] = rec
            if checkpoint is not None:
                self._checkpoints[run_id] = [(seq, checkpoint)]
            for command_id, received in taken:  # its record is in the log now
                self._commands[command_id] = (replace(self._commands[command_id][0], body={}), received)
            self._write_agent_runs(agent_runs)
            self._version += 1

    def commit_group(self, requests: Sequence[CommitRequest | CreateRequest]) -> list[Exception | None]:
        results: list[Exception | None] = []
        for r in requests:
            try:
                if isinstance(r, CreateRequest):
                    self.create_run(r.record, r.events, r.checkpoint, r.blobs, document=r.document,
                                    agent_runs=r.agent_runs)
                else:
                    self.commit(r.runId, r.events, r.status, r.seq, r.error, r.checkpoint, r.blobs, lease=r.lease,
                                release=r.release, taken=r.taken, totals=r.totals, agent_runs=r.agent_runs)
                results.append(None)
            except Exception as exc:
                results.append(exc)
        return results

    def read_events(self, run_id: str, after: int = 0, until: int | None = None) -> list[bytes]:
        self.get_run(run_id)
        log = self._events[run_id]
        return resolve_bodies(log[after:until], self.read_blobs)

    def last_seqs(self, run_ids: Sequence[str]) -> dict[str, int]:
        return {r: len(self._events[r]) for r in run_ids if r in self._events}

    def read_blobs(self, keys: Iterable[str]) -> dict[str, bytes]:
        return {k: self._blobs[k] for k in keys if k in self._blobs}

    def read_checkpoint(self, run_id: str, at_most: int | None = None) -> tuple[int, bytes] | None:
        for seq, body in reversed(self._checkpoints.get(run_id, [])):
            if at_most is None or seq <= at_most:
                return seq, body
        return None

    def enqueue_command(self, run_id: str, body: dict[str, Any]) -> int:
        with self._lock:
            cid = next(self._ids)
            self._commands[cid] = (CommandRow(id=cid, runId=run_id, body=body, createdAt=now_ms()), None)
            self._version += 1
            return cid

    def pending_commands(self, run_id: str) -> list[CommandRow]:
        return [row for row, taken in self._commands.values() if row.runId == run_id and taken is None]

    def finish_command(self, command_id: int, seq: int) -> None:
        row, _ = self._commands[command_id]
        self._commands[command_id] = (replace(row, body={}), seq)  # its record is in the log now

    def change_token(self) -> int:
        return self._version

    def acquire_lease(self, run_id: str, owner: str, now_ms: int, ttl_ms: int,
                      steal_from: str | None = None) -> Lease:
        with self._lock:
            rec = self.get_run(run_id)
            if rec.leaseOwner not in (None, owner, steal_from) and (rec.leaseExpiresAt or 0) > now_ms:
                return Lease(rec.leaseOwner or "", rec.leaseEpoch)
            return self._grant(rec, owner, now_ms + ttl_ms)

    def get_trace_context(self, run_id: str) -> str | None:
        return self._traces.get(run_id)

    def set_trace_context(self, run_id: str, trace_context: str) -> None:
        self._traces.setdefault(run_id, trace_context)

    def _grant(self, rec: RunRecord, owner: str, expires: int) -> Lease:
        lease = Lease(owner, rec.leaseEpoch + 1)
        self._runs[rec.runId] = replace(rec, leaseOwner=owner, leaseExpiresAt=expires, leaseEpoch=lease.epoch)
        return lease

    def renew_lease(self, run_id: str, lease: Lease, now_ms: int, ttl_ms: int) -> bool:
        with self._lock:
            rec = self.get_run(run_id)
            if rec.leaseOwner != lease.owner or rec.leaseEpoch != lease.epoch:
                return False
            self._runs[run_id] = replace(rec, leaseExpiresAt=now_ms + ttl_ms)
            return True

    def release_lease(self, run_id: str, lease: Lease) -> None:
        with self._lock:
            rec = self._runs.get(run_id)
            if rec is not None and rec.leaseOwner == lease.owner and rec.leaseEpoch == lease.epoch:
                self._runs[run_id] = replace(rec, leaseOwner=None, leaseExpiresAt=None)

    def claim_runs(self, owner: str, now_ms: int, ttl_ms: int, limit: int,
                   dead: Sequence[str] = ()) -> list[Claim]:
        with self._lock:
            claims: list[Claim] = []
            for rec in sorted(self._runs.values(), key=lambda r: r.createdAt):
                if len(claims) >= limit:
                    break
                free = rec.leaseOwner is None or (rec.leaseExpiresAt or 0) < now_ms or rec.leaseOwner in dead
                orphan = rec.status == "running" and rec.pooled and rec.parentRunId is None
                if not free or not (rec.status == "queued" or orphan):
                    continue
                if rec.status == "queued" and rec.maxRuns is not None and \
                        self._slots_taken(rec.flowName, now_ms) >= rec.maxRuns:
                    continue
                claims.append(Claim(runId=rec.runId, status=rec.status, lease=self._grant(rec, owner, now_ms + ttl_ms)))
            return claims

    def _slots_taken(self, flow_name: str, now_ms: int) -> int:
        return sum(1 for r in self._runs.values() if r.flowName == flow_name and r.pooled and (
            r.status == "running" or (r.status == "queued" and r.leaseOwner is not None
                                      and (r.leaseExpiresAt or 0) >= now_ms)))

    def register_worker(self, worker: WorkerRecord) -> None:
        self._workers[worker.workerId] = worker

    def heartbeat(self, worker_id: str, now_ms: int) -> None:
        if worker_id in self._workers:
            self._workers[worker_id] = replace(self._workers[worker_id], heartbeatAt=now_ms)

    def remove_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)

    def list_workers(self) -> list[WorkerRecord]:
        return [replace(w, runs=[r.runId for r in sorted(self._runs.values(), key=lambda r: r.createdAt)
                                 if r.leaseOwner == w.workerId])
                for w in sorted(self._workers.values(), key=lambda w: (w.startedAt, w.workerId))]

    def listen(self) -> Listener | None:
        return None

    def _check_lease(self, run_id: str, lease: Lease | None) -> None:
        if lease is not None:
            rec = self.get_run(run_id)
            if rec.leaseOwner != lease.owner or rec.leaseEpoch != lease.epoch:
                raise LeaseLostError(run_id, rec.leaseOwner)

    def list_agent_runs(self, *, run_id: str | None = None, agent_run_id: str | None = None,
                        status: str | None = None, agent_id: str | None = None, parent_run_id: str | None = None,
                        open_only: bool = False, before: int | None = None,
                        limit: int = 50) -> list[tuple[int, AgentRun]]:
        rows = [(k, r) for k, r in self._agent_runs.values()
                if (run_id is None or r.runId == run_id) and (agent_run_id is None or r.agentRunId == agent_run_id)
                and (status is None or r.status == status) and (agent_id is None or r.agentId == agent_id)
                and (parent_run_id is None or r.parentRunId == parent_run_id)
                and (not open_only or r.status in ("running", "waiting")) and (before is None or k < before)]
        return sorted(rows, key=lambda kr: kr[0], reverse=True)[:limit]

    def add_agent_message(self, row: dict[str, Any], *, lease: Lease | None = None) -> int:
        with self._lock:
            self._check_lease(row["flowRunId"], lease)
            row = {"modelCall": None, **row, "id": len(self._messages) + 1}
            self._messages.append(row)
            return int(row["id"])

    def list_agent_messages(self, *, run_id: str | None = None, session_id: str | None = None,
                            flow_run_id: str | None = None, after: int = 0, limit: int = 100,
                            node_id: str | None = None) -> list[dict[str, Any]]:
        rows = [m for m in self._messages if m["id"] > after
                and (run_id is None or m.get("runId") == run_id)
                and (session_id is None or m.get("sessionId") == session_id)
                and (flow_run_id is None or m.get("flowRunId") == flow_run_id)
                and (node_id is None or m.get("nodeId") == node_id)]
        return rows[:limit]

    def add_tool_call(self, row: dict[str, Any], *, lease: Lease | None = None) -> int:
        with self._lock:
            self._check_lease(row["flowRunId"], lease)
            row = {**row, "id": len(self._tool_calls) + 1}
            self._tool_calls.append(row)
            return int(row["id"])

    def list_tool_calls(self, *, run_id: str | None = None, session_id: str | None = None,
                        flow_run_id: str | None = None, tool_name: str | None = None, status: str | None = None,
                        after: int = 0, limit: int = 100, node_id: str | None = None) -> list[dict[str, Any]]:
        rows = [t for t in self._tool_calls if t["id"] > after
                and (run_id is None or t.get("runId") == run_id)
                and (session_id is None or t.get("sessionId") == session_id)
                and (flow_run_id is None or t.get("flowRunId") == flow_run_id)
                and (tool_name is None or t.get("toolName") == tool_name)
                and (status is None or t.get("status") == status)
                and (node_id is None or t.get("nodeId") == node_id)]
        return rows[:limit]

    # -- Claude Code sessions ------------------------------------------------------------------

    def _session_owner(self, project_key: str, session_id: str) -> str | None:
        return next((t.runId for (p, s, _), t in self._transcripts.items() if (p, s) == (project_key, session_id)),
                    None)

    def append_session_entries(self, run_id: str, project_key: str, session_id: str, subpath: str,
                               entries: Sequence[Mapping[str, Any]], *, fold: SummaryFold | None = None,
                               lease: Lease | None = None) -> int:
        with self._lock:
            self.get_run(run_id)
            self._check_lease(run_id, lease)
            owner = self._session_owner(project_key, session_id)
            if owner not in (None, run_id):
                raise StoreError(session_of_another_run(session_id, project_key, owner, run_id))
            key = (project_key, session_id, subpath)
            t = self._transcripts.get(key) or _Transcript(runId=run_id, mtime=0)
            seen = set(t.uuids)
            new: list[str] = []  # stored as JSON text, as a database stores them
            for entry in entries:
                uuid = entry.get("uuid")
                if isinstance(uuid, str):
                    if uuid in seen:
                        continue
                    seen.add(uuid)
                new.append(json.dumps(entry))
            if not new:
                return 0
            mtime = max(now_ms(), t.mtime + 1)
            if fold is not None and subpath == "":
                t.summary, t.summaryMtime = fold(t.summary, [json.loads(e) for e in new]), mtime
            t.mtime, t.uuids = mtime, seen
            t.entries.extend(new)
            self._transcripts[key] = t
            return len(new)

    def load_session_entries(self, project_key: str, session_id: str, subpath: str = "", *,
                             run_id: str | None = None) -> list[dict[str, Any]] | None:
        with self._lock:
            t = self._transcripts.get((project_key, session_id, subpath))
            if t is None or run_id not in (None, t.runId):
                return None
            return [json.loads(e) for e in t.entries]

    def list_sessions(self, *, project_key: str | None = None, run_id: str | None = None) -> list[StoredSession]:
        with self._lock:
            return [StoredSession(runId=t.runId, projectKey=p, sessionId=s, mtime=t.mtime,
                                  summary=None if t.summary is None else json.loads(json.dumps(t.summary)),
                                  summaryMtime=t.summaryMtime)
                    for (p, s, sub), t in self._transcripts.items()
                    if sub == "" and project_key in (None, p) and run_id in (None, t.runId)]

    def list_session_subpaths(self, project_key: str, session_id: str, *,
                              run_id: str | None = None) -> list[str]:
        with self._lock:
            return [sub for (p, s, sub), t in self._transcripts.items()
                    if (p, s) == (project_key, session_id) and sub != "" and run_id in (None, t.runId)]

    def delete_session(self, run_id: str, project_key: str, session_id: str, subpath: str | None = None, *,
                       lease: Lease | None = None) -> None:
        with self._lock:
            self._check_lease(run_id, lease)
            for key in [k for k, t in self._transcripts.items()
                        if k[:2] == (project_key, session_id) and subpath in (None, k[2]) and t.runId == run_id]:
                del self._transcripts[key]

    def close(self) -> None:
        pass


class _Transcript:
    """One transcript of a Claude Code session in the memory store."""

    __slots__ = ("entries", "mtime", "runId", "summary", "summaryMtime", "uuids")

    def __init__(self, *, runId: str, mtime: int) -> None:
        self.runId = runId
        self.mtime = mtime
        self.entries: list[str] = []
        self.uuids: set[str] = set()
        self.summary: dict[str, Any] | None = None
        self.summaryMtime: int | None = None
