"""What every command shares: opening the kernel, printing events, exit codes and the hints after a run."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowkernel.core.events import BaseEvent
    from flowkernel.core.snapshot import RunSnapshot
    from flowkernel.run.kernel import Kernel
    from flowkernel.run.settings import RunSettings

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_STOPPED = 0, 1, 2, 3
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"


def add_log_level(sp: argparse.ArgumentParser, *, default: str) -> None:
    sp.add_argument("--log-level", choices=LOG_LEVELS, default=default, metavar="LEVEL",
                    help=f"what flowkernel logs to stderr: {', '.join(LOG_LEVELS)} (default {DEFAULT_LOG_LEVEL}: "
                         "a worker's runs, serve's requests, and anything that goes wrong); before or after "
                         "the command")


def add_db(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--db", metavar="URL", help="store: a SQLite path (default .flowkernel/runs.db, or "
                                                 "$FLOWKERNEL_DB) or postgresql://…")


def add_json(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--json", action="store_true", help="one JSON object per line")


@contextmanager
def opened(args: argparse.Namespace, *, create: bool = False, readonly: bool = False) -> Iterator[Kernel]:
    """The kernel for one command, its store closed however the command ends. ``readonly``: the
    command only reads (it then works on a database it cannot write)."""
    kernel = kernel_for(args, create=create, readonly=readonly)
    try:
        yield kernel
    finally:
        kernel.close()


def kernel_for(args: argparse.Namespace, *, create: bool = False, readonly: bool = False) -> Kernel:
    from flowkernel.history.agent_runs import AgentRunBackfill
    from flowkernel.plugins.registry import default_registry
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.open import open_store

    return Kernel(open_store(args.db, create=create, readonly=readonly, backfill=AgentRunBackfill(default_registry())),
                  settings=settings_of(args))


def settings_of(args: argparse.Namespace) -> RunSettings:
    """What the command line says runs execute with: ``--fixtures`` and the plugin modules it loaded."""
    from flowkernel.run.settings import RunSettings

    env = os.environ.get("FLOWKERNEL_PLUGINS", "").split(",")
    plugins = [*env, *getattr(args, "plugin", ()), *getattr(args, "command_plugins", ())]
    return RunSettings.of(getattr(args, "fixtures", None), plugins)


def printer(args: argparse.Namespace, history: Callable[[int], Iterable[BaseEvent | bytes]] | None = None) -> Any:
    """What prints a run's events: JSON lines, or the live view. The view takes in ``history(until)``
    (the run's stored events up to seq ``until``, decoded or as stored: those before the ones it
    prints), so a continued run is timed from its start, labelled and counted as a whole; it reads
    them when a line first needs them (``LiveView.seed_later``)."""
    if args.json:
        return _Printer(_JsonLines())
    from flowkernel.cli.live_view import LiveView

    view = LiveView(sys.stdout, wall=getattr(args, "wall", False))
    if history is not None:
        view.seed_later(history)
    return _Printer(view)


class _JsonLines:
    """``--json``: each event as one line of JSON, as stored."""

    def __init__(self) -> None:
        from flowkernel.core.events import encode

        self.encode = encode

    def __call__(self, ev: BaseEvent) -> None:
        sys.stdout.write(self.encode(ev).decode() + "\n")
        sys.stdout.flush()

    def batch(self, events: Iterable[BaseEvent]) -> None:
        sys.stdout.write("".join(self.encode(ev).decode() + "\n" for ev in events))
        sys.stdout.flush()


class _Printer:
    """Prints events one by one, or a commit's worth at once (``batch``, one flush: see
    ``flowkernel.run.loop.EventListener``); a reader that went away stops the printing, not the run."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __call__(self, ev: BaseEvent) -> None:
        try:
            self.target(ev)
        except BrokenPipeError:
            stdout_closed()

    def batch(self, events: Iterable[BaseEvent]) -> None:
        try:
            self.target.batch(events)
        except BrokenPipeError:
            stdout_closed()


