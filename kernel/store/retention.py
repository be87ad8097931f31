"""Retention, export and import of whole runs (DESIGN §13): ``flowkernel prune`` / ``export`` / ``import``.

Both work on the SQL stores (SQLite and PostgreSQL), a run at a time or in bounded batches, so a
store of any size is pruned without one long transaction holding it, and an import loads each run
all or nothing. Blobs are shared by content between runs: prune deletes a blob only when no run left
reaches it (walking the remaining checkpoints, whose skeletons are small).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO

import msgspec
from flowkernel.errors import FlowkernelError, InvalidInputError, RunBusyError
from flowkernel.ids import now_ms
from flowkernel.store.base import Store
from flowkernel.store.checkpoint import blob_refs, packed_blobs
from flowkernel.store.sql.archive import RunArchive
from flowkernel.store.sql.store import SCHEMA_VERSION, SqlStore

FORMAT = "flowkernel.run"  # the ``format`` of each line of an export
RUN_STATUSES = ("queued", "running", "paused", "waiting", "completed", "failed", "aborted")
STOPPED = ("completed", "failed", "aborted")
BATCH = 100  # top-level runs per delete transaction
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

Progress = Callable[[str], None]


def parse_age(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` as milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if m is None:
        raise InvalidInputError(f"--older-than {text!r}: give a number and a unit, e.g. 30d, 12h, 90m, 45s or 2w")
    return int(m.group(1)) * _UNITS[m.group(2)] * 1000


def parse_statuses(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in RUN_STATUSES]
    if bad or not names:
        raise InvalidInputError(f"--status {text!r}: run statuses are {', '.join(RUN_STATUSES)} (comma-separated)")
    return names


def _sql(store: Store, what: str) -> SqlStore:
    if not isinstance(store, SqlStore):
        raise FlowkernelError(f"{what} needs a SQLite or PostgreSQL store, not {store.location}")
    return store


class PruneReport(msgspec.Struct, kw_only=True):
    """What ``prune`` deleted (or, with ``dryRun``, would delete)."""

    runs: int = 0  # top-level runs
    childRuns: int = 0
    events: int = 0
    blobs: int = 0  # 0 on a dry run: which blobs go is known only once their runs are gone
    dryRun: bool = False


def prune(store: Store, *, older_than_ms: int, statuses: Sequence[str] = STOPPED, dry_run: bool = False,
          batch: int = BATCH, progress: Progress | None = None, progress_after_s: float = 1.0) -> PruneReport:
    """Delete whole top-level runs in ``statuses`` unchanged for ``older_than_ms``, with their child
    runs and every row of theirs (agent rows and session transcripts included), ``batch`` runs per
    transaction. A run being executed (live lease)
    is never deleted, whatever its status. ``progress`` gets a line per batch once the work has
    taken ``progress_after_s``."""
    sql = _sql(store, "prune")
    now = now_ms()
    report = PruneReport(dryRun=dry_run)
    after: tuple[int, str] | None = None
    candidates: set[str] = set()
    started = time.monotonic()
    while True:
        page = sql.prunable_runs(statuses=statuses, updated_before=now - older_than_ms, now=now, limit=batch,
                                 after=after if dry_run else None)
        if not page:
            break
        roots = [run_id for run_id, _ in page]
        children = sql.descendants(roots)
        report.runs += len(roots)
        report.childRuns += len(children)
        if dry_run:
            report.events += sql.count_events([*roots, *children])
            after = (page[-1][1], page[-1][0])
        else:
            try:
                skeletons, events = sql.delete_runs([*roots, *children], now)
            except RunBusyError:
                # A worker claimed one of them since they were listed: the rest go one at a time.
                skeletons, events = [], 0
                for root in roots:
                    family = [root, *sql.descendants([root])]
                    try:
                        got = sql.delete_runs(family, now)
                    except RunBusyError:
                        report.runs -= 1
                        report.childRuns -= len(family) - 1
                        continue
                    skeletons += got[0]
                    events += got[1]
            report.events += events
            for skeleton in skeletons:
                candidates.update(packed_blobs(skeleton, sql.read_blobs))
        if progress is not None and time.monotonic() - started >= progress_after_s:
            counts = [f"{n} {noun}{'s' * (n != 1)}" for n, noun in
                      ((report.runs, "run"), (report.childRuns, "child run"), (report.events, "event"))]
            progress(f"prune: {counts[0]} ({counts[1]}, {counts[2]}) "
                     f"{'found' if dry_run else 'deleted'} so far")
    if candidates:
        unused = candidates - _blobs_in_use(sql, candidates)
        report.blobs = sql.delete_blobs(sorted(unused))
    return report


def _blobs_in_use(sql: SqlStore, candidates: set[str], page: int = 500) -> set[str]:
    """Which of ``candidates`` a remaining run still reaches: from its checkpoint, or from an event of
    its stored packed (a large payload that refers to blobs)."""
    used: set[str] = set()
    seen: set[str] = set()

    def reach(wanted: set[str]) -> None:
        # Nested blobs: a blob can hold references to others (a chunked list inside a large object).
        while wanted - seen:
            fresh = wanted - seen
            seen.update(fresh)
            used.update(fresh & candidates)
            nested: set[str] = set()
            for body in sql.read_blobs(sorted(fresh)).values():
                if b'"$' in body:  # no marker, no reference: skip decoding leaf values
                    blob_refs(msgspec.json.decode(body), nested)
            wanted = nested

    after = ""
    while rows := sql.checkpoint_page(after, page):
        after = rows[-1][0]
        wanted: set[str] = set()
        for _, skeleton in rows:
            data = msgspec.json.decode(skeleton)
            blob_refs(data.get("state"), wanted)
            blob_refs(data.get("outputs"), wanted)
        reach(wanted)
    key = -1
    while events := sql.packed_event_page(key, page):
        key = events[-1][0]
        wanted = set()
        for _, body in events:
            blob_refs(msgspec.json.decode(body), wanted)
        reach(wanted)
    return used


# -- export and import -----------------------------------------------------------------------


class _Line(msgspec.Struct, kw_only=True):
    format: str
    schemaVersion: int
    archive: RunArchive


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Line)


def export_runs(store: Store, run_ids: Sequence[str], out: IO[bytes], *, with_children: bool = False,
                progress: Progress | None = None) -> int:
    """Write each run (and with ``with_children`` its child runs, parents first) as one JSON line;
    every id is checked before anything is written. Returns the number of runs written."""
    sql = _sql(store, "export")
    for run_id in run_ids:
        sql.get_run(run_id)  # an unknown id fails here, before any output
    ordered = list(dict.fromkeys(run_ids))
    if with_children:
        ordered = list(dict.fromkeys([*ordered, *sql.descendants(ordered)]))
    started = time.monotonic()
    for n, run_id in enumerate(ordered, 1):
        archive = sql.export_run(run_id, packed_blobs)
        out.write(_encoder.encode(_Line(format=FORMAT, schemaVersion=SCHEMA_VERSION, archive=archive)) + b"\n")
        if progress is not None and time.monotonic() - started > 1.0 and n % 100 == 0:
            progress(f"export: {n} of {len(ordered)} runs written")
    out.flush()
    return len(ordered)


class ImportReport(msgspec.Struct, kw_only=True):
    imported: list[str] = msgspec.field(default_factory=list)
    refused: list[tuple[str, str]] = msgspec.field(default_factory=list)  # (run id or line, why)


def read_lines(lines: Iterable[bytes]) -> Iterator[tuple[int, RunArchive | str]]:
    """Each non-empty line as an archive, or the reason it is not one."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            got = _decoder.decode(line)
        except msgspec.ValidationError as exc:
            yield number, f"line {number}: not an exported run ({exc})"
            continue
        except msgspec.DecodeError as exc:
            yield number, f"line {number}: not JSON ({exc})"
            continue
        if got.format != FORMAT:
            yield number, f"line {number}: format {got.format!r} is not {FORMAT!r}"
        elif got.schemaVersion > SCHEMA_VERSION:
            yield number, (f"line {number}: exported from a store of schema version {got.schemaVersion}, "
                           f"newer than this flowkernel's {SCHEMA_VERSION}; upgrade flowkernel")
        else:
            yield number, got.archive


def import_runs(store: Store, lines: Iterable[bytes], *, progress: Progress | None = None) -> ImportReport:
    """Load exported runs, each in one transaction; a run whose id exists is refused, the rest go on."""
    sql = _sql(store, "import")
    report = ImportReport()
    started = time.monotonic()
    for number, got in read_lines(lines):
        if isinstance(got, str):
            report.refused.append((f"line {number}", got))
            continue
        try:
            sql.import_run(got)
        except FlowkernelError as exc:
            report.refused.append((got.run_id, str(exc)))
        else:
            report.imported.append(got.run_id)
        done = len(report.imported) + len(report.refused)
        if progress is not None and time.monotonic() - started > 1.0 and done % 100 == 0:
            progress(f"import: {done} runs read")
    return report
