"""Human-readable output: the live view of a run, snapshots and run lists."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from typing import Any, TextIO

from flowkernel.events import BaseEvent, to_dict
from flowkernel.snapshot import RunSnapshot
from flowkernel.store.base import RunRecord
from flowkernel.summaries import RunSummary


def cost_line(run: RunSummary) -> str:
    """``$0.0123  1,204 in / 310 out tokens (cache: 0 written, 800 read)``."""
    u = run.usage
    return (f"${run.totalCostUsd:.4f}  {u.inputTokens:,} in / {u.outputTokens:,} out tokens "
            f"(cache: {u.cacheCreationInputTokens:,} written, {u.cacheReadInputTokens:,} read)")


def _color(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("NO_COLOR") is None


def preview(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


class LiveView:
    """Prints one readable line per event as a run progresses; agent text streams inline."""

    def __init__(self, stream: TextIO | None = None, *, started: float | None = None) -> None:
        self.out = stream or sys.stdout
        self.color = _color(self.out)
        self.t0 = started or time.monotonic()
        self.counts: Counter[str] = Counter()
        self._streaming: str | None = None

    def _c(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def _line(self, mark: str, who: str, what: str) -> None:
        self._end_stream()
        elapsed = f"{time.monotonic() - self.t0:7.2f}s"
        self.out.write(f"{self._c('2', elapsed)} {mark} {who:<22} {what}\n")
        self.out.flush()

    def _end_stream(self) -> None:
        if self._streaming is not None:
            self.out.write("\n")
            self._streaming = None

    def __call__(self, ev: BaseEvent) -> None:
        d = to_dict(ev)
        t = ev.type
        node = d.get("nodeId") or ""
        item = f"[{d['item']}]" if d.get("item") is not None else ""
        who = f"{node}{item}"
        if t == "flow:start":
            self._line(self._c("1", "▶"), d["flowName"], f"run {d['flowRunId']}  input {preview(d.get('input'), 50)}")
        elif t == "node:start":
            attempt = f" (attempt {d['attempt']})" if d.get("attempt", 1) > 1 else ""
            resumed = f" resumed from {d['resumedFrom']}" if d.get("resumedFrom") else ""
            self._line(self._c("36", "●"), who, f"started {d.get('runId', '')}{attempt}{resumed}")
        elif t == "node:complete":
            self.counts["done"] += 1
            self._line(self._c("32", "✔"), who, f"done in {d.get('durationMs', 0)} ms → {preview(d.get('output'))}")
        elif t == "node:error":
            retry = ", will retry" if d.get("willRetry") else ""
            self._line(self._c("31", "✖"), who, f"{d['errorType']}: {preview(d['message'], 70)}{retry}")
        elif t == "node:skipped":
            self.counts["skipped"] += 1
            self._line(self._c("2", "○"), who, f"skipped ({d['reason']})")
        elif t == "node:waiting":
            self._line(self._c("33", "…"), who, f"waiting: {preview(d.get('prompt'), 70)}")
        elif t == "edge:fire":
            extra = f" with {len(d['items'])} items" if d.get("items") is not None else ""
            self._line(self._c("2", "→"), f"{d['from']} → {d['to']}", f"fired{extra}")
        elif t == "edge:skip":
            self._line(self._c("2", "↛"), f"{d['from']} → {d['to']}", "skipped")
        elif t == "loop:iterate":
            self._line(self._c("35", "↻"), d["edgeId"], f"loop iteration {d['iteration']}")
        elif t == "loop:exhausted":
            self._line(self._c("35", "↻"), d["edgeId"], f"loop exhausted after {d['iteration']} iterations")
        elif t == "state:patch":
            self._line(self._c("2", "≡"), f"state.{d['path']}", f"{d['op']} {preview(d.get('value'), 50)}")
        elif t in ("agent:text:delta", "agent:thinking:delta"):
            key = f"{node}:{t}"
            if self._streaming != key:
                self._end_stream()
                label = "thinks" if "thinking" in t else "says"
                self.out.write(f"{' ' * 9}{self._c('34', '│')} {node} {label}: ")
                self._streaming = key
            # Continuation lines stay under the gutter so the stream reads as one block.
            text = d["content"].replace("\n", "\n" + " " * 9 + self._c("34", "│") + "   ")
            self.out.write(self._c("2", text) if "thinking" in t else text)
            self.out.flush()
        elif t in ("agent:text", "agent:thinking"):
            self._line(self._c("34", "│"), who, preview(d["content"], 80))
        elif t == "agent:start":
            self._line(self._c("34", "◆"), who, f"agent {d['model']} session {d['sessionId']}")
        elif t == "agent:tool":
            err = f" error: {preview(d['error'], 40)}" if d.get("error") else ""
            self._line(self._c("34", "⚙"), who, f"{d['toolName']}({preview(d.get('toolInput'), 30)}) → "
                                               f"{preview(d.get('toolOutput'), 30)} {d.get('durationMs', 0)} ms{err}")
        elif t == "agent:error":
            self._line(self._c("31", "!"), who, f"{d['errorType']}: {preview(d['message'], 70)}")
        elif t == "agent:complete":
            u = d.get("usage", {})
            self._line(self._c("34", "◆"), who, f"agent done: {d.get('numTurns', 0)} turns, "
                                               f"{u.get('inputTokens', 0)} in / {u.get('outputTokens', 0)} out tokens, "
                                               f"${d.get('totalCostUsd', 0):.4f}")
        elif t == "command:received":
            verdict = "accepted" if d["accepted"] else f"refused: {d.get('reason')}"
            self._line(self._c("33", "⌘"), d["command"], verdict)
        elif t in ("flow:paused", "flow:resumed", "flow:waiting"):
            why = d.get("reason") or d.get("message") or ""
            self._line(self._c("33", "‖" if t != "flow:resumed" else "▶"), t.split(":")[1], why)
        elif t == "flow:complete":
            status = d["status"]
            code = "32" if status == "completed" else "31"
            err = f": {d['error']}" if d.get("error") else ""
            self._line(self._c(code, "■"), status, f"{self.counts['done']} done, {self.counts['skipped']} skipped{err}")


def show_snapshot(record: RunRecord, snap: RunSnapshot, out: TextIO, summary: RunSummary | None = None, *,
                  again: str = "") -> None:
    """A readable picture of a run: status, cost, nodes, what it waits for, loops and state. ``again``
    ends the commands it prints (the store option, so they work as printed)."""
    out.write(f"run      {record.runId}\nflow     {record.flowName}  ({record.flowHash[:19]}…)\n")
    out.write(f"status   {snap.status}" + (f"  error: {snap.error}" if snap.error else "") + "\n")
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
    out.write(f"input    {preview(snap.input, 100)}\n\nnodes\n")
    for n, st in snap.nodeStatus.items():
        run = snap.nodeRuns.get(n, "")
        extra = ""
        if st == "done" and n in snap.outputs:
            extra = preview(snap.outputs[n], 60)
        elif st == "failed" and n in snap.faults:
            extra = f"{snap.faults[n].errorType}: {preview(snap.faults[n].message, 50)}"
        elif st == "running" and n in snap.forEach:
            fe = snap.forEach[n]
            extra = f"{sum(r is not None for r in fe.results)}/{len(fe.items)} items finished"
        out.write(f"  {st:<8} {n:<22} {run:<26} {extra}\n")
    if snap.waiting:
        out.write("\nwaiting for a reply\n")
        for n, w in snap.waiting.items():
            out.write(f"  {n}: {preview(w.prompt, 80)}\n    flowkernel reply {snap.runId} --to {w.runId} 'YOUR ANSWER'{again}\n")
    if snap.loopCounters:
        out.write("\nloops\n")
        for e, count in snap.loopCounters.items():
            out.write(f"  {e}: {count} iterations\n")
    if snap.inbox:
        out.write("\ninbox\n")
        for run_id, msgs in snap.inbox.items():
            out.write(f"  {run_id}: {len(msgs)} undelivered\n")
    if snap.state:
        out.write(f"\nstate    {preview(snap.state, 100)}\n")


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
