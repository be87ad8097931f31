"""``record``: run a flow against the live Messages API and write its model calls as fixtures."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flowkernel.cli.session import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, run_async

PROGRESS = frozenset({"node:start", "node:complete", "node:error", "node:waiting", "node:skipped"})


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("record", help="run a flow against the Messages API and write its model calls as fixtures",
                        description="Run a flow against the Messages API (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL) "
                                    "and write one fixture file per agent node into DIR; `flowkernel run FLOW "
                                    "--fixtures DIR` then replays it offline. Progress goes to stderr.")
    sp.add_argument("--flow", required=True, metavar="FLOW", help="the flow file")
    sp.add_argument("--output", required=True, metavar="DIR", help="the fixture directory (one <nodeId>.json each)")
    sp.add_argument("--input", action="append", default=[], metavar="K=V", help="an input value (JSON or text)")
    sp.add_argument("--input-json", metavar="FILE", help="the run input as a JSON file")
    sp.add_argument("--reply", action="append", default=[], metavar="TEXT",
                    help="the answer for the next node that waits for a reply (repeatable, in order); "
                         "without one a terminal is asked")
    sp.add_argument("--force", action="store_true", help="overwrite fixture files that exist")
    sp.set_defaults(handler=cmd_record)


def _say(text: str) -> None:
    print(f"flowkernel record: {text}", file=sys.stderr, flush=True)


def cmd_record(args: argparse.Namespace) -> int:
    from flowkernel.agents.credentials import require_credentials
    from flowkernel.cli.inputs import parse_inputs
    from flowkernel.core.events import BaseEvent
    from flowkernel.flowfiles.load import load_flow
    from flowkernel.plugins.registry import default_registry
    from flowkernel.run.kernel import Kernel
    from flowkernel.run.recording import record_flow

    require_credentials("record", fixtures=False)
    # Everything about the flow and the input is checked before a model is called.
    flow = load_flow(args.flow, node_types=default_registry().node_types)
    value = parse_inputs(flow, args.input, args.input_json)
    Kernel.check_input(flow, value)

    def progress(ev: BaseEvent) -> None:
        if ev.type in PROGRESS:
            item = getattr(ev, "item", None)
            _say(f"{ev.nodeId}{'' if item is None else f'[{item}]'}: {ev.type.split(':')[1]}")
        elif ev.type == "flow:complete":
            _say(f"run {ev.flowRunId}: {getattr(ev, 'status', '')}")

    def on_call(node: str, item: int | None, index: int) -> None:
        _say(f"{node}{'' if item is None else f'[{item}]'}: model call {index}")

    def ask(node: str, prompt: Any) -> str | None:
        if not sys.stdin.isatty():
            return None
        return input(f"{node} asks: {prompt}\n> ")

    done = run_async(record_flow, flow, value, args.output, replies=args.reply, ask=ask, force=args.force,
                     on_event=progress, on_call=on_call)
    for path in done.written:
        print(path)
    snap = done.snapshot
    if done.unused_replies:
        from flowkernel.cli.wording import plural

        unused = len(done.unused_replies)
        _say(f"{plural(unused, '--reply value')} {'was' if unused == 1 else 'were'} not needed: {done.unused_replies!r}")
    if snap.status == "waiting":
        node, waiting = sorted(snap.waiting.items())[0]
        _say(f"node {node} waits for a reply ({waiting.prompt!r}); the calls so far are written: pass one "
             "more --reply TEXT to record past it")
        return EXIT_STOPPED
    if snap.status != "completed":
        _say(f"the run ended {snap.status}: {snap.error}")
        return EXIT_FAILED
    return EXIT_OK
