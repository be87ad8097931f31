"""``runs``, ``show``, ``events`` and ``replay``: looking at stored runs."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from flowkernel.cli.arguments import positive_int
from flowkernel.cli.session import (
    EXIT_FAILED,
    EXIT_OK,
    add_db,
    add_json,
    opened,
    printer,
    run_async,
    store_option,
)

if TYPE_CHECKING:
    from flowkernel.run.kernel import Kernel

RUNS_SHOWN = 50  # `runs` lists this many unless --limit says otherwise


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("runs", help="list runs")
    sp.add_argument("--status", choices=["queued", "running", "interrupted", "paused", "waiting", "completed",
                                         "failed", "aborted"],
                    help="`interrupted`: running, but no process executes it (killed; `resume` continues it)")
    sp.add_argument("--parent", metavar="RUN", help="only the children of RUN")
    sp.add_argument("--limit", type=positive_int, default=RUNS_SHOWN, metavar="N",
                    help=f"list the N newest (default {RUNS_SHOWN}); how many more there are, and the command "
                         "that lists them all, goes to stderr")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_runs)

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
    sp.add_argument("--full", action="store_true",
                    help="outputs, prompts, state, errors and messages whole, not cut to a line")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_show)

    sp = sub.add_parser("events", help="print a run's events")
    sp.add_argument("run")
    sp.add_argument("--follow", "-f", action="store_true",
                    help="keep printing until the run ends (through waits and pauses; Ctrl-C stops)")
    sp.add_argument("--after", type=int, default=0, metavar="SEQ")
    sp.add_argument("--wall", action="store_true", help="wall-clock times instead of the time since the run started")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_events)

    sp = sub.add_parser("replay", help="play back a run's stored events and rebuild its snapshot (calls nothing)")
    sp.add_argument("run")
    sp.add_argument("--speed", type=float, default=0.0, metavar="X",
                    help="pace by the recorded timestamps, X times faster (0: no pacing)")
    sp.add_argument("--wall", action="store_true", help="wall-clock times instead of the time since the run started")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_replay)


def cmd_runs(args: argparse.Namespace) -> int:
    from flowkernel.history.summaries import detail_view, summaries

    with opened(args, readonly=True) as kernel:
        # `running` lists the runs a process executes; `interrupted` the others (as the API's ?status=)
        records, key = kernel.run_records(status=args.status, parent=args.parent, limit=args.limit)
        shown = summaries(kernel.store, records, kernel.interrupted)
        # Who executes each run: the owner of its live lease, a worker id as `flowkernel workers` lists it
        # (or a `flowkernel run` process's).
        holders = {r.runId: r.leaseOwner for r in records if r.leaseOwner and kernel.executed(r)}
        if args.json:
            import json

            for r, s in zip(records, shown, strict=True):
                print(json.dumps({**detail_view(r, s), "workerId": holders.get(r.runId)}, ensure_ascii=False))
        else:
            from flowkernel.cli.show import show_runs

            show_runs(shown, sys.stdout, holders)
        if key is not None:
            _more_runs(args, kernel.count_runs(status=args.status, parent=args.parent, before=key))
        return EXIT_OK


def _more_runs(args: argparse.Namespace, more: int) -> None:
    """Say how many runs the list left out, and the command that lists them all (it works as printed)."""
    import shlex

    from flowkernel.cli.wording import plural

    sys.stdout.flush()  # the line comes after the list, wherever both streams go
    options = "".join(f" --{name} {shlex.quote(value)}" for name, value in
                      (("status", args.status), ("parent", args.parent)) if value)
    json_option = " --json" if args.json else ""
    print(f"flowkernel: … {plural(more, 'more run')} not listed; all of them: flowkernel runs{options} "
          f"--limit {args.limit + more}{json_option}{store_option(args)}", file=sys.stderr)


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
        from flowkernel.cli.show import preview, whole

        for m in page["items"]:
            print(f"#{m['id']:<5} step {m['step']:<3} {m['role']:<9} {m['nodeId']:<16} {m['runId']}")
            print(f"       {whole(m['content'], ' ' * 7) if args.full else preview(m['content'], 110)}")
    else:
        from flowkernel.cli.show import preview, whole

        def cut(value: Any) -> str:
            return whole(value, " " * 11) if args.full else preview(value, 100)

        for c in page["items"]:
            print(f"#{c['id']:<5} step {c['step']:<3} {c['toolName']:<16} {c['status']:<9} "
                  f"{c.get('durationMs') or 0:>6} ms  {c['runId']}")
            print(f"       in  {cut(c.get('input'))}\n       out {cut(c.get('output'))}")
    if page["nextCursor"] is not None:
        more = "--messages" if args.messages else "--tool-calls"
        print(f"flowkernel: more: flowkernel show {args.run} {more} --after {page['nextCursor']}", file=sys.stderr)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    with opened(args, readonly=True) as kernel:
        if args.messages or args.tool_calls:
            return _show_history(kernel, args)
        if args.json:
            import json

            print(json.dumps(kernel.detail(args.run, at=args.at), ensure_ascii=False))
        else:
            from flowkernel.cli.show import show_snapshot

            record = kernel.store.get_run(args.run)
            snap = kernel.snapshot(args.run, at=args.at)
            children = kernel.runs(parent=args.run)
            show_snapshot(record, snap, sys.stdout, kernel.summary(args.run), again=store_option(args),
                          live=args.at is not None or kernel.executed(record), full=args.full)
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
    with opened(args, readonly=True) as kernel:
        kernel.store.get_run(args.run)
        emit = printer(args, lambda until: kernel.events(args.run, until=min(until, args.after)))
        if not args.follow:
            for ev in kernel.events(args.run, after=args.after):
                emit(ev)
            return EXIT_OK

        async def follow() -> None:
            async for ev in kernel.follow(args.run, after=args.after):
                emit(ev)
        try:
            run_async(follow)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a follow of a run that waits ends; the run is not touched
        return EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    import time

    from flowkernel.core.reducer import fold
    from flowkernel.errors import InvalidInputError

    if args.speed < 0:
        raise InvalidInputError(f"--speed {args.speed:g}: must be 0 (no pacing) or a positive factor")
    emit = printer(args)
    with opened(args, readonly=True) as kernel:
        flows = kernel.flows_of(kernel.store.get_run(args.run))
        events = kernel.events(args.run)
        stored = kernel.snapshot(args.run)
        snap = None
        previous = events[0].timestamp if events else 0
        for ev in events:
            if args.speed > 0:
                time.sleep(max(0.0, (ev.timestamp - previous) / 1000 / args.speed))
                previous = ev.timestamp
            emit(ev)
            # The flow in effect so far: the run's first, or the one a flow:updated switched to.
            flow = flows(snap.flowHash if snap is not None else getattr(ev, "flowHash", ""))
            snap = fold(flow, [ev], snap, flows=flows)
        matches = snap == stored
        note = "matches the stored snapshot" if matches else "DIFFERS from the stored snapshot"
        from flowkernel.cli.wording import plural

        print(f"flowkernel: replayed {plural(len(events), 'event')}; rebuilt snapshot {note}", file=sys.stderr)
        return EXIT_OK if matches else EXIT_FAILED

