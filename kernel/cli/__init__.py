"""``flowkernel``: the command line, a thin layer over ``flowkernel.api``.

One module per command group (``flows``, ``inspect``, ``control``, ``timetravel``, ``record``, ``examples``,
``serve``, ``workers``, ``retention``); ``session`` holds
what they share. Exit codes: 0 completed, 1 failed or error, 2 invalid input, 3 paused or waiting.
Heavy modules are imported inside the commands so ``flowkernel --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from flowkernel.cli import control, examples, flows, inspect, record, retention, serve, timetravel, workers
from flowkernel.cli.session import EXIT_FAILED, EXIT_INVALID, EXIT_OK, EXIT_STOPPED, stdout_closed

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "EXIT_STOPPED", "main"]

# Commands that execute a run in this process: interrupted, the run is left to `resume`.
CONTINUED = frozenset({"run", "resume", "retry", "reply", "send"})
GROUPS = (flows, inspect, control, timetravel, record, examples, serve, workers, retention)


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        import flowkernel

        print(f"flowkernel {flowkernel.__version__}")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowkernel", description="Run JSON agent workflows with durable, resumable snapshots.")
    p.add_argument("--version", action=_Version, help="print flowkernel's version and exit")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import a module that registers functions, tools or node types (repeatable)")
    p.add_argument("--allow-dir", action="append", default=[], metavar="DIR",
                   help="a folder flows may read child flows and fixtures from besides their own "
                        "(repeatable; also FLOWKERNEL_ALLOW_DIRS, separated by the OS path separator)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for group in GROUPS:
        group.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.command is None:
        cli.print_help()
        return EXIT_INVALID
    from flowkernel.errors import FlowkernelError

    try:
        from flowkernel.registry import default_registry, load_plugins

        if args.allow_dir:  # through the environment: every kernel of this process reads it
            from flowkernel.localfiles import ALLOW_DIRS_ENV

            os.environ[ALLOW_DIRS_ENV] = os.pathsep.join(
                [*args.allow_dir, *filter(None, os.environ.get(ALLOW_DIRS_ENV, "").split(os.pathsep))])
        plugins = [*args.plugin, *getattr(args, "command_plugins", ())]  # before the command or after it
        if plugins and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # like `python -m`: a project's own plugin modules import
        default_registry()
        load_plugins(plugins)
        code: int = args.handler(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return code
    except FlowkernelError as exc:
        print(f"flowkernel: {exc}", file=sys.stderr)
        return exc.exit_code
    except BaseExceptionGroup as group:
        # A task group (`worker`, `serve`) wraps what its tasks raised: a store that fails under it is
        # still an error for the user to read, not a traceback. Anything else in the group is a bug.
        errors = _leaves(group)
        if not all(isinstance(e, FlowkernelError) for e in errors):
            raise
        for message in dict.fromkeys(str(e) for e in errors):
            print(f"flowkernel: {message}", file=sys.stderr)
        first: FlowkernelError = errors[0]  # type: ignore[assignment]
        return first.exit_code
    except BrokenPipeError:
        # The reader went away (`flowkernel runs | head -1`): what it read was all it wanted.
        stdout_closed()
        return EXIT_OK
    except KeyboardInterrupt:
        run_id = getattr(args, "run", None)
        if args.command in CONTINUED and run_id:
            from flowkernel.cli.session import store_option

            print(f"flowkernel: interrupted; continue the run with: flowkernel resume {run_id}{store_option(args)}",
                  file=sys.stderr)
        else:
            print("flowkernel: interrupted", file=sys.stderr)
        return EXIT_FAILED


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions of a (nested) exception group, in order."""
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found
