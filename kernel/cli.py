"""``flowkernel``: the command line, a thin layer over ``kernel.api``.

Exit codes: 0 completed, 1 failed or error, 2 invalid input, 3 paused or waiting.
Heavy modules are imported inside the commands so ``flowkernel --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernel.api import Kernel
    from kernel.events import BaseEvent
    from kernel.snapshot import RunSnapshot

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_STOPPED = 0, 1, 2, 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowkernel", description="Run JSON agent workflows with durable, resumable snapshots.")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import a module that registers functions, tools or node types (repeatable)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def db(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--db", metavar="URL", help="store: a SQLite path (default .flowkernel/runs.db, or "
                                                     "$FLOWKERNEL_DB) or postgresql://…")

    def js(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--json", action="store_true", help="one JSON object per line")

    sp = sub.add_parser("validate", help="check a flow file and report every problem")
    sp.add_argument("flow")
    sub.add_parser("schema", help="print the JSON Schema of flow files")

    sp = sub.add_parser("run", help="run a flow, showing its progress")
    sp.add_argument("flow")
    sp.add_argument("--input", action="append", default=[], metavar="K=V", help="an input value (JSON or text)")
    sp.add_argument("--input-json", metavar="FILE", help="the run input as a JSON file")
    sp.add_argument("--fixtures", metavar="DIR", help="serve model calls from recorded fixtures (no network)")
    db(sp)
    js(sp)

    sp = sub.add_parser("runs", help="list runs")
    sp.add_argument("--status", choices=["running", "paused", "waiting", "completed", "failed", "aborted"])
    sp.add_argument("--parent", metavar="RUN", help="only the children of RUN")
    sp.add_argument("--limit", type=int, default=50)
    db(sp)
    js(sp)

    sp = sub.add_parser("show", help="show a run's snapshot, or its agents' messages and tool calls")
    sp.add_argument("run")
    sp.add_argument("--at", type=int, metavar="SEQ", help="the snapshot as it was after event SEQ")
    sp.add_argument("--messages", action="store_true", help="list the stored agent messages")
    sp.add_argument("--tool-calls", action="store_true", help="list the stored tool calls")
    sp.add_argument("--node-run", metavar="NODE_RUN_ID", help="only this node run's (nr_…)")
    sp.add_argument("--tool", metavar="NAME", help="tool calls of this tool only")
    sp.add_argument("--tool-status", choices=["completed", "error"], help="tool calls with this status only")
    sp.add_argument("--after", type=int, default=0, metavar="CURSOR", help="the page after this cursor")
    sp.add_argument("--limit", type=int, default=50, help="rows per page (default 50)")
    db(sp)
    js(sp)

    sp = sub.add_parser("events", help="print a run's events")
    sp.add_argument("run")
    sp.add_argument("--follow", "-f", action="store_true", help="keep printing until the run stops")
    sp.add_argument("--after", type=int, default=0, metavar="SEQ")
    db(sp)
    js(sp)

    sp = sub.add_parser("replay", help="play back a run's stored events and rebuild its snapshot (calls nothing)")
    sp.add_argument("run")
    sp.add_argument("--speed", type=float, default=0.0, metavar="X",
                    help="pace by the recorded timestamps, X times faster (0: no pacing)")
    db(sp)
    js(sp)

    sp = sub.add_parser("resume", help="continue a paused, waiting or interrupted run")
    sp.add_argument("run")
    sp.add_argument("--message", default="continue", help="delivered to every interrupted node run")
    sp.add_argument("--fixtures", metavar="DIR")
    db(sp)
    js(sp)

    sp = sub.add_parser("retry", help="re-run the failed nodes of a failed run")
    sp.add_argument("run")
    sp.add_argument("--fixtures", metavar="DIR")
    db(sp)
    js(sp)

    for name, helptext in (("send", "send a message to a live node run"),
                           ("reply", "answer a node run that waits for a reply")):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("run")
        sp.add_argument("--to", metavar="NODE_RUN_ID", help="the node run (nr_…) it is for")
        sp.add_argument("text")
        sp.add_argument("--fixtures", metavar="DIR")
        db(sp)
        js(sp)

    sp = sub.add_parser("fixtures", help="write a stored run's model calls as fixture files")
    sp.add_argument("run")
    sp.add_argument("--output", required=True, metavar="DIR", help="the fixture directory (one <nodeId>.json each)")
    sp.add_argument("--force", action="store_true", help="overwrite fixture files that exist")
    db(sp)

    sp = sub.add_parser("rerun", help="execute a run's flow again from its own recorded model calls and "
                                      "report the first divergence")
    sp.add_argument("run")
    db(sp)
    js(sp)

    sp = sub.add_parser("fork", help="start a new run from the snapshot after event SEQ")
    sp.add_argument("run")
    sp.add_argument("--at", type=int, required=True, metavar="SEQ")
    sp.add_argument("--input", action="append", default=[], metavar="K=V", help="change an input value")
    sp.add_argument("--fixtures", metavar="DIR")
    db(sp)
    js(sp)

    for name, helptext in (("pause", "pause a run (running nodes are interrupted)"),
                           ("abort", "abort a run for good")):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("run")
        sp.add_argument("--reason")
        db(sp)
        js(sp)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return EXIT_INVALID
    from kernel.errors import FlowkernelError

    try:
        from kernel.registry import default_registry, load_plugins

        plugins = list(args.plugin)
        if plugins and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # like `python -m`: a project's own plugin modules import
        default_registry()
        load_plugins(plugins)
        handler = globals()[f"cmd_{args.command}"]
        code: int = handler(args)
        return code
    except FlowkernelError as exc:
        print(f"flowkernel: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("flowkernel: interrupted; `flowkernel resume RUN` continues the run", file=sys.stderr)
        return EXIT_FAILED


@contextmanager
def _opened(args: argparse.Namespace, *, create: bool = False) -> Iterator[Kernel]:
    """The kernel for one command, its store closed however the command ends."""
    kernel = _kernel(args, create=create)
    try:
        yield kernel
    finally:
        kernel.close()


def _kernel(args: argparse.Namespace, *, create: bool = False) -> Kernel:
    from kernel.api import Kernel
    from kernel.store.open import open_store

    services: dict[str, Any] = {}
    fixtures = getattr(args, "fixtures", None)
    if fixtures:
        from kernel.testing.fixtures import MockQuery

        services["fixtures"] = fixtures
        services["query_fn"] = MockQuery(fixtures)
    return Kernel(open_store(args.db, create=create), services=services)


def _printer(args: argparse.Namespace) -> Any:
    if args.json:
        from kernel.events import encode

        def emit(ev: BaseEvent) -> None:
            try:
                sys.stdout.write(encode(ev).decode() + "\n")
                sys.stdout.flush()
            except BrokenPipeError:
                _stdout_closed()
        return emit
    from kernel.render import LiveView

    view = LiveView(sys.stdout)

    def show(ev: BaseEvent) -> None:
        try:
            view(ev)
        except BrokenPipeError:
            _stdout_closed()
    return show


def _stdout_closed() -> None:
    """The reader went away (``| head``): stop printing, keep the run going, exit quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _exit_for(snap: RunSnapshot, run_id: str) -> int:
    if snap.status == "completed":
        return EXIT_OK
    if snap.status in ("paused", "waiting"):
        if snap.status == "waiting":
            for n, w in snap.waiting.items():
                print(f"flowkernel: {n} waits for a reply: flowkernel reply {run_id} --to {w.runId} 'ANSWER'",
                      file=sys.stderr)
        else:
            print(f"flowkernel: paused; continue with: flowkernel resume {run_id}", file=sys.stderr)
        return EXIT_STOPPED
    if snap.status == "failed":
        print(f"flowkernel: run {run_id} failed: {snap.error}; re-run its failed nodes with: "
              f"flowkernel retry {run_id}", file=sys.stderr)
    return EXIT_FAILED


