"""Human-readable output of what is stored: a run's snapshot (``show``), run lists (``runs``), and the
short and whole forms of a value the other outputs use."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, TextIO

from flowkernel.cli.wording import plural
from flowkernel.core.snapshot import RunSnapshot, undelivered_answer
from flowkernel.history.summaries import RunSummary
from flowkernel.store.base import RunRecord


def cost_line(run: RunSummary) -> str:
    """``$0.0123  1,204 in / 310 out tokens (cache: 0 written, 800 read)``."""
    u = run.usage
    return (f"${run.totalCostUsd:.4f}  {u.inputTokens:,} in / {u.outputTokens:,} out tokens "
            f"(cache: {u.cacheCreationInputTokens:,} written, {u.cacheReadInputTokens:,} read)")


def preview(value: Any, width: int | None = 60) -> str:
    """``value`` as compact JSON (a string as it is) on one line, cut to ``width`` characters
    (``None``: whole).

    Built piece by piece and stopped once ``width`` is passed, so a preview of a 10,000-message
    transcript costs what it shows, not the transcript.
    """
    if width is None:
        text = value if isinstance(value, str) else _dumps(value)
    elif isinstance(value, str):
        text = value[:width + 1]
    elif type(value) in _SCALARS:
        text = _dumps(value)
    else:
        parts: list[str] = []
        size = 0
        for piece in _json_pieces(value, width + 1):
            parts.append(piece)
            size += len(piece)
            if size > width:
                break
        text = "".join(parts)
    text = text.replace("\n", " ")
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


_SCALARS = frozenset({type(None), bool, int, float})


def whole(value: Any, indent: str) -> str:
    """``value`` in full for ``--full``: text as it is, other values as indented JSON; lines after the
    first start with ``indent``."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)
    return text.replace("\n", "\n" + indent)


def _json_pieces(value: Any, budget: int) -> Iterator[str]:
    """Compact JSON of ``value`` (as ``json.dumps`` with ``ensure_ascii=False`` writes it), in pieces;
    strings longer than ``budget`` are cut (the caller stops before their end anyway)."""
    if isinstance(value, str):
        yield _dumps(value[:budget]) if len(value) > budget else _dumps(value)
    elif isinstance(value, dict):
        yield "{"
        for i, (k, v) in enumerate(value.items()):
            yield ("," if i else "") + _dumps(k if isinstance(k, str) else _dumps(k)) + ":"
            yield from _json_pieces(v, budget)
        yield "}"
    elif isinstance(value, list | tuple):
        yield "["
        for i, v in enumerate(value):
            if i:
                yield ","
            yield from _json_pieces(v, budget)
        yield "]"
    else:
        yield _dumps(value)


# ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` builds an encoder on every call: one is
# kept, and strings, ints, booleans and null (most of what a preview shows) are written without it.
_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_encode_string = json.encoder.encode_basestring  # what that encoder writes a string with


