"""``examples``: list the shipped example flows, or copy them (flows and fixtures) into a folder."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from flowkernel.cli.session import EXIT_OK, add_json, stdout_closed


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("examples", help="list the example flows that ship with flowkernel, or copy them out",
                        description="List the example flows (each runs from its recorded fixtures, no API key), "
                                    "or copy them into a folder with `flowkernel examples copy DIR`.")
    add_json(sp)
    sp.set_defaults(handler=cmd_list)
    inner = sp.add_subparsers(dest="examples_command", metavar="copy")
    cp = inner.add_parser("copy", help="write DIR/flows/… and DIR/fixtures/… so the example commands run from DIR")
    cp.add_argument("dir", metavar="DIR")
    cp.add_argument("--force", action="store_true", help="write into a non-empty DIR, overwriting example files")
    cp.set_defaults(handler=cmd_copy)


def cmd_list(args: argparse.Namespace) -> int:
    from flowkernel.examples.catalogue import list_examples

    examples = list_examples()
    if args.json:
        lines = [json.dumps(ex.to_dict(), ensure_ascii=False) for ex in examples]
    else:
        width = max(len(ex.name) for ex in examples)
        lines = []
        for ex in examples:
            lines += [f"{ex.name:<{width}}  {ex.description}", f"{'':<{width}}  $ {ex.command}"]
            for extra in ex.extras:
                lines.append(f"{'':<{width}}  (needs an extra: pip install 'flowkernel[{extra}]')")
            if ex.waits_for_reply:
                lines.append(f"{'':<{width}}  (waits for a reply: the run prints the `flowkernel reply` command)")
        lines += ["", "The commands run from a folder made by `flowkernel examples copy DIR`."]
    _print(lines)
    return EXIT_OK


def cmd_copy(args: argparse.Namespace) -> int:
    from flowkernel.examples.catalogue import copy_examples, list_examples

    written = copy_examples(args.dir, force=args.force)
    _print([str(path) for path in written])
    first = next((ex for ex in list_examples() if ex.name == "review-loop"), None)
    hint = f" && {first.command}" if first is not None else ""
    from flowkernel.cli.wording import plural

    print(f"flowkernel: copied {plural(len(written), 'file')}; try: cd {shlex.quote(args.dir)}{hint}", file=sys.stderr)
    return EXIT_OK


def _print(lines: list[str]) -> None:
    try:
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        stdout_closed()