def _run_async(fn: Any, *a: Any, **kw: Any) -> Any:
    import anyio

    return anyio.run(lambda: fn(*a, **kw))


def cmd_validate(args: argparse.Namespace) -> int:
    from kernel.compiler import load_flow
    from kernel.registry import default_registry

    flow = load_flow(args.flow, node_types=default_registry().node_types)
    print(f"{args.flow}: ok — flow {flow.name!r}, {len(flow.nodes)} nodes, {len(flow.edges)} edges")
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from kernel.flow import json_schema

    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from kernel.api import parse_inputs
    from kernel.compiler import load_flow
    from kernel.registry import default_registry

    # Everything about the input is checked before the store is touched.
    flow = load_flow(args.flow, node_types=default_registry().node_types)
    value = parse_inputs(flow, args.input, args.input_json)
    from kernel.api import Kernel

    Kernel.check_input(flow, value)
    with _opened(args, create=True) as kernel:
        snap = _run_async(kernel.run, flow, value, on_event=_printer(args))
        return _exit_for(snap, snap.runId)


def cmd_runs(args: argparse.Namespace) -> int:
    with _opened(args) as kernel:
        records = kernel.runs(status=args.status, parent=args.parent, limit=args.limit)
        if args.json:
            import msgspec

            for r in records:
                print(msgspec.json.encode(r).decode())
        else:
            from kernel.render import show_runs

            show_runs(records, sys.stdout)
        return EXIT_OK


