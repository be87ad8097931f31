#!/usr/bin/env python3
"""HTTP API benchmark: event-page throughput and SSE fan-out of `flowkernel serve`.

    python scripts/bench/api.py [--db URL] [--clients 100] [--nodes 200] [--tick-ms 10] [--seconds 5]

1. **Pages**: a stored run of ~3 events per node; one client reads `GET /runs/{id}/events` page after
   page (cursor to cursor, `limit=50` and `limit=500`) for `--seconds`; pages/s and events/s.
2. **Fan-out**: `--clients` SSE clients, spread over `--client-procs` processes, follow one run that
   another process executes (a chain of `--nodes` nodes, each sleeping `--tick-ms`); events/s
   delivered to all clients together, and the latency from an event's commit (its timestamp, stamped
   just before the commit) to each client that reads it, p50 and p99; the same for one more client
   alone in its own process (what the server gives a client that reads at once: clients sharing one
   Python process on a loaded machine are slowed by their own parsing); and the CPU the server and
   the client processes used meanwhile, with the load average.

The server is a real `flowkernel serve` process on a loopback port; the clients run here, in one
asyncio loop. Everything shares this machine's cores, so the figures are a floor, not a ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent.parent
PLUGIN = "bench_api_plugin"
PLUGIN_SOURCE = '''
import faulthandler

import anyio
from flowkernel.plugins.registry import register_function


@register_function("bench.tick")
async def tick(ms: float, i: int = 0) -> int:
    await anyio.sleep(ms / 1000)
    return i


@register_function("bench.wait_go")
async def wait_go(ctx) -> str:
    while not ctx.inbox():
        await anyio.sleep(0.01)
    return "go"
'''


def chain(name: str, nodes: int, node: dict[str, Any], first: dict[str, Any] | None = None) -> dict[str, Any]:
    ids = [f"n{i}" for i in range(nodes)]
    doc_nodes = [{"id": i, **node} for i in ids]
    if first is not None:
        doc_nodes[0] = {"id": ids[0], **first}
    return {"name": name, "nodes": doc_nodes, "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(db: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "flowkernel", "serve", "--port", str(port), "--db", db],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("flowkernel serve did not start")


def stored_run(db: str, nodes: int) -> str:
    from flowkernel.run.kernel import Kernel

    kernel = Kernel(db)
    flow = kernel.compile(chain("bench-pages", nodes, {"type": "transform", "input": {"expr": "1"}}))
    snap = anyio.run(kernel.run, flow, {})
    kernel.close()
    return snap.runId


def pages(url: str, run_id: str, limit: int, seconds: float) -> dict[str, float]:
    count = events = 0
    took: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as http:
        end = time.monotonic() + seconds
        cursor: str | None = None
        while time.monotonic() < end:
            began = time.perf_counter()
            page = http.get(f"/api/v1/runs/{run_id}/events", params={"limit": limit, **({"cursor": cursor}
                                                                                          if cursor else {})}).json()
            took.append(time.perf_counter() - began)
            count += 1
            events += len(page["items"])
            cursor = page["nextCursor"]
    return {"pages/s": count / seconds, "events/s": events / seconds,
            "page p50 ms": statistics.median(took) * 1000}


async def follow(url: str, run_id: str, latencies: list[float], ready: asyncio.Event, counts: list[int]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=None) as http, \
            http.stream("GET", f"/api/v1/runs/{run_id}/stream") as response:
        ready.set()
        n = 0
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                now = time.time()
                event = json.loads(line[6:])
                latencies.append(now - event["timestamp"] / 1000)
                n += 1
                if event["type"] == "flow:complete":
                    break
        counts.append(n)


async def followers(url: str, run_id: str, clients: int) -> None:
    """One client process (``--follow``): ``clients`` SSE clients in one asyncio loop; prints ``ready``
    once all are connected, then, when the run ends, one JSON line of latencies, counts and CPU time."""
    latencies: list[float] = []
    counts: list[int] = []
    readies = [asyncio.Event() for _ in range(clients)]
    tasks = [asyncio.create_task(follow(url, run_id, latencies, r, counts)) for r in readies]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
    print("ready", flush=True)
    cpu = time.process_time()
    await asyncio.gather(*tasks)
    print(json.dumps({"latencies": latencies, "counts": counts, "cpu": time.process_time() - cpu}), flush=True)


async def fan_out(url: str, db: str, env: dict[str, str], clients: int, nodes: int, tick_ms: float,
                  server_pid: int, procs: int) -> dict[str, float]:
    flows = Path(env["BENCH_DIR"])
    flow_path = flows / "fanout.json"
    flow_path.write_text(json.dumps(chain("bench-fanout", nodes, {"type": "python", "input": {
        "function": "bench.tick", "args": {"ms": tick_ms}}}, first={"type": "python", "input": {
            "function": "bench.wait_go"}})))
    writer = subprocess.Popen([sys.executable, "-m", "flowkernel", "--plugin", PLUGIN, "run", str(flow_path),
                               "--db", db], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(flows))
    run_id = ""
    async with httpx.AsyncClient(base_url=url) as http:
        while not run_id:
            found = (await http.get("/api/v1/runs", params={"flow": "bench-fanout"})).json()["items"]
            run_id = found[0]["runId"] if found else ""
            await asyncio.sleep(0.05)
    # The clients in ``procs`` processes (100 followers are 100 browsers, not one Python loop), plus one
    # lone client in a process of its own: what the server gives a client that reads at once.
    shares = [clients // procs + (i < clients % procs) for i in range(procs)] + [1]
    group = [subprocess.Popen([sys.executable, __file__, "--follow", url, run_id, str(n)], env=env, text=True,
                              stdout=subprocess.PIPE) for n in shares if n]
    for proc in group:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "a client process failed"
    async with httpx.AsyncClient(base_url=url) as http:
        starts = (await http.get(f"/api/v1/runs/{run_id}/events", params={"types": "node:start"})).json()["items"]
        began = time.perf_counter()
        server_cpu = cpu_seconds(server_pid)
        await http.post(f"/api/v1/runs/{run_id}/send", json={"to": starts[0]["runId"], "message": "go"})
    results = []
    for proc in group:
        out, _ = await asyncio.to_thread(proc.communicate, timeout=600)
        results.append(json.loads(out))
    took = time.perf_counter() - began
    server_cpu = cpu_seconds(server_pid) - server_cpu
    writer.wait(60)
    *crowd, lone = results
    ordered = sorted(x for r in crowd for x in r["latencies"])
    alone = sorted(lone["latencies"])
    counts = [n for r in results for n in r["counts"]]
    # How busy each side was while the run streamed: CPU seconds per wall second, in percent.
    return {"clients": clients, "client processes": len(crowd), "events per client": statistics.median(counts),
            "events/s delivered": sum(counts) / took, "latency p50 ms": ordered[len(ordered) // 2] * 1000,
            "latency p99 ms": ordered[int(len(ordered) * 0.99)] * 1000,
            "lone client p50 ms": alone[len(alone) // 2] * 1000, "lone client p99 ms": alone[int(len(alone) * 0.99)] * 1000,
            "server CPU %": 100 * server_cpu / took,
            "client processes CPU %": 100 * sum(r["cpu"] for r in crowd) / took, "load average": os.getloadavg()[0]}


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    faulthandler.dump_traceback_later(float(os.environ.get("BENCH_DUMP_S", "0")) or 1e9, exit=True)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", help="a store URL (default: a fresh SQLite file)")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--tick-ms", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--client-procs", type=int, default=4, help="processes the SSE clients are spread over")
    p.add_argument("--follow", nargs=3, metavar=("URL", "RUN", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.follow:
        url, run_id, n = args.follow
        asyncio.run(followers(url, run_id, int(n)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
        db = args.db or str(Path(tmp) / "bench.db")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(ROOT)]), "BENCH_DIR": tmp}
        run_id = stored_run(db, 400)
        server, url = serve(db, env)
        try:
            results: dict[str, dict[str, float]] = {}
            for limit in (50, 500):
                results[f"GET events limit={limit}"] = pages(url, run_id, limit, args.seconds)
            results["stream fan-out"] = asyncio.run(fan_out(url, db, env, args.clients, args.nodes, args.tick_ms,
                                                                server.pid, args.client_procs))
        finally:
            server.terminate()
            server.wait(30)
    for name, figures in results.items():
        print(f"{name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
