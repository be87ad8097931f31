"""Recorded model calls (DESIGN §8): serve them (``MockQuery``), record them (``RecordingQuery``),
and turn any stored run into them (``fixtures_from_run``).

A fixture directory holds one file per node id, ``DIR/<nodeId>.json``::

    {"flow": "review-loop", "node": "planner", "volatile": ["messages[0].content"],
     "calls": [{"call": 0, "input": <request>, "output": <message>, "events": [<agent events>]}]}

``flow``, ``node``, ``volatile`` and each call's ``call`` are optional; ``call`` (the call's index)
is written by the recorders and checked when present, so a hand-edited file with calls out of order
is caught. ``input`` is the request the node sent, ``output`` the final message (content,
stopReason, usage, model, id), ``events`` what the call streamed (``agent:text:delta``,
``agent:thinking:delta``, ``agent:error``).

Which entry serves a call: the i-th model call of node N in a flow run gets the i-th entry of
``N.json`` with the same ``item``. ``i`` is counted from the conversation rows already stored for
that node (and forEach item) in that flow run, not from a counter in memory, so a run resumed in
another process (after a reply, a pause or a crash) continues at the right entry, and a call cut off
before its answer was stored is served again. forEach items run concurrently, so each item has its
own sequence: an entry with ``"item": k`` serves only item k, in order, whatever the interleaving.
A sub-flow (``flow.call``) is its own flow run: its nodes are served from the start of their files
(give its nodes ids distinct from the parent's, or record it into its own directory).
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.errors import FlowkernelError, InvalidInputError, NodeFailure
from kernel.events import BaseEvent, Event, NodeStart, decode, to_dict
from kernel.query import ModelMessage, QueryContext, QueryFn
from kernel.store.base import Store

COMPARED = ("model", "system", "messages", "tools")
STREAMED = frozenset({"agent:text:delta", "agent:thinking:delta", "agent:error"})
# agent:error types the node itself raises (not the model call): never part of a recorded call.
NODE_ERRORS = frozenset({"error_output_schema", "error_tool_use", "error_max_turns", "store_error"})
RECORD_HINT = ("record it with `scripts/record-fixtures --flow FLOW --output DIR`, or write fixtures from a "
               "stored run with `flowkernel fixtures RUN --output DIR`")


class FixtureError(InvalidInputError):
    """A fixture file or directory is unusable (malformed, missing, outside the directory, exists)."""


class FixtureMismatch(NodeFailure):
    """The live request differs from the recorded one, or there is no recorded call for it."""

    def __init__(self, message: str, error_type: str = "fixture_mismatch") -> None:
        super().__init__(message, error_type)


@dataclass(slots=True)
class FixtureCall:
    index: int  # position in the file
    input: dict[str, Any]
    output: dict[str, Any]
    events: list[dict[str, Any]]
    item: int | None = None


@dataclass(slots=True)
class FixtureFile:
    path: Path
    node: str
    calls: list[FixtureCall]
    flow: str | None = None
    volatile: list[str] = field(default_factory=list)

    def calls_for(self, item: int | None) -> list[FixtureCall]:
        return [c for c in self.calls if c.item == item]


# -- reading ----------------------------------------------------------------------------------

def fixture_path(directory: str | Path, node_id: str) -> Path:
    """``DIR/<node_id>.json``; a node id that would leave the directory is refused."""
    root = Path(directory).resolve()
    if not node_id or node_id in (".", "..") or "/" in node_id or "\\" in node_id or "\0" in node_id:
        raise FixtureError(f"fixture for node {node_id!r}: the node id cannot name a file inside {root} "
                           "(fixture files are DIR/<nodeId>.json; path separators and `..` are refused)")
    path = (root / f"{node_id}.json").resolve()
    if path.parent != root:
        raise FixtureError(f"fixture for node {node_id!r}: {path} is outside the fixture directory {root}")
    return path


def _shape_error(path: Path, where: str, problem: str) -> FixtureError:
    return FixtureError(f"{path}: {where}: {problem}")


def load_fixture_file(path: str | Path, node_id: str | None = None) -> FixtureFile:
    """Read and check one fixture file; errors name the file and the field."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FixtureError(f"{p}: no such fixture file; {RECORD_HINT}") from None
    except json.JSONDecodeError as exc:
        raise FixtureError(f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FixtureError(f"{p}: cannot read: {exc}") from None
    node = node_id or p.stem
    if not isinstance(data, dict):
        raise _shape_error(p, "(root)", 'must be an object {"calls": [...]}')
    unknown = sorted(set(data) - {"flow", "node", "volatile", "calls"})
    if unknown:
        raise _shape_error(p, unknown[0], "unknown field; a fixture file has flow, node, volatile and calls")
    if "node" in data and data["node"] != node:
        raise _shape_error(p, "node", f"says {data['node']!r} but the file is for node {node!r} (named <nodeId>.json)")
    flow = data.get("flow")
    if flow is not None and not isinstance(flow, str):
        raise _shape_error(p, "flow", "must be the flow's name (a string)")
    volatile = data.get("volatile", [])
    if not isinstance(volatile, list) or not all(isinstance(v, str) for v in volatile):
        raise _shape_error(p, "volatile", 'must be a list of JSON paths such as "messages[0].content"')
    calls = data.get("calls")
    if not isinstance(calls, list):
        raise _shape_error(p, "calls", "must be a list of {input, output, events}")
    out: list[FixtureCall] = []
    next_index: dict[int | None, int] = {}
    for i, c in enumerate(calls):
        where = f"calls[{i}]"
        if not isinstance(c, dict):
            raise _shape_error(p, where, "must be an object {input, output, events}")
        extra = sorted(set(c) - {"call", "item", "input", "output", "events"})
        if extra:
            raise _shape_error(p, f"{where}.{extra[0]}", "unknown field; a call has call, item, input, output, events")
        for key in ("input", "output"):
            if not isinstance(c.get(key), dict):
                raise _shape_error(p, f"{where}.{key}", "missing, or not an object")
        if not isinstance(c["output"].get("content"), list):
            raise _shape_error(p, f"{where}.output.content", "must be a list of content blocks")
        if not isinstance(c["input"].get("messages"), list):
            raise _shape_error(p, f"{where}.input.messages", "must be the request's list of messages")
        events = c.get("events", [])
        if not isinstance(events, list):
            raise _shape_error(p, f"{where}.events", "must be a list of agent events")
        for j, ev in enumerate(events):
            if not isinstance(ev, dict) or ev.get("type") not in STREAMED:
                raise _shape_error(p, f"{where}.events[{j}]", f"must be an event of type {', '.join(sorted(STREAMED))}")
            try:
                decode(json.dumps(ev))
            except Exception as exc:
                raise _shape_error(p, f"{where}.events[{j}]", f"not a valid {ev['type']} event: {exc}") from None
        item = c.get("item")
        if item is not None and (not isinstance(item, int) or isinstance(item, bool) or item < 0):
            raise _shape_error(p, f"{where}.item", "must be a forEach item index (a non-negative integer)")
        expected = next_index.get(item, 0)
        if "call" in c and c["call"] != expected:
            whose = "" if item is None else f" of item {item}"
            raise _shape_error(p, f"{where}.call", f"is {c['call']!r} but this is call {expected}{whose}: calls are out "
                               "of order (they must be listed in the order the node makes them)")
        next_index[item] = expected + 1
        out.append(FixtureCall(index=i, input=c["input"], output=c["output"], events=events, item=item))
    return FixtureFile(path=p, node=node, calls=out, flow=flow, volatile=list(volatile))


# -- comparing --------------------------------------------------------------------------------

def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def json_diff(recorded: Any, live: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every differing JSON path, with the recorded and the live value (a missing side is ``...``)."""
    if isinstance(recorded, dict) and isinstance(live, dict):
        out: list[tuple[str, Any, Any]] = []
        for k in [*recorded, *(k for k in live if k not in recorded)]:
            out += json_diff(recorded.get(k, ...), live.get(k, ...), _join(path, k))
        return out
    if isinstance(recorded, list) and isinstance(live, list):
        out = []
        for i in range(max(len(recorded), len(live))):
            out += json_diff(recorded[i] if i < len(recorded) else ..., live[i] if i < len(live) else ..., _join(path, i))
        return out
    return [] if recorded == live else [(path or "(root)", recorded, live)]


def _volatile(path: str, patterns: Iterable[str]) -> bool:
    """``path`` is one of ``patterns`` or lies under one; ``*`` stands for any key or index."""
    for pat in patterns:
        regex = re.escape(pat).replace(r"\*", "[^.]*?")
        if re.fullmatch(regex + r"(?:[.\[].*)?", path):
            return True
    return False


def _show(value: Any, width: int = 200) -> str:
    if value is ...:
        return "(absent)"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def compare_request(recorded: dict[str, Any], live: dict[str, Any], volatile: Iterable[str] = ()) -> list[tuple[str, Any, Any]]:
    """The differences that matter: model, system, messages and tools, minus volatile paths."""
    patterns = list(volatile)
    diffs: list[tuple[str, Any, Any]] = []
    for key in COMPARED:
        diffs += json_diff(recorded.get(key, ...), live.get(key, ...), key)
    return [d for d in diffs if not _volatile(d[0], patterns)]


# -- serving ----------------------------------------------------------------------------------

def _event_from(data: dict[str, Any]) -> Event:
    body = {k: v for k, v in data.items() if k not in ("seq", "timestamp", "flowRunId", "nodeId", "runId", "cause")}
    return decode(json.dumps(body))


def _item_of(ctx: QueryContext) -> int | None:
    item = getattr(ctx, "item", None)
    return item if isinstance(item, int) else None


def prior_calls(store: Store, flow_run_id: str, node_id: str, item: int | None) -> int:
    """How many model calls of this node (and forEach item) the flow run has stored answers for."""
    runs: set[str] = set()
    for body in store.read_events(flow_run_id):
        if b'"node:start"' not in body:
            continue
        ev = decode(body)
        if isinstance(ev, NodeStart) and ev.nodeId == node_id and ev.item == item and ev.runId:
            runs.add(ev.runId)
    count, after = 0, 0
    while True:
        rows = store.list_agent_messages(flow_run_id=flow_run_id, after=after, limit=1000)
        count += sum(1 for r in rows if r["role"] == "assistant" and r["nodeId"] == node_id and r["runId"] in runs)
        if len(rows) < 1000:
            return count
        after = int(rows[-1]["id"])


class MockQuery:
    """A ``QueryFn`` that serves recorded calls from a fixture directory and never touches the network.

    ``volatile`` adds JSON paths (patterns such as ``messages[*].content``) whose
    differences are ignored, on top of each file's own ``volatile`` list.
    """

    def __init__(self, directory: str | Path, *, volatile: Iterable[str] = ()) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FixtureError(f"--fixtures {directory}: no such directory; {RECORD_HINT}")
        self.volatile = list(volatile)
        self._files: dict[str, FixtureFile] = {}
        self._served: set[tuple[str, int]] = set()  # (node id, file position)
        self._fallback: dict[tuple[str, str, int | None], int] = {}
        for path in sorted(self.directory.glob("*.json")):  # fail fast on a broken file
            self._files[path.stem] = load_fixture_file(path)

    def file(self, node_id: str) -> FixtureFile | None:
        fixture_path(self.directory, node_id)
        return self._files.get(node_id)

    def unused(self) -> list[tuple[str, FixtureCall]]:
        """Recorded calls that were never served (a run that made fewer calls than recorded)."""
        return [(node, c) for node, f in sorted(self._files.items()) for c in f.calls if (node, c.index) not in self._served]

    def _index(self, ctx: QueryContext, item: int | None) -> int:
        store = getattr(ctx, "store", None)
        if store is not None:
            return prior_calls(store, ctx.flow_run_id, ctx.node_id, item)
        key = (ctx.flow_run_id, ctx.node_id, item)
        n = self._fallback.get(key, 0)
        self._fallback[key] = n + 1
        return n

    async def __call__(self, request: dict[str, Any], emit: Callable[[BaseEvent], None],
                       ctx: QueryContext) -> ModelMessage:
        node = ctx.node_id
        item = _item_of(ctx)
        path = fixture_path(self.directory, node)
        index = self._index(ctx, item)
        whose = f"node {node!r}" + ("" if item is None else f" item {item}")
        fixture = self._files.get(node)
        if fixture is None:
            raise FixtureMismatch(f"{whose}: no fixture file {path} for model call {index}; {RECORD_HINT}",
                                  "fixture_missing")
        flow = getattr(getattr(ctx, "flow", None), "name", None)
        if fixture.flow is not None and isinstance(flow, str) and fixture.flow != flow:
            raise FixtureError(f"{path}: flow: recorded for flow {fixture.flow!r}, but node {node!r} runs in flow "
                               f"{flow!r}; is --fixtures the directory for this flow?")
        calls = fixture.calls_for(item)
        if index >= len(calls):
            raise FixtureMismatch(f"{whose}: model call {index} is not recorded ({path} has {len(calls)} call(s)"
                                  f"{'' if item is None else f' for item {item}'}): the flow now makes an extra "
                                  f"call; {RECORD_HINT}", "fixture_missing")
        call = calls[index]
        diffs = compare_request(call.input, request, [*fixture.volatile, *self.volatile])
        if diffs:
            lines = [f"  {p}: recorded {_show(a)}\n  {' ' * len(p)}  live     {_show(b)}" for p, a, b in diffs[:5]]
            more = f"\n  … and {len(diffs) - 5} more difference(s)" if len(diffs) > 5 else ""
            raise FixtureMismatch(f"{whose}, call {index}: the request differs from the recording in {path} "
                                  f"(calls[{call.index}].input) at {diffs[0][0]}:\n" + "\n".join(lines) + more +
                                  "\nre-record the fixtures, or mark the path volatile if it may change")
        self._served.add((node, call.index))
        for ev in call.events:
            emit(_event_from(ev))
        message: ModelMessage = copy.deepcopy(call.output)  # type: ignore[assignment]
        return message


# -- recording --------------------------------------------------------------------------------

class RecordingQuery:
    """Wraps a real ``QueryFn`` and keeps every call (request, answer, streamed events) per node."""

    def __init__(self, inner: QueryFn, *, on_call: Callable[[str, int | None, int], None] | None = None) -> None:
        self.inner = inner
        self.calls: dict[str, list[dict[str, Any]]] = {}
        self.flows: dict[str, str] = {}
        self._counts: dict[tuple[str, str, int | None], int] = {}
        self._on_call = on_call

    async def __call__(self, request: dict[str, Any], emit: Callable[[BaseEvent], None],
                       ctx: QueryContext) -> ModelMessage:
        streamed: list[dict[str, Any]] = []

        def keep(ev: BaseEvent) -> None:
            emit(ev)
            if ev.type in STREAMED:
                streamed.append(_streamed_dict(ev))

        item = _item_of(ctx)
        key = (ctx.flow_run_id, ctx.node_id, item)
        index = self._counts.get(key, 0)
        if self._on_call is not None:
            self._on_call(ctx.node_id, item, index)
        message = await self.inner(copy.deepcopy(request), keep, ctx)
        self._counts[key] = index + 1
        entry: dict[str, Any] = {"call": index, "input": copy.deepcopy(request),
                                 "output": copy.deepcopy(dict(message)), "events": streamed}
        if item is not None:
            entry["item"] = item
        self.calls.setdefault(ctx.node_id, []).append(entry)
        flow = getattr(getattr(ctx, "flow", None), "name", None)
        if isinstance(flow, str):
            self.flows.setdefault(ctx.node_id, flow)
        return message

    def files(self) -> dict[str, dict[str, Any]]:
        return _documents(self.calls, self.flows)


def _streamed_dict(ev: BaseEvent) -> dict[str, Any]:
    d = to_dict(ev)
    return {k: v for k, v in d.items() if k not in ("seq", "timestamp", "flowRunId", "nodeId", "runId", "cause")}


def _documents(calls: dict[str, list[dict[str, Any]]], flows: dict[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for node, entries in calls.items():
        ordered = sorted(entries, key=lambda e: (e.get("item") is not None, e.get("item") or 0, e["call"]))
        doc: dict[str, Any] = {"flow": flows[node]} if node in flows else {}
        doc.update({"node": node, "calls": ordered})
        out[node] = doc
    return out


def write_fixtures(documents: dict[str, dict[str, Any]], directory: str | Path, *, force: bool = False) -> list[Path]:
    """Write one ``<nodeId>.json`` per node; refuses to overwrite an existing file unless ``force``."""
    root = Path(directory)
    paths = {node: fixture_path(root, node) for node in documents}
    if not force:
        existing = [str(p) for p in paths.values() if p.exists()]
        if existing:
            raise FixtureError(f"{', '.join(existing)}: already exists; pass --force to overwrite")
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for node, doc in sorted(documents.items()):
        tmp = paths[node].with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, paths[node])
        written.append(paths[node])
    return written


# -- from a stored run ------------------------------------------------------------------------

def _request_for(node_input: Any, node_id: str, messages: list[dict[str, Any]], tools: dict[str, Any]) -> dict[str, Any]:
    """The request ``claude.agent`` sends, rebuilt from its resolved input (mirrors ``_Execution._request``)."""
    from kernel.tools import ASK_HUMAN, as_tool
    from nodes.claude_config import build_request, parse_config

    cfg = parse_config(node_input, node_id, {})
    definitions = [as_tool(n, tools[n]).definition() for n in cfg.tools if n != ASK_HUMAN and n in tools]
    return build_request(cfg, messages, definitions)


def _split_streams(events: list[dict[str, Any]], answers: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Give each call of a node run the streamed events that built its answer.

    Calls are sequential, so the deltas of call k are those that spell its text and thinking; an
    ``agent:error`` that announces a retry starts that call's stream over.
    """
    out: list[list[dict[str, Any]]] = []
    pos = 0
    for content in answers:
        want_text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
        want_think = "".join(b.get("thinking", "") for b in content if b.get("type") == "thinking")
        mine: list[dict[str, Any]] = []
        text = think = ""
        while pos < len(events):
            ev = events[pos]
            retry = ev["type"] == "agent:error" and isinstance(ev.get("details"), dict) and ev["details"].get("willRetry")
            if text == want_text and think == want_think and not retry:
                break
            mine.append(ev)
            pos += 1
            if ev["type"] == "agent:text:delta":
                text += ev["content"]
            elif ev["type"] == "agent:thinking:delta":
                think += ev["content"]
            elif retry:
                text = think = ""
        out.append(mine)
    return out


def fixtures_from_run(store: Store, run_id: str, *, tools: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Fixture documents (node id -> file content) rebuilt from a stored run's conversation and events.

    The store keeps each conversation and each node run's resolved input, so the requests are exact;
    ``tools`` (name -> registered tool) supplies the tool definitions. Per-call token usage is not
    stored: each node run's total (from ``agent:complete``) is put on its last call, so costs add up.
    Runs started by ``flow.call`` nodes are included (their node ids share the directory).
    """
    record = store.get_run(run_id)
    calls: dict[str, list[dict[str, Any]]] = {}
    flows: dict[str, str] = {}
    _collect(store, run_id, record.flowName, tools or {}, calls, flows)
    for child in store.list_runs(parent=run_id, limit=100_000):
        for node, entries in fixtures_from_run(store, child.runId, tools=tools).items():
            calls.setdefault(node, []).extend(entries["calls"])
            if "flow" in entries:
                flows.setdefault(node, entries["flow"])
    return _documents(calls, flows)


def _collect(store: Store, run_id: str, flow_name: str, tools: dict[str, Any],
             calls: dict[str, list[dict[str, Any]]], flows: dict[str, str]) -> None:
    starts: dict[str, NodeStart] = {}
    streamed: dict[str, list[dict[str, Any]]] = {}
    totals: dict[str, tuple[dict[str, int], dict[str, Any] | None]] = {}
    for body in store.read_events(run_id):
        ev = decode(body)
        if isinstance(ev, NodeStart) and ev.runId:
            starts[ev.runId] = ev
        elif ev.type in STREAMED and ev.runId:
            d = _streamed_dict(ev)
            if not (ev.type == "agent:error" and d.get("errorType") in NODE_ERRORS):
                streamed.setdefault(ev.runId, []).append(d)
        elif ev.type == "agent:complete" and ev.runId:
            totals[ev.runId] = (dict(getattr(ev, "usage", {}) or {}), getattr(ev, "modelUsage", None))
    rows: list[dict[str, Any]] = []
    after = 0
    while True:
        page = store.list_agent_messages(flow_run_id=run_id, after=after, limit=1000)
        rows += page
        if len(page) < 1000:
            break
        after = int(page[-1]["id"])
    sessions: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        sessions.setdefault(row["sessionId"], []).append(row)
    per_run: dict[str, list[tuple[dict[str, Any], list[dict[str, Any]]]]] = {}  # node run -> [(row, msgs)]
    for session_rows in sessions.values():
        conversation: list[dict[str, Any]] = []
        for row in session_rows:
            if row["role"] == "system":
                continue
            if row["role"] == "assistant":
                per_run.setdefault(row["runId"], []).append((row, copy.deepcopy(conversation)))
            conversation.append({"role": row["role"], "content": row["content"]})
    counters: dict[tuple[str, int | None], int] = {}
    ordered = sorted(per_run.items(), key=lambda kv: kv[1][0][0]["id"])
    for node_run, answered in ordered:
        start = starts.get(node_run)
        if start is None:
            raise FlowkernelError(f"run {run_id}: agent messages of node run {node_run} have no node:start event")
        node = start.nodeId or ""
        streams = _split_streams(streamed.get(node_run, []), [row["content"] for row, _ in answered])
        usage, model_usage = totals.get(node_run, ({}, None))
        model = next(iter(model_usage)) if model_usage and len(model_usage) == 1 else None
        for i, ((row, messages), events) in enumerate(zip(answered, streams, strict=True)):
            request = _request_for(start.input, node, messages, tools)
            key = (node, start.item)
            index = counters.get(key, 0)
            counters[key] = index + 1
            content = row["content"]
            last = i == len(answered) - 1
            stop = "tool_use" if any(b.get("type") == "tool_use" for b in content) else "end_turn"
            keys = ("inputTokens", "outputTokens", "cacheCreationInputTokens", "cacheReadInputTokens")
            entry: dict[str, Any] = {
                "call": index, "input": request,
                "output": {"content": content, "stopReason": stop,
                           "usage": {k: int(usage.get(k, 0)) if last else 0 for k in keys},
                           "model": model or request["model"], "id": f"msg_{node_run}_{row['step']}"},
                "events": events}
            if start.item is not None:
                entry["item"] = start.item
            calls.setdefault(node, []).append(entry)
            flows.setdefault(node, flow_name)