def _show_history(kernel: Kernel, args: argparse.Namespace) -> int:
    """``show --messages`` / ``--tool-calls``: one page, with the cursor for the next."""
    import json

    kernel.store.get_run(args.run)
    scope: dict[str, Any] = {"run_id": args.node_run} if args.node_run else {"flow_run_id": args.run}
    if args.messages:
        page = kernel.messages(**scope, after=args.after, limit=args.limit)
    else:
        page = kernel.tool_calls(**scope, tool_name=args.tool, status=args.tool_status, after=args.after,
                                 limit=args.limit)
    if args.json:
        for item in page["items"]:
            print(json.dumps(item, ensure_ascii=False))
    elif not page["items"]:
        print("no messages" if args.messages else "no tool calls")
    elif args.messages:
        from kernel.render import preview

        for m in page["items"]:
            print(f"#{m['id']:<5} step {m['step']:<3} {m['role']:<9} {m['nodeId']:<16} {m['runId']}")
            print(f"       {preview(m['content'], 110)}")
    else:
        from kernel.render import preview

        for c in page["items"]:
            print(f"#{c['id']:<5} step {c['step']:<3} {c['toolName']:<16} {c['status']:<9} "
                  f"{c.get('durationMs') or 0:>6} ms  {c['runId']}")
            print(f"       in  {preview(c.get('input'), 100)}\n       out {preview(c.get('output'), 100)}")
    if page["nextCursor"] is not None:
        more = "--messages" if args.messages else "--tool-calls"
        print(f"flowkernel: more: flowkernel show {args.run} {more} --after {page['nextCursor']}", file=sys.stderr)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    with _opened(args) as kernel:
        if args.messages or args.tool_calls:
            return _show_history(kernel, args)
        record = kernel.store.get_run(args.run)
        snap = kernel.snapshot(args.run, at=args.at)
        children = kernel.runs(parent=args.run)
        if args.json:
            import msgspec

            print(msgspec.json.encode({"run": record, "snapshot": snap,
                                       "children": [c.runId for c in children]}).decode())
        else:
            from kernel.render import show_snapshot

            show_snapshot(record, snap, sys.stdout)
            if snap.agentSessions:
                print("\nagents   (flowkernel show RUN --messages | --tool-calls [--node-run NR])")
                for node, session in snap.agentSessions.items():
                    print(f"  {node:<22} session {session}")
            if children:
                print("\nchildren")
                for c in children:
                    print(f"  {c.runId}  {c.flowName}  {c.status}  (node run {c.parentNodeRunId})")
        return EXIT_OK


