"""``flowkernel``: the command line, one module per command group and the presentation they share; the only code that prints.

A thin layer over the Kernel (``flowkernel.run.kernel``).

One module per command group (``flows``, ``inspect``, ``control``, ``timetravel``, ``record``, ``examples``,
``serve``, ``workers``, ``retention``); ``session`` holds
what they share. Exit codes: 0 completed, 1 failed or error, 2 invalid input, 3 paused or waiting.
Heavy modules are imported inside the commands so ``flowkernel --help`` stays fast.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
from typing import Any

from flowkernel.cli import (
    control,
    examples,
    flows,
    inspect,
    mcp,
    record,
    retention,
    serve,
    timetravel,
    workers,
)
from flowkernel.cli.session import (
    DEFAULT_LOG_LEVEL,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_STOPPED,
    add_log_level,
    stdout_closed,
)
from flowkernel.telemetry.logs import configure_logging

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "EXIT_STOPPED", "main"]

# Commands that execute a run in this process: interrupted, the run is left to `resume`.
CONTINUED = frozenset({"run", "resume", "retry", "reply", "send"})
GROUPS = (flows, inspect, control, timetravel, record, examples, serve, workers, retention, mcp)


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        import flowkernel

        print(f"flowkernel {flowkernel.__version__}")
        parser.exit()


# The global options that take a value (given before the command).
_VALUED = ("--plugin", "--allow-dir", "--log-level")


def parser() -> argparse.ArgumentParser:
    """The command line's parser, with every command."""
    return _build(None)


def command_parser(command: str) -> argparse.ArgumentParser | None:
    """A parser that knows only ``command`` (building every command's costs more than some commands
    take to run); None when no command group adds it."""
    p = _build(command)
    return p if command in _commands(p) else None


def _build(command: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowkernel", description="Run JSON agent workflows with durable, resumable snapshots.")
    p.add_argument("--version", action=_Version, help="print flowkernel's version and exit")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import a module that registers functions, tools or node types (repeatable)")
    p.add_argument("--allow-dir", action="append", default=[], metavar="DIR",
                   help="a folder flows may read child flows and fixtures from besides their own "
                        "(repeatable; also FLOWKERNEL_ALLOW_DIRS, separated by the OS path separator)")
    add_log_level(p, default=DEFAULT_LOG_LEVEL)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    target: Any = sub if command is None else _OnlyCommand(sub, command)
    for group in GROUPS:
        group.add_parsers(target)
    for command_parser in _commands(p).values():  # after the command too; given there, it wins
        add_log_level(command_parser, default=argparse.SUPPRESS)
        add_plugin_option(command_parser)
    return p


def add_plugin_option(sp: argparse.ArgumentParser) -> None:
    """``--plugin`` after the command, as before it: one rule for every command. Kept apart from the
    global option's list (a command's defaults would replace it), and joined to it by ``main``."""
    sp.add_argument("--plugin", action="append", default=[], dest="command_plugins", metavar="MODULE",
                    help="import a module that registers functions, tools or node types (repeatable; "
                         "modules of the current directory import too)")


def _commands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's commands, by name."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def command_named(argv: list[str]) -> str | None:
    """The command ``argv`` runs, when that is plain to see without parsing: only the global options
    that take a value, spelt out, before it. None for anything else (``--help``, ``--version``, no
    command, an abbreviated option, ``--``), which the whole parser handles."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _VALUED:
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                return None  # the whole parser says what is missing
            i += 2
        elif arg.startswith(tuple(f"{option}=" for option in _VALUED)):
            i += 1
        elif arg.startswith("-"):
            return None
        else:
            return arg
    return None


class _OnlyCommand:
    """Stands in for the subcommands action while one command's parser is built: the command groups
    add all their parsers, and those of other commands are skipped (never built)."""

    def __init__(self, sub: Any, command: str) -> None:
        self._sub, self._command = sub, command

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if self._command == name or self._command in kwargs.get("aliases", ()):
            return self._sub.add_parser(name, **kwargs)
        return _SKIPPED


class _Skipped:
    """The parser of a command not being run: whatever is added to it goes nowhere."""

    def __getattr__(self, name: str) -> Any:
        return self._skip

    def _skip(self, *args: Any, **kwargs: Any) -> _Skipped:
        return self


_SKIPPED = _Skipped()


def _no_collection_at_exit() -> None:
    """Let the interpreter exit without collecting what the process holds: every module, class and
    function of the packages a command imports sits in reference cycles, and tearing them apart one
    by one costs more than a run of a small flow (the operating system takes the memory back at once).
    Registered at exit, it runs before the interpreter's own clean-up; objects that are garbage then
    are left uncollected, as Python never promises their finalizers run at exit (the stores, files and
    exporters a command opens are closed or flushed by the command or by their own exit handlers)."""
    gc.freeze()


_exit_registered = False


def main(argv: list[str] | None = None) -> int:
    global _exit_registered
    if not _exit_registered:  # once, however many times main runs in one process
        _exit_registered = True
        atexit.register(_no_collection_at_exit)
    argv = sys.argv[1:] if argv is None else argv
    command = command_named(argv)
    cli = (command_parser(command) if command is not None else None) or parser()
    args = cli.parse_args(argv)
    if args.command is None:
        cli.print_help()
        return EXIT_INVALID
    configure_logging(args.log_level)
    from flowkernel.errors import FlowkernelError
    from flowkernel.redaction import install_log_redaction, redact_text

    install_log_redaction()
    try:
        from flowkernel.plugins.registry import default_registry, load_plugins

        if args.allow_dir:  # through the environment: every kernel of this process reads it
            from flowkernel.flowfiles.localfiles import ALLOW_DIRS_ENV

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
        print(f"flowkernel: {redact_text(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except BaseExceptionGroup as group:
        # A task group (`worker`, `serve`) wraps what its tasks raised: a store that fails under it is
        # still an error for the user to read, not a traceback. Anything else in the group is a bug.
        errors = _leaves(group)
        if not all(isinstance(e, FlowkernelError) for e in errors):
            raise
        for message in dict.fromkeys(redact_text(str(e)) for e in errors):
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
