"""Running ``flowkernel`` in a subprocess that dies at a chosen durable write (``tests.plugins.crashpoint``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from flowkernel.core.events import Event
from flowkernel.run.kernel import Kernel

ROOT = Path(__file__).resolve().parent.parent
KILLED = -signal.SIGKILL
EXAMPLES = ROOT / "flows"
FIXTURES = ROOT / "fixtures"


def env(*plugins: str, crash: str | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI subprocess: the repository importable, the crash plugin loaded."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), out.get("PYTHONPATH", "")) if p)
    out["FLOWKERNEL_PLUGINS"] = ",".join(["tests.plugins.crashpoint", *plugins])
    out["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens: a real model call fails fast
    out["NO_COLOR"] = "1"
    for key in ("FLOWKERNEL_DB", "FLOWKERNEL_CRASH", "FLOWKERNEL_CRASH_COUNT", "CRASH_AT"):
        out.pop(key, None)
    if crash:
        out["FLOWKERNEL_CRASH"] = crash
    out.update(extra or {})
    return out


def flowkernel(db: Path, *args: str, plugins: tuple[str, ...] = (), crash: str | None = None,
               extra_env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """One ``flowkernel`` command on ``db``; with ``crash``, it SIGKILLs itself there."""
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args, "--db", str(db)], cwd=ROOT,
                          env=env(*plugins, crash=crash, extra=extra_env), capture_output=True, text=True,
                          timeout=timeout)


def write_flow(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / f"{document['name']}.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def only_run(db: Path) -> str:
    kernel = Kernel(str(db))
    try:
        runs = [r for r in kernel.runs() if r.parentRunId is None]
        assert len(runs) == 1, runs
        return runs[0].runId
    finally:
        kernel.close()


def conversation(kernel: Kernel, run_id: str, node_id: str) -> list[dict[str, Any]]:
    """The stored messages of one node of a run, in order, as (role, content) dicts."""
    rows = kernel.store.list_agent_messages(flow_run_id=run_id, limit=10_000)
    return [{"role": r["role"], "content": r["content"]} for r in rows if r["nodeId"] == node_id]


def events(kernel: Kernel, run_id: str) -> list[Event]:
    return kernel.events(run_id)


VOLATILE_KEYS = frozenset({"sessionId", "usage", "totalCostUsd", "modelUsage", "durationMs"})


def normalized(value: Any) -> Any:
    """``value`` without what differs between two executions of the same work: session ids, usage,
    cost and durations (a model call made again after a crash is paid again)."""
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return value


def conversations(kernel: Kernel, run_id: str, *, without: frozenset[str] = frozenset()) -> dict[str, list[Any]]:
    """Each agent session of a run: its stored messages (role, content), keyed by session id with the
    run's id taken out; ``without``: texts (resume messages) taken out of user turns."""
    from flowkernel.fixtures.compare import without_texts

    out: dict[str, list[Any]] = {}
    for r in kernel.store.list_agent_messages(flow_run_id=run_id, limit=100_000):
        key = str(r["sessionId"]).replace(run_id.removeprefix("run_"), "*")
        out.setdefault(key, []).append({"role": r["role"], "content": r["content"]})
    return {k: without_texts({"messages": v}, set(without))["messages"] for k, v in out.items()}