def cmd_events(args: argparse.Namespace) -> int:
    emit = _printer(args)
    with _opened(args) as kernel:
        if args.follow:
            async def follow() -> None:
                async for ev in kernel.follow(args.run, after=args.after):
                    emit(ev)
            _run_async(follow)
        else:
            for ev in kernel.events(args.run, after=args.after):
                emit(ev)
        return EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    import time

    from kernel.reducer import fold

    emit = _printer(args)
    with _opened(args) as kernel:
        flow = kernel.flow_of(args.run)
        events = kernel.events(args.run)
        stored = kernel.snapshot(args.run)
        snap = None
        previous = events[0].timestamp if events else 0
        for ev in events:
            if args.speed > 0:
                time.sleep(max(0.0, (ev.timestamp - previous) / 1000 / args.speed))
                previous = ev.timestamp
            emit(ev)
            snap = fold(flow, [ev], snap)
        matches = snap == stored
        note = "matches the stored snapshot" if matches else "DIFFERS from the stored snapshot"
        print(f"flowkernel: replayed {len(events)} events; rebuilt snapshot {note}", file=sys.stderr)
        return EXIT_OK if matches else EXIT_FAILED


def cmd_resume(args: argparse.Namespace) -> int:
    with _opened(args) as kernel:
        snap = _run_async(kernel.resume, args.run, args.message, on_event=_printer(args))
        return _exit_for(snap, args.run)


def cmd_retry(args: argparse.Namespace) -> int:
    with _opened(args) as kernel:
        snap = _run_async(kernel.retry, args.run, on_event=_printer(args))
        return _exit_for(snap, args.run)


def cmd_fixtures(args: argparse.Namespace) -> int:
    from kernel.testing.fixtures import fixtures_from_run, write_fixtures

    with _opened(args) as kernel:
        kernel.store.get_run(args.run)
        documents = fixtures_from_run(kernel.store, args.run, tools=kernel.registry.tools)
        if not documents:
            print(f"flowkernel: run {args.run} made no model calls; nothing to write", file=sys.stderr)
            return EXIT_OK
        for path in write_fixtures(documents, args.output, force=args.force):
            print(path)
        return EXIT_OK


def cmd_rerun(args: argparse.Namespace) -> int:
    from kernel.timetravel import rerun

    with _opened(args) as kernel:
        report = _run_async(rerun, kernel, args.run)
        if args.json:
            import json

            d = report.divergence
            print(json.dumps({"runId": report.run_id, "rerunId": report.rerun_id, "matches": report.matches,
                              "status": report.snapshot.status,
                              "divergence": None if d is None else {"kind": d.kind, "seq": d.seq, "message": d.message}}))
        else:
            print(report.describe())
        return EXIT_OK if report.matches else EXIT_FAILED


def cmd_fork(args: argparse.Namespace) -> int:
    from kernel.api import parse_inputs
    from kernel.timetravel import fork

    with _opened(args) as kernel:
        changes = parse_inputs(kernel.flow_of(args.run), args.input, None) if args.input else None
        snap = _run_async(fork, kernel, args.run, args.at, input=changes, on_event=_printer(args))
        print(f"flowkernel: fork {snap.runId} of {args.run} at seq {args.at}", file=sys.stderr)
        return _exit_for(snap, snap.runId)


def _command(args: argparse.Namespace, kind: str) -> int:
    from kernel.commands import Command

    with _opened(args) as kernel:
        cmd = Command(kind=kind, target=getattr(args, "to", None), content=getattr(args, "text", None),
                      reason=getattr(args, "reason", None))
        _run_async(kernel.command, args.run, cmd)
        print(f"flowkernel: {kind} accepted by run {args.run}", file=sys.stderr)
        if kind in ("reply", "send") and kernel.store.get_run(args.run).leaseOwner is None:
            # Nobody executes the run: continue it here, streaming like `run` does.
            snap = _run_async(kernel.execute, args.run, on_event=_printer(args),
                              before=_resume_if_stopped)
            return _exit_for(snap, args.run)
        return EXIT_OK


def _resume_if_stopped(snap: RunSnapshot) -> list[BaseEvent]:
    from kernel.events import FlowResumed

    if snap.status in ("waiting", "running"):
        return [FlowResumed(message=None)]
    return []


def cmd_send(args: argparse.Namespace) -> int:
    return _command(args, "send")


def cmd_reply(args: argparse.Namespace) -> int:
    return _command(args, "reply")


def cmd_pause(args: argparse.Namespace) -> int:
    return _command(args, "pause")


def cmd_abort(args: argparse.Namespace) -> int:
    return _command(args, "abort")


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
