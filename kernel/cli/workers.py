"""``worker`` and ``workers``: execute queued runs from the store, and list who does."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from flowkernel.cli.arguments import add_executor_options, positive_float, positive_int
from flowkernel.cli.session import EXIT_OK, add_db, add_json, run_async
from flowkernel.run.defaults import DEFAULT_LEASE_S
from flowkernel.workers.defaults import DEFAULT_CONCURRENCY


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("worker", help="claim queued and orphaned runs from the store and execute them")
    sp.add_argument("--concurrency", type=positive_int, default=DEFAULT_CONCURRENCY, metavar="N",
                    help=f"runs executed at once (default {DEFAULT_CONCURRENCY})")
    sp.add_argument("--lease-s", type=positive_float, default=DEFAULT_LEASE_S, metavar="S",
                    help=f"lease time: how soon another worker takes over the runs of a worker that died "
                         f"on another host (default {DEFAULT_LEASE_S:g})")
    add_executor_options(sp, stopped_by="SIGTERM")
    add_db(sp)
    sp.set_defaults(handler=cmd_worker)

    sp = sub.add_parser("workers", help="list the live workers of the store")
    add_db(sp)
    add_json(sp)
    sp.set_defaults(handler=cmd_workers)


def cmd_worker(args: argparse.Namespace) -> int:
    from flowkernel.core.services import RunServices
    from flowkernel.history.agent_runs import AgentRunBackfill
    from flowkernel.plugins.registry import default_registry
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.open import open_store
    from flowkernel.workers.worker import Worker

    services = RunServices()
    if args.fixtures:
        from flowkernel.fixtures.library import FixtureLibrary

        services = RunServices(query_fn=FixtureLibrary(args.fixtures), fixtures=args.fixtures)
    kernel = Kernel(open_store(args.db, create=True, backfill=AgentRunBackfill(default_registry())), services=services,
                    lease_ttl_ms=int(args.lease_s * 1000))
    worker = Worker(kernel, concurrency=args.concurrency, grace_s=args.grace_s)
    try:
        run_async(_serve, worker)
    finally:
        kernel.close()
    return EXIT_OK


async def _serve(worker: Any) -> None:
    import anyio

    async def on_signals() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if worker.stopping:
                    # A second signal: leave at once; the leases expire (or, on this host, are
                    # taken over at once by the next worker to look).
                    print(f"flowkernel worker: {signal.Signals(signum).name} again: exiting now", file=sys.stderr,
                          flush=True)
                    os._exit(128 + signum)
                print(f"flowkernel worker: {signal.Signals(signum).name}: handing over {len(worker.running)} "
                      f"run(s) (grace {worker.grace_s:g} s)", file=sys.stderr, flush=True)
                worker.stop()

    async with anyio.create_task_group() as tg:
        tg.start_soon(on_signals)
        await tg.start(worker.run)  # said once registered: a store that fails before is the error shown
        print(f"flowkernel worker {worker.id}: claiming runs from {worker.kernel.store.location} "
              f"({worker.concurrency} at once)", file=sys.stderr, flush=True)
        await worker.wait_stopped()
        tg.cancel_scope.cancel()
    print(f"flowkernel worker {worker.id}: stopped", file=sys.stderr, flush=True)


def cmd_workers(args: argparse.Namespace) -> int:
    import time

    from flowkernel.cli.session import opened
    from flowkernel.run.pool import live_workers

    with opened(args) as kernel:
        workers = live_workers(kernel)
    if args.json:
        import msgspec

        for w in workers:
            # Every field, those at their default too (an idle worker's empty `runs`): the record omits them.
            print(msgspec.json.encode(msgspec.structs.asdict(w)).decode())
        return EXIT_OK
    if not workers:
        print("no live workers")
        return EXIT_OK
    print(f"{'WORKER':<40} {'HOST':<20} {'PID':>7}  {'STARTED':<19}  {'HEARTBEAT':<9} {'RUNS':>4}  RUNNING")
    now = time.time()
    for w in workers:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w.startedAt / 1000))
        beat = f"{max(0.0, now - w.heartbeatAt / 1000):.0f} s ago"
        shown = " ".join(w.runs[:3]) + (f" …{len(w.runs) - 3} more" if len(w.runs) > 3 else "")
        print(f"{w.workerId[:40]:<40} {w.host[:20]:<20} {w.pid:>7}  {started:<19}  {beat:<9} {len(w.runs):>4}  {shown}")
    return EXIT_OK
