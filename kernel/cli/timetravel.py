"""``fixtures``, ``rerun`` and ``fork``: a stored run as fixtures, executed again, or continued from any event."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flowkernel.cli.session import (
    EXIT_FAILED,
    EXIT_OK,
    add_db,
    add_json,
    exit_for,
    opened,
    printer,
    run_async,
)


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("fixtures", help="write a stored run's model calls and Claude Code sessions as fixture files")
    sp.add_argument("run")
    sp.add_argument("--output", required=True, metavar="DIR", help="the fixture directory (one <nodeId>.json each)")
    sp.add_argument("--force", action="store_true", help="overwrite fixture files that exist")
    add_db(sp)
    sp.set_defaults(handler=cmd_fixtures)

    sp = sub.add_parser("rerun", help="execute a run's flow again from its own recorded model calls and "
                                      "report the first divergence")
    sp.add_argument("run")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_rerun)

    sp = sub.add_parser("fork", help="start a new run from the snapshot after event SEQ")
    sp.add_argument("run")
    sp.add_argument("--at", type=int, required=True, metavar="SEQ")
    sp.add_argument("--input", action="append", default=[], metavar="K=V", help="change an input value")
    sp.add_argument("--fixtures", metavar="DIR")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_fork)


def cmd_fixtures(args: argparse.Namespace) -> int:
    from flowkernel.fixtures import fixtures_from_run, write_fixtures

    with opened(args) as kernel:
        kernel.load_plugins_of(args.run)  # the run's tools, whose definitions its requests held
        documents = fixtures_from_run(kernel.store, args.run, node_types=kernel.registry.node_types,
                                      tools=kernel.registry.tools)
        if not documents:
            print(f"flowkernel: run {args.run} made no model calls; nothing to write", file=sys.stderr)
            return EXIT_OK
        for path in write_fixtures(documents, args.output, force=args.force):
            print(path)
        return EXIT_OK


def cmd_rerun(args: argparse.Namespace) -> int:
    from flowkernel.run.timetravel import rerun

    with opened(args) as kernel:
        report = run_async(rerun, kernel, args.run)
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
    from flowkernel.cli.inputs import parse_inputs
    from flowkernel.run.timetravel import fork

    with opened(args) as kernel:
        changes = parse_inputs(kernel.flow_of(args.run), args.input, None) if args.input else None
        snap = run_async(fork, kernel, args.run, args.at, input=changes, on_event=printer(args))
        print(f"flowkernel: fork {snap.runId} of {args.run} at seq {args.at}", file=sys.stderr)
        return exit_for(snap, snap.runId, args, kernel)

