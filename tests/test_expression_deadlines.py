"""A node's timeoutMs bounds the expressions it evaluates, and an abort stops an evaluation at once:
a catastrophic regular expression included, whose match no thread can interrupt (it runs in a child
process that the abort kills)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import anyio
from flowkernel.core.expression_bounds import ExpressionLimits
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore

from tests.test_expression_bounds import events_until, fk, spawn, write_flow

CATASTROPHIC = "$match(flow.input.s, /^(a|a)+$/)"
SUBJECT = "a" * 40 + "!"  # years of backtracking


def test_a_transform_stops_at_its_timeout_though_its_expression_limit_is_longer() -> None:
    kernel = Kernel(MemoryStore(), services={"expression_limits": ExpressionLimits(timeout_ms=20_000)})
    flow = kernel.compile({"name": "timed", "nodes": [
        {"id": "match", "type": "transform", "input": {"expr": CATASTROPHIC}, "policy": {"timeoutMs": 1000}}]})
    started = time.monotonic()
    snap = anyio.run(kernel.run, flow, {"s": SUBJECT})
    assert time.monotonic() - started < 5  # a small multiple of the 1 s timeout, not the 20 s limit
    assert snap.status == "failed"
    [error] = [e for e in kernel.events(snap.runId) if e.type == "node:error"]
    assert (error.errorType, error.message) == ("timeout", "timed out after 1000 ms")


def regex_children(folder: Path) -> list[int]:
    """Processes matching a regular expression for a process that ran in ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if "regex_child.py" in (entry / "cmdline").read_text() and Path(os.readlink(entry / "cwd")) == folder:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_abort_stops_a_catastrophic_match_at_once_and_frees_its_cpu(tmp_path: Path,
                                                                    clean_env: dict[str, str]) -> None:
    env = {**clean_env, "FLOWKERNEL_EXPR_TIMEOUT_MS": "600000"}  # ten minutes: only the abort can stop it
    db = str(tmp_path / "r.db")
    flow = write_flow(tmp_path, [{"id": "match", "type": "transform", "input": {"expr": CATASTROPHIC}}])
    (tmp_path / "input.json").write_text(json.dumps({"s": SUBJECT}))
    proc = spawn("run", flow, "--input-json", str(tmp_path / "input.json"), "--json", "--db", db, cwd=tmp_path,
                 env=env)
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "node:start"))
        run_id = seen[0]["flowRunId"]
        deadline = time.monotonic() + 30
        while not regex_children(tmp_path):  # the match outgrew its slice of the calling thread
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        aborted = fk("abort", run_id, "--reason", "enough", "--db", db, cwd=tmp_path, env=env)
        assert aborted.returncode == 0, aborted.stderr
        began = time.monotonic()
        rest = [json.loads(line) for line in proc.stdout]
        assert proc.wait(timeout=60) == 1
        assert time.monotonic() - began < 10  # the process had nothing left to compute
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    assert rest[-1]["type"] == "flow:complete" and rest[-1]["status"] == "aborted"
    assert regex_children(tmp_path) == []
