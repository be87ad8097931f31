"""``resume``, ``retry``, ``send``, ``reply``, ``pause`` and ``abort``: commands to a run."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flowkernel.cli.session import (
    EXIT_OK,
    add_db,
    add_json,
    exit_for,
    opened,
    printer,
    run_async,
)

_FLOW_HELP = ("continue on this (updated) flow file: every node that has run and every edge decided must "
              "keep its id; the run records flow:updated")


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("resume", help="continue a paused, waiting, interrupted or failed run")
    sp.add_argument("run")
    sp.add_argument("--message", default="continue",
                    help="delivered to every interrupted node run (and, on a failed run, to each failed one)")
    sp.add_argument("--budget", type=_usd, metavar="USD",
                    help="the new limit (US dollars) for what paused the run for its budget: a node's "
                         "policy.maxCostUsd, else the run's budget.maxCostUsd")
    sp.add_argument("--fixtures", metavar="DIR")
    sp.add_argument("--flow", metavar="FILE", help=_FLOW_HELP)
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_resume)

    sp = sub.add_parser("retry", help="re-run the failed nodes of a failed run")
    sp.add_argument("run")
    sp.add_argument("--fixtures", metavar="DIR")
    sp.add_argument("--flow", metavar="FILE", help=_FLOW_HELP)
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_retry)

    for name, helptext, handler in (("send", "send a message to a live node run", cmd_send),
                                    ("reply", "answer a node run that waits for a reply", cmd_reply)):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("run")
        sp.add_argument("--to", metavar="NODE_RUN_ID|NODE",
                        help="the node run (nr_…) it is for, or a node id when exactly one node run of that node "
                             "can take it" + (" (the one waiting)" if name == "reply" else ""))
        sp.add_argument("text")
        sp.add_argument("--fixtures", metavar="DIR")
        add_db(sp)
        add_json(sp)
        sp.set_defaults(handler=handler)

    for name, helptext, handler in (("pause", "pause a run (running nodes are interrupted)", cmd_pause),
                                    ("abort", "abort a run for good", cmd_abort)):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("run")
        sp.add_argument("--reason")
        add_db(sp)
        add_json(sp)
        sp.set_defaults(handler=handler)


def _usd(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of US dollars (e.g. 10 or 2.50), not {text!r}")
    return value


def cmd_resume(args: argparse.Namespace) -> int:
    with opened(args) as kernel:
        flow = kernel.flow_for_run(args.run, args.flow) if args.flow else None
        snap = run_async(kernel.resume, args.run, args.message, budget=args.budget, flow=flow,
                         on_event=printer(args, lambda until: kernel.stored_events(args.run, until)))
        return exit_for(snap, args.run, args, kernel)


def cmd_retry(args: argparse.Namespace) -> int:
    with opened(args) as kernel:
        flow = kernel.flow_for_run(args.run, args.flow) if args.flow else None
        snap = run_async(kernel.retry, args.run, flow=flow, on_event=printer(args, lambda until: kernel.stored_events(args.run, until)))
        return exit_for(snap, args.run, args, kernel)


def _command(args: argparse.Namespace, kind: str) -> int:
    from flowkernel.core.commands import Command

    with opened(args) as kernel:
        cmd = Command(kind=kind, target=getattr(args, "to", None), content=getattr(args, "text", None),
                      reason=getattr(args, "reason", None))

        def accepted(_: object) -> None:
            print(f"flowkernel: {kind} accepted by run {args.run}", file=sys.stderr)

        if kind in ("reply", "send"):
            # Nobody executes the run? Then it continues here, streaming like `run` does.
            _, snap = run_async(kernel.deliver, args.run, cmd, on_event=printer(args, lambda until: kernel.stored_events(args.run, until)),
                                on_accepted=accepted)
            if snap is None and kernel.store.get_run(args.run).pooled:
                print(f"flowkernel: run {args.run} is the workers' (`flowkernel worker`): one continues it",
                      file=sys.stderr)
            return EXIT_OK if snap is None else exit_for(snap, args.run, args, kernel)
        run_async(kernel.command, args.run, cmd)
        accepted(None)
        return EXIT_OK


def cmd_send(args: argparse.Namespace) -> int:
    return _command(args, "send")


def cmd_reply(args: argparse.Namespace) -> int:
    return _command(args, "reply")


def cmd_pause(args: argparse.Namespace) -> int:
    return _command(args, "pause")


def cmd_abort(args: argparse.Namespace) -> int:
    return _command(args, "abort")


