"""``prune``, ``export`` and ``import``: retention of whole runs, and moving them between stores."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flowkernel.cli.session import EXIT_FAILED, EXIT_OK, add_db, add_json, opened


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("prune", help="delete old runs with everything of theirs, in bounded batches")
    sp.add_argument("--older-than", required=True, metavar="AGE",
                    help="runs unchanged for longer than this: 30d, 12h, 90m, 45s or 2w")
    sp.add_argument("--status", default="completed,failed,aborted", metavar="S,S",
                    help="the statuses to delete (default completed,failed,aborted); runs being "
                         "executed are never deleted")
    sp.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_prune)

    sp = sub.add_parser("export", help="write runs, with everything needed to show, replay, rerun, fork "
                                       "and resume them, as JSON lines on stdout")
    sp.add_argument("runs", nargs="+", metavar="RUN")
    sp.add_argument("--with-children", action="store_true", help="their child runs too (flow.call)")
    add_db(sp)
    sp.set_defaults(handler=cmd_export)

    sp = sub.add_parser("import", help="load runs written by `flowkernel export` (each all or nothing; "
                                       "ids that exist are refused)")
    sp.add_argument("file", metavar="FILE", help="the export file, or - for stdin")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_import)


def _progress(line: str) -> None:
    print(f"flowkernel {line}", file=sys.stderr, flush=True)


def cmd_prune(args: argparse.Namespace) -> int:
    from flowkernel.store.retention import parse_age, parse_statuses, prune

    older = parse_age(args.older_than)
    statuses = parse_statuses(args.status)
    with opened(args) as kernel:
        report = prune(kernel.store, older_than_ms=older, statuses=statuses, dry_run=args.dry_run,
                       progress=_progress)
    if args.json:
        import msgspec

        print(msgspec.json.encode(report).decode())
    else:
        from flowkernel.cli.wording import plural

        verb = "would delete" if report.dryRun else "deleted"
        print(f"{verb} {plural(report.runs, 'run')} and {plural(report.childRuns, 'child run')} "
              f"({plural(report.events, 'event')}"
              + ("" if report.dryRun else f", {plural(report.blobs, 'blob')} no other run uses") + ")")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from flowkernel.store.retention import export_runs

    with opened(args) as kernel:
        written = export_runs(kernel.store, args.runs, sys.stdout.buffer, with_children=args.with_children,
                              progress=_progress)
    from flowkernel.cli.wording import plural

    print(f"flowkernel: exported {plural(written, 'run')}", file=sys.stderr)
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    from flowkernel.errors import InvalidInputError
    from flowkernel.store.retention import import_runs

    try:
        source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise InvalidInputError(f"FILE {args.file!r}: {exc.strerror}") from None
    try:
        with opened(args, create=True) as kernel:
            report = import_runs(kernel.store, source, progress=_progress)
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    if args.json:
        import json

        print(json.dumps({"imported": report.imported,
                          "refused": [{"run": what, "reason": why} for what, why in report.refused]}))
    else:
        for run_id in report.imported:
            print(run_id)
    for _, why in report.refused:
        print(f"flowkernel: {why}", file=sys.stderr)
    from flowkernel.cli.wording import plural

    print(f"flowkernel: imported {plural(len(report.imported), 'run')}, refused {len(report.refused)}",
          file=sys.stderr)
    return EXIT_FAILED if report.refused else EXIT_OK
