"""``validate``, ``schema`` and ``run``: flow files."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from flowkernel.cli.session import EXIT_OK, add_db, add_json, exit_for, opened, printer, run_async

if TYPE_CHECKING:
    from flowkernel.errors import Problem


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("validate", help="check a flow file and report every problem")
    sp.add_argument("flow")
    sp.set_defaults(handler=cmd_validate)
    sp = sub.add_parser("schema", help="print the JSON Schema of flow files")
    sp.set_defaults(handler=cmd_schema)

    sp = sub.add_parser("run", help="run a flow, showing its progress")
    sp.add_argument("flow")
    sp.add_argument("--input", action="append", default=[], metavar="K=V", help="an input value (JSON or text)")
    sp.add_argument("--input-json", metavar="FILE", help="the run input as a JSON file")
    sp.add_argument("--fixtures", metavar="DIR", help="serve model calls from recorded fixtures (no network)")
    sp.add_argument("--queue", action="store_true",
                    help="store the run as queued for the workers (`flowkernel worker`) and print its id")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_run)


def cmd_validate(args: argparse.Namespace) -> int:
    from flowkernel.flowfiles.validated import check_flow_file
    from flowkernel.plugins.registry import default_registry

    flow = check_flow_file(args.flow, default_registry())
    from flowkernel.cli.wording import plural

    warn(args.flow, flow.warnings)
    print(f"{args.flow}: ok — flow {flow.name!r}, {plural(flow.nodes, 'node')}, {plural(flow.edges, 'edge')}")
    return EXIT_OK


def warn(source: str, warnings: list[Problem]) -> None:
    """What validation advises without refusing the flow, one line each on stderr."""
    for note in warnings:
        print(f"flowkernel: warning: {source}: {note}", file=sys.stderr)


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from flowkernel.core.flow import json_schema
    from flowkernel.plugins.registry import default_registry

    print(json.dumps(json_schema(default_registry().node_types), indent=2))
    return EXIT_OK


def missing_input_hint(schema: Any, value: Any) -> str | None:
    """How to give the required inputs a run lacks (``--input KEY=VALUE``, with the schema's first
    example as the value where it has one), or None when none is missing."""
    import json
    import shlex

    if not isinstance(schema, dict) or not isinstance(value, dict):
        return None
    required = schema.get("required")
    props = schema.get("properties")
    missing = [k for k in required if isinstance(k, str) and k not in value] if isinstance(required, list) else []
    if not missing:
        return None
    options = []
    for key in missing:
        prop = props.get(key) if isinstance(props, dict) else None
        examples = prop.get("examples") if isinstance(prop, dict) else None
        example = examples[0] if isinstance(examples, list) and examples else None
        if example is None:
            shown = "VALUE"
        else:
            shown = shlex.quote(example if isinstance(example, str) else json.dumps(example))
        options.append(f"--input {shlex.quote(key)}={shown}")
    return f"give {'it' if len(missing) == 1 else 'them'} with {' '.join(options)} (or --input-json FILE)"


def cmd_run(args: argparse.Namespace) -> int:
    from flowkernel.cli.inputs import parse_inputs
    from flowkernel.errors import RunInputError
    from flowkernel.flowfiles.validated import load_valid_flow
    from flowkernel.plugins.registry import default_registry

    # Everything about the input is checked before the store is touched. A queued run executes in a
    # worker, with the worker's plugins: its functions and tools are the worker's to know, not this
    # process's.
    warnings: list[Problem] = []
    flow = load_valid_flow(args.flow, default_registry(), check_names=not args.queue, warnings=warnings)
    warn(args.flow, warnings)
    value = parse_inputs(flow, args.input, args.input_json)
    from flowkernel.run.kernel import Kernel

    try:
        Kernel.check_input(flow, value)
    except RunInputError as exc:
        hint = missing_input_hint(flow.inputs_schema, value)
        if hint is None:
            raise
        raise RunInputError(f"{exc}; {hint}", exc.problems) from None
    if args.queue:
        if args.fixtures:
            from flowkernel.errors import InvalidInputError

            raise InvalidInputError("--queue with --fixtures: the worker that executes the run serves the "
                                    "model calls; start it with `flowkernel worker --fixtures DIR`")
        with opened(args, create=True) as kernel:
            run_id = kernel.enqueue(flow, value)
        if args.json:
            import json

            print(json.dumps({"runId": run_id, "status": "queued"}))
        else:
            print(run_id)
        return EXIT_OK
    from flowkernel.ids import new_run_id

    args.run = new_run_id()  # known before it starts, for the message a Ctrl-C prints
    with opened(args, create=True) as kernel:
        snap = run_async(kernel.run, flow, value, on_event=printer(args), run_id=args.run)
        return exit_for(snap, snap.runId, args, kernel)