def stdout_closed() -> None:
    """The reader went away (``| head``): stop printing, keep the run going, exit quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def exit_for(snap: RunSnapshot, run_id: str, args: argparse.Namespace, kernel: Kernel | None = None) -> int:
    """The exit code for a run that stopped, with the command that continues it (copy it as printed).
    ``kernel`` (the run's) tells a failed node, which ``retry`` re-runs, from a failed flow, which only
    ``retry --flow`` continues."""
    again = store_option(args)
    if snap.status == "completed":
        return EXIT_OK
    if snap.status in ("paused", "waiting"):
        if snap.status == "waiting":
            from flowkernel.core.snapshot import undelivered_answer

            for n, w in snap.waiting.items():
                if undelivered_answer(snap, n) is not None:
                    print(f"flowkernel: {n} holds a reply not yet delivered: flowkernel resume {run_id}{again}",
                          file=sys.stderr)
                else:
                    print(f"flowkernel: {n} waits for a reply: flowkernel reply {run_id} --to {w.runId} "
                          f"'ANSWER'{again}", file=sys.stderr)
        elif snap.budgetPause is not None:
            from flowkernel.core.budgets import pause_hint

            what, command = pause_hint(run_id, snap.budgetPause)
            print(f"flowkernel: paused: {what}; raise it and continue with: {command}{again}", file=sys.stderr)
        else:
            print(f"flowkernel: paused; continue with: flowkernel resume {run_id}{again}", file=sys.stderr)
        return EXIT_STOPPED
    if snap.status == "failed":
        if any(fault.errorType == "authentication" for fault in snap.faults.values()):
            # Retried as it is, the model call fails again: the credentials (or fixtures) come first.
            from flowkernel.agents.credentials import how_to_call

            print(f"flowkernel: run {run_id} failed: {snap.error}; {how_to_call(fixtures=False)} and re-run its "
                  f"failed nodes with: flowkernel retry {run_id}{again} (or serve them from recorded fixtures: "
                  f"flowkernel retry {run_id}{again} --fixtures DIR)", file=sys.stderr)
        else:
            print(f"flowkernel: run {run_id} failed: {snap.error}; {_retry_hint(snap, run_id, again, kernel)}",
                  file=sys.stderr)
    return EXIT_FAILED


def _retry_hint(snap: RunSnapshot, run_id: str, again: str, kernel: Kernel | None) -> str:
    """What continues a failed run: ``retry`` when a node failed; when the flow itself did (an edge's
    ``when``, a binding), a plain retry fails the same way, and the flow file, fixed, is what to give."""
    from flowkernel.core.commands import retry_restarts_a_failure

    if kernel is None or retry_restarts_a_failure(kernel.flow_of(run_id), snap):
        return f"re-run its failed nodes with: flowkernel retry {run_id}{again}"
    import shlex

    source = kernel.store.get_run(run_id).flowSource
    fixed = shlex.quote(source) if source else "FIXED.json"
    return (f"a retry on this flow fails the same way: fix the flow file, then continue with: "
            f"flowkernel retry {run_id} --flow {fixed}{again}")


def store_option(args: argparse.Namespace) -> str:
    """`` --db URL`` when the command named a store of its own, so a command printed for the user works
    wherever it is pasted: a SQLite path made absolute, a PostgreSQL URL without its password (libpq
    then reads it from PGPASSWORD or ~/.pgpass: a hint must not print a secret). Runs remember their
    fixtures and plugins (flowkernel.run.settings), so hints need nothing else."""
    import re
    import shlex
    from pathlib import Path

    db = getattr(args, "db", None)
    if not db or db == "memory":
        return ""
    if db.startswith(("postgresql://", "postgres://")):
        shown = re.sub(r"(://[^:/@?]*):[^@/]*@", r"\1@", db)
        shown = re.sub(r"([?&])password=[^&]*&?", r"\1", shown).rstrip("?&")
    else:
        shown = str(Path(db.removeprefix("sqlite:///")).resolve())
    return f" --db {shlex.quote(shown)}"


def run_async(fn: Any, *a: Any, **kw: Any) -> Any:
    import anyio

    return anyio.run(lambda: fn(*a, **kw))
