"""A ``send`` reaches only node runs whose type reads messages (``NodeType.takes_messages``); one to any
other node run is refused and recorded, on the command line and over HTTP, and the run detail says
which nodes take messages (what the web UI offers the send form for)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.errors import CommandRejectedError
from flowkernel.plugins.registry import default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.open import open_store

import tests.plugins.waiters  # noqa: F401  (registers await_message and wait_for_file)
from tests.server_support import Live, pool_worker, serving, wait_for

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "tests.plugins.waiters"
REFUSED = "does not take messages"


def two_waiters(gate: Path) -> dict[str, Any]:
    """``listen`` reads its inbox (a function that takes ctx); ``hold`` waits for a file and reads nothing."""
    return {"name": "two-waiters", "nodes": [
        {"id": "listen", "type": "python", "input": {"function": "await_message"}},
        {"id": "hold", "type": "python", "input": {"function": "wait_for_file", "args": {"path": str(gate)}}}],
        "edges": []}


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel", "--plugin", PLUGIN, *args], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=60)


def received(kernel: Kernel, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(b) for b in kernel.store.read_events(run_id) if b.startswith(b'{"type":"command:received"')]


def test_the_built_in_types_say_whether_they_take_messages() -> None:
    reg = default_registry()
    takes = {t: reg.takes_messages(t, {}) for t in ("claude.agent", "human.input", "flow.call", "transform",
                                                     "noop", "state.set")}
    assert takes == {"claude.agent": True, "human.input": True, "flow.call": False, "transform": False,
                     "noop": False, "state.set": False}
    assert reg.takes_messages("python", {"function": "await_message"})  # takes ctx: reads ctx.inbox()
    assert not reg.takes_messages("python", {"function": "wait_for_file"})
    assert reg.takes_messages("python", {"function": "{{ flow.input.fn }}"})  # known only when it starts


def test_send_to_a_python_node_run_that_reads_no_messages_is_refused_and_recorded_on_the_cli(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    gate = tmp_path / "open"
    flow = tmp_path / "two.json"
    flow.write_text(json.dumps(two_waiters(gate)))
    running = subprocess.Popen([sys.executable, "-m", "flowkernel", "--plugin", PLUGIN, "run", str(flow), "--json"],
                               cwd=tmp_path, env=clean_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert running.stdout is not None
        starts: dict[str, str] = {}
        run_id = ""
        for line in running.stdout:
            event = json.loads(line)
            run_id = event["flowRunId"]
            if event["type"] == "node:start":
                starts[event["nodeId"]] = event["runId"]
            if len(starts) == 2:
                break
        refused = fk("send", run_id, "--to", starts["hold"], "are you there?", cwd=tmp_path, env=clean_env)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1 and REFUSED in refused.stderr and "python" in refused.stderr
        # By node id too; and a node run that reads its inbox still gets what is sent to it.
        assert fk("send", run_id, "--to", "hold", "hello?", cwd=tmp_path, env=clean_env).returncode == 2
        sent = fk("send", run_id, "--to", starts["listen"], "hi", cwd=tmp_path, env=clean_env)
        assert sent.returncode == 0, sent.stderr
        gate.write_text("")
        _, err = running.communicate(timeout=60)
        assert running.returncode == 0, err
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    kernel = Kernel(open_store(str(tmp_path / ".flowkernel" / "runs.db")))
    try:
        records = received(kernel, run_id)
        assert [(r["target"], r["accepted"]) for r in records] == [(starts["hold"], False), ("hold", False),
                                                                   (starts["listen"], True)]
        assert REFUSED in records[0]["reason"] and records[0]["contentPreview"] == "are you there?"
        snap = kernel.snapshot(run_id)
        assert snap.outputs["listen"] == ["hi"] and snap.inbox == {}
    finally:
        kernel.close()


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Live]:
    with serving(str(tmp_path / "runs.db")) as live, pool_worker(live.db):
        yield live


def test_send_over_http_to_a_node_run_that_reads_no_messages_is_a_409_and_recorded(pool: Live, tmp_path: Path) -> None:
    gate = tmp_path / "open"
    with pool.client() as http:
        run_id = http.post("/api/v1/runs", json={"flowDocument": two_waiters(gate)}).json()["runId"]
        wait_for(lambda: len(http.get(f"/api/v1/runs/{run_id}").json()["snapshot"]["nodeRuns"]) == 2,
                 what="both nodes to start")
        detail = http.get(f"/api/v1/runs/{run_id}").json()
        assert detail["nodes"] == {"listen": {"type": "python", "takesMessages": True},
                                   "hold": {"type": "python", "takesMessages": False}}
        hold = detail["snapshot"]["nodeRuns"]["hold"]
        refused = http.post(f"/api/v1/runs/{run_id}/send", json={"to": hold, "message": "hello?"})
        assert refused.status_code == 409, refused.text
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert REFUSED in refused.json()["detail"]
        [record] = received(pool.kernel, run_id)
        assert (record["command"], record["accepted"], record["target"]) == ("send", False, hold)
        gate.write_text("")
        listen = detail["snapshot"]["nodeRuns"]["listen"]
        assert http.post(f"/api/v1/runs/{run_id}/send", json={"to": listen, "message": "hi"}).status_code == 202
        wait_for(lambda: http.get(f"/api/v1/runs/{run_id}").json()["run"]["status"] == "completed",
                 what="the run to complete")


def test_a_send_to_a_flow_call_is_refused_rather_than_lost(tmp_path: Path) -> None:
    child = tmp_path / "child.json"
    child.write_text(json.dumps({"name": "child", "nodes": [
        {"id": "ask", "type": "human.input", "input": {"prompt": "?"}}], "edges": []}))
    parent = tmp_path / "parent.json"
    parent.write_text(json.dumps({"name": "parent", "nodes": [
        {"id": "call", "type": "flow.call", "input": {"flow": "child.json"}}], "edges": []}))
    kernel = Kernel(open_store(str(tmp_path / "runs.db")))
    try:
        snap = anyio.run(kernel.run, kernel.load_flow(parent), {})
        assert snap.status == "waiting"
        with pytest.raises(CommandRejectedError, match=REFUSED):
            anyio.run(kernel.command, snap.runId, Command(kind="send", target=snap.waiting["call"].runId,
                                                          content="for the child"))
        assert kernel.snapshot(snap.runId).inbox == {}
    finally:
        kernel.close()