def _dumps(value: Any) -> str:
    t = type(value)
    if t is str:
        return _encode_string(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return int.__repr__(value)
    return _encoder.encode(value)


# Stored events the live view only counts, by the start of their JSON (msgspec writes the tag first).


def show_snapshot(record: RunRecord, snap: RunSnapshot, out: TextIO, summary: RunSummary | None = None, *,
                  again: str = "", live: bool = True, full: bool = False) -> None:
    """A readable picture of a run: status, cost, nodes, what it waits for, loops and state.

    ``again`` ends the commands it prints (the store option, so they work as printed). ``live``: a
    process executes the run now; when none does, node runs the snapshot has as running were
    interrupted, and say so. ``full``: values whole instead of cut to a line.
    """
    def shown(value: Any, n: int, indent: str) -> str:
        return whole(value, indent) if full else preview(value, n)

    status = snap.status
    if not live and status == "running":
        status = f"interrupted (stored as running; no process executes it: flowkernel resume {snap.runId}{again})"
    stranded = {n for n in snap.waiting if undelivered_answer(snap, n) is not None} if not live else set()
    if stranded:
        status = (f"waiting, with a reply accepted and not delivered (its process stopped): "
                  f"flowkernel resume {snap.runId}{again}")
    # The snapshot's flow: the one the run followed at the seq shown (a later flow:updated changed the row's).
    out.write(f"run      {record.runId}\nflow     {record.flowName}  ({snap.flowHash[:19]}…)\n")
    out.write(f"status   {status}" + (f"  error: {snap.error}" if snap.error else "") + "\n")
    if snap.status == "paused" and snap.budgetPause is not None:
        from flowkernel.core.budgets import pause_hint

        what, command = pause_hint(snap.runId, snap.budgetPause)
        out.write(f"budget   {what}: {command}{again}\n")
    out.write(f"events   {snap.seq}\n")
    if summary is not None:  # the run's cost now (child runs included), whatever seq is shown
        out.write(f"cost     {cost_line(summary)}\n")
    if record.parentRunId:
        out.write(f"parent   {record.parentRunId} (node run {record.parentNodeRunId})\n")
    settings = record.settings or {}
    if settings:  # what every process that continues the run uses (unless told otherwise)
        parts = [f"--fixtures {settings['fixtures']}"] if settings.get("fixtures") else []
        parts += [f"--plugin {p}" for p in settings.get("plugins", ())]
        out.write(f"settings {' '.join(parts)}\n")
    out.write(f"input    {shown(snap.input, 100, '         ')}\n\nnodes\n")
    pad = " " * 12
    for n, st in snap.nodeStatus.items():
        run = snap.nodeRuns.get(n, "")
        extra = ""
        fault = snap.faults.get(n) if st == "failed" else None
        if st == "done" and n in snap.outputs:
            extra = shown(snap.outputs[n], 60, pad)
        elif fault is not None:
            extra = f"{fault.errorType}: {shown(fault.message, 50, pad)}"
        elif st == "running" and n in snap.forEach:
            fe = snap.forEach[n]
            extra = f"{sum(r is not None for r in fe.results)}/{len(fe.items)} items finished"
        if st == "running" and not live:
            # Stopped mid-run (paused, killed, failed elsewhere): it runs again when the run resumes.
            st = "interrupted"
        out.write(f"  {st:<11} {n:<22} {run:<26} {extra}".rstrip() + "\n")
        if fault is not None and isinstance(fault.details, dict) and fault.details.get("traceback"):
            trace = str(fault.details["traceback"]).rstrip("\n")
            out.write(pad + trace.replace("\n", "\n" + pad) + "\n")
    if snap.waiting:
        out.write("\nwaiting for a reply\n")
        for n, w in snap.waiting.items():
            hint = (f"a reply was accepted and not delivered; deliver it with: flowkernel resume {snap.runId}"
                    if n in stranded else f"flowkernel reply {snap.runId} --to {w.runId} 'YOUR ANSWER'")
            out.write(f"  {n}: {shown(w.prompt, 80, '    ')}\n    {hint}{again}\n")
    if snap.loopCounters:
        out.write("\nloops\n")
        for e, count in snap.loopCounters.items():
            out.write(f"  {e}: {plural(count, 'iteration')}\n")
    if snap.inbox:
        out.write("\ninbox\n")
        for run_id, msgs in snap.inbox.items():
            out.write(f"  {run_id}: {len(msgs)} undelivered\n")
    if snap.state:
        out.write(f"\nstate    {shown(snap.state, 100, '         ')}\n")


def show_runs(runs: list[RunSummary], out: TextIO, workers: dict[str, str] | None = None) -> None:
    """The runs table; ``workers``: run id -> the worker (or process) executing it, from its lease."""
    if not runs:
        out.write("no runs\n")
        return
    out.write(f"{'RUN':<26} {'FLOW':<18} {'STATUS':<10} {'COST':>9} {'TOKENS':>9}  {'UPDATED':<19} {'PARENT':<26} WORKER\n")
    for r in runs:
        updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.updatedAt / 1000))
        tokens = r.usage.inputTokens + r.usage.outputTokens + r.usage.cacheCreationInputTokens \
            + r.usage.cacheReadInputTokens
        out.write((f"{r.runId:<26} {r.flowName[:18]:<18} {r.status:<10} {'$' + format(r.totalCostUsd, '.4f'):>9} "
                   f"{tokens:>9,}  {updated:<19} {r.parentRunId or '':<26} {(workers or {}).get(r.runId, '')}").rstrip()
                  + "\n")
