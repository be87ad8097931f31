"""What every command shares: opening the kernel, printing events, exit codes and the hints after a run."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowkernel.api import Kernel
    from flowkernel.events import BaseEvent
    from flowkernel.settings import RunSettings
    from flowkernel.snapshot import RunSnapshot

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_STOPPED = 0, 1, 2, 3


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
    from flowkernel.api import Kernel
    from flowkernel.store.open import open_store

    return Kernel(open_store(args.db, create=create, readonly=readonly), settings=settings_of(args))


def settings_of(args: argparse.Namespace) -> RunSettings:
    """What the command line says runs execute with: ``--fixtures`` and the plugin modules it loaded."""
    from flowkernel.settings import RunSettings

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
    from flowkernel.render import LiveView

    view = LiveView(sys.stdout, wall=getattr(args, "wall", False))
    if history is not None:
        view.seed_later(history)
    return _Printer(view)


class _JsonLines:
    """``--json``: each event as one line of JSON, as stored."""

    def __init__(self) -> None:
        from flowkernel.events import encode

        self.encode = encode

    def __call__(self, ev: BaseEvent) -> None:
        sys.stdout.write(self.encode(ev).decode() + "\n")
        sys.stdout.flush()

    def batch(self, events: Iterable[BaseEvent]) -> None:
        sys.stdout.write("".join(self.encode(ev).decode() + "\n" for ev in events))
        sys.stdout.flush()


class _Printer:
    """Prints events one by one, or a commit's worth at once (``batch``, one flush: see
    ``flowkernel.runner.EventListener``); a reader that went away stops the printing, not the run."""

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


def exit_for(snap: RunSnapshot, run_id: str, args: argparse.Namespace) -> int:
    """The exit code for a run that stopped, with the command that continues it (copy it as printed)."""
    again = store_option(args)
    if snap.status == "completed":
        return EXIT_OK
    if snap.status in ("paused", "waiting"):
        if snap.status == "waiting":
            from flowkernel.snapshot import undelivered_answer

            for n, w in snap.waiting.items():
                if undelivered_answer(snap, n) is not None:
                    print(f"flowkernel: {n} holds a reply not yet delivered: flowkernel resume {run_id}{again}",
                          file=sys.stderr)
                else:
                    print(f"flowkernel: {n} waits for a reply: flowkernel reply {run_id} --to {w.runId} "
                          f"'ANSWER'{again}", file=sys.stderr)
        elif snap.budgetPause is not None:
            from flowkernel.budgets import pause_hint

            what, command = pause_hint(run_id, snap.budgetPause)
            print(f"flowkernel: paused: {what}; raise it and continue with: {command}{again}", file=sys.stderr)
        else:
            print(f"flowkernel: paused; continue with: flowkernel resume {run_id}{again}", file=sys.stderr)
        return EXIT_STOPPED
    if snap.status == "failed":
        print(f"flowkernel: run {run_id} failed: {snap.error}; re-run its failed nodes with: "
              f"flowkernel retry {run_id}{again}", file=sys.stderr)
    return EXIT_FAILED


def store_option(args: argparse.Namespace) -> str:
    """`` --db URL`` when the command named a store of its own, so a command printed for the user works
    wherever it is pasted: a SQLite path made absolute, a PostgreSQL URL without its password (libpq
    then reads it from PGPASSWORD or ~/.pgpass: a hint must not print a secret). Runs remember their
    fixtures and plugins (flowkernel.settings), so hints need nothing else."""
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
