"""Commands a run must refuse or define, as a user types them: text that is not UTF-8, a send to a
human.input, a huge refused message, a node id instead of a node run id."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import pytest
from flowkernel.core.commands import PREVIEW_CHARS, Command
from flowkernel.core.events import CommandReceived
from flowkernel.core.node import WaitFor
from flowkernel.errors import CommandRejectedError
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore

import tests.plugins.waiters  # noqa: F401  (registers the functions)
from tests.helpers import flow, py, registry

PLUGIN = "tests.plugins.waiters"
BAD = b"bad\xff"  # what $'bad\xff' hands a command


def fk(*args: str | bytes, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", "--plugin", PLUGIN, *args], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=60)


def spawn(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "--plugin", PLUGIN, *args], cwd=cwd, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def events_until(stream: IO[str], predicate: Any) -> Iterator[dict[str, Any]]:
    for line in stream:
        event = json.loads(line)
        yield event
        if predicate(event):
            return
    raise AssertionError("the run ended before the expected event")


def write_flow(tmp_path: Path, name: str, nodes: list[dict[str, Any]],
               edges: list[dict[str, Any]] | None = None) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"name": name, "nodes": nodes, "edges": edges or []}))
    return str(path)


def stored_events(run_id: str, tmp_path: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    out = fk("events", run_id, "--json", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def received(run_id: str, tmp_path: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    return [e for e in stored_events(run_id, tmp_path, env) if e["type"] == "command:received"]


def pending_rows(db: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT id, body FROM commands WHERE taken_seq IS NULL").fetchall()
    finally:
        con.close()


def waiting_approval(tmp_path: Path, env: dict[str, str], schema: dict[str, Any] | None = None) -> tuple[str, str]:
    ask: dict[str, Any] = {"prompt": "Ship it?"}
    if schema is not None:
        ask["schema"] = schema
    path = write_flow(tmp_path, "approve", [{"id": "ask", "type": "human.input", "input": ask},
                                            {"id": "after", "type": "noop", "input": {"got": "{{ ask }}"}}],
                      [{"from": "ask", "to": "after"}])
    run = fk("run", path, "--json", cwd=tmp_path, env=env)
    assert run.returncode == 3, run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines()]
    waiting = next(e for e in events if e["type"] == "node:waiting")
    return events[0]["flowRunId"], waiting["runId"]


# -- 11.5: text that is not UTF-8 ----------------------------------------------------------------

def test_invalid_utf8_is_refused_on_a_run_no_process_executes(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run_id, target = waiting_approval(tmp_path, clean_env)
    for command in (("send", run_id, "--to", target, BAD), ("reply", run_id, "--to", target, BAD)):
        res = fk(*command, cwd=tmp_path, env=clean_env)
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
        assert "not valid UTF-8 text (byte 0xff at character 3)" in res.stderr
    records = received(run_id, tmp_path, clean_env)
    assert [(r["command"], r["accepted"]) for r in records] == [("send", False), ("reply", False)]
    assert all(r["contentPreview"] == "bad\ufffd" and r["contentBytes"] == 4 and "content" not in r for r in records)
    good = fk("reply", run_id, "--to", target, "yes", cwd=tmp_path, env=clean_env)
    assert good.returncode == 0, good.stderr  # nothing was left behind to trip on


def test_invalid_utf8_resume_message_is_refused(tmp_path: Path, clean_env: dict[str, str]) -> None:
    path = write_flow(tmp_path, "pausable", [{"id": "work", "type": "python", "input": {"function": "block_first_run"}}])
    proc = spawn("run", path, "--json", cwd=tmp_path, env=clean_env)
    assert proc.stdout is not None
    try:
        run_id = next(events_until(proc.stdout, lambda e: e["type"] == "node:start"))["flowRunId"]
        assert fk("pause", run_id, cwd=tmp_path, env=clean_env).returncode == 0
        assert proc.wait(timeout=30) == 3
    finally:
        proc.kill()
    bad = fk("resume", run_id, "--message", BAD, cwd=tmp_path, env=clean_env)
    assert bad.returncode == 2 and "the message is not valid UTF-8 text" in bad.stderr
    assert [(r["command"], r["accepted"]) for r in received(run_id, tmp_path, clean_env)][-1] == ("resume", False)
    good = fk("resume", run_id, "--message", "go on", "--json", cwd=tmp_path, env=clean_env)
    assert good.returncode == 0, good.stderr


def test_invalid_utf8_sent_to_a_run_executing_in_another_process_is_refused_and_the_run_goes_on(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "r.db"
    path = write_flow(tmp_path, "listen", [{"id": "listener", "type": "python", "input": {"function": "await_message"}}])
    proc = spawn("run", path, "--json", "--db", str(db), cwd=tmp_path, env=clean_env)
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "node:start"))
        run_id, target = seen[0]["flowRunId"], seen[-1]["runId"]
        bad = fk("send", run_id, "--to", target, BAD, "--db", str(db), cwd=tmp_path, env=clean_env)
        assert bad.returncode == 2 and "not valid UTF-8 text" in bad.stderr, bad.stderr
        assert bad.stderr.count("\n") == 1
        assert proc.poll() is None, "the executing process must survive the refused command"
        assert pending_rows(db) == []
        good = fk("send", run_id, "--to", target, "hello", "--db", str(db), cwd=tmp_path, env=clean_env)
        assert good.returncode == 0, good.stderr
        rest = list(events_until(proc.stdout, lambda e: e["type"] == "flow:complete"))
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert next(e for e in rest if e["type"] == "node:complete")["output"] == ["hello"]


def test_invalid_utf8_sent_in_process_is_refused_and_the_run_goes_on(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry())
    compiled = kernel.compile(flow([py("listener", "await_message")]))
    refusals: list[str] = []

    async def main() -> Any:
        async with anyio.create_task_group() as tg:
            done: list[Any] = []

            async def execute() -> None:
                done.append(await kernel.run(compiled, {}))

            tg.start_soon(execute)
            while not kernel.runs() or not kernel.snapshot(kernel.runs()[0].runId).nodeRuns:
                await anyio.sleep(0.01)
            run_id = kernel.runs()[0].runId
            target = kernel.snapshot(run_id).nodeRuns["listener"]
            for content in ("bad\udcff", {"k": "\ud800"}, {1: "x"}, {"s": {1, 2}}):
                with pytest.raises(CommandRejectedError) as refused:
                    await kernel.command(run_id, Command(kind="send", target=target, content=content))
                refusals.append(str(refused.value))
            await kernel.command(run_id, Command(kind="send", target=target, content="fine"))
        return done[0]

    snap = anyio.run(main)
    assert snap.status == "completed" and snap.outputs["listener"] == ["fine"]
    assert "byte 0xff at character 3" in refusals[0]
    assert "lone surrogate U+D800" in refusals[1] and "the message.k" in refusals[1]
    assert "not JSON" in refusals[2] and "not JSON (a set)" in refusals[3]


def test_a_queued_command_that_cannot_be_handled_is_refused_once_not_left_to_crash_every_resume(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / ".flowkernel" / "runs.db"
    path = write_flow(tmp_path, "pausable", [{"id": "work", "type": "python", "input": {"function": "block_first_run"}}])
    proc = spawn("run", path, "--json", cwd=tmp_path, env=clean_env)
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "node:start"))
        run_id, target = seen[0]["flowRunId"], seen[-1]["runId"]
        assert fk("pause", run_id, cwd=tmp_path, env=clean_env).returncode == 0
        assert proc.wait(timeout=30) == 3
    finally:
        proc.kill()
    # Queued while nobody executed the run, as another client (or an older flowkernel) could.
    store = SqliteStore(db)
    try:
        store.enqueue_command(run_id, {"kind": "send", "target": target, "content": "bad\udcff"})
        store.enqueue_command(run_id, ["not", "a", "command"])  # type: ignore[arg-type]
    finally:
        store.close()
    first = fk("resume", run_id, "--json", cwd=tmp_path, env=clean_env)
    assert first.returncode == 0, first.stderr
    assert pending_rows(db) == []
    reasons = [r["reason"] for r in received(run_id, tmp_path, clean_env) if not r["accepted"]]
    assert any("not valid UTF-8 text" in r for r in reasons)
    assert any("unknown command '<not a command: list>'" in r for r in reasons)


# -- 11.6: send to a node run waiting in human.input ---------------------------------------------

def test_send_to_a_waiting_human_input_is_its_reply(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run_id, target = waiting_approval(tmp_path, clean_env, schema={"type": "boolean"})
    wrong = fk("send", run_id, "--to", target, "maybe", cwd=tmp_path, env=clean_env)
    assert wrong.returncode == 2 and "send does not match the schema of ask" in wrong.stderr
    sent = fk("send", run_id, "--to", target, "true", "--json", cwd=tmp_path, env=clean_env)
    assert sent.returncode == 0, sent.stderr
    events = stored_events(run_id, tmp_path, clean_env)
    assert events[-1]["type"] == "flow:complete" and events[-1]["status"] == "completed"
    assert next(e for e in events if e["type"] == "node:complete" and e["nodeId"] == "after")["output"] == {"got": True}
    assert len(events) < 30  # answered once, not restarted in a loop


class Stubborn:
    """A node type that waits and ignores every message (a plugin could be written so)."""

    name = "stubborn"
    takes_messages = True  # it reads them; none satisfies it

    async def run(self, ctx: Any) -> Any:
        return WaitFor(prompt="never satisfied")


def test_a_waiting_node_that_ignores_a_message_is_woken_once_not_forever(tmp_path: Path) -> None:
    reg = registry()
    reg.add_node_type(Stubborn())
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=reg)
    snap = anyio.run(kernel.run, kernel.compile(flow([{"id": "s", "type": "stubborn", "input": {}}])), {})
    assert snap.status == "waiting"

    async def send() -> Any:
        with anyio.fail_after(10):  # it used to restart the node forever
            return await kernel.send(snap.runId, snap.waiting["s"].runId, "hello")

    after = anyio.run(send)
    assert after.status == "waiting"
    starts = [e for e in kernel.events(snap.runId) if e.type == "node:start"]
    assert len(starts) == 2  # the first run, and one wake-up for the message


# -- 11.7: a refused command keeps a preview and the size, not the body ----------------------------

def _db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def test_a_refused_ten_megabyte_message_costs_a_preview_not_its_size(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    kernel = Kernel(SqliteStore(db), registry=registry())
    snap = anyio.run(kernel.run, kernel.compile(flow([{"id": "x", "type": "noop"}])), {})
    before = _db_bytes(db)
    huge = "x" * 10_000_000
    with pytest.raises(CommandRejectedError, match="completed"):
        anyio.run(kernel.command, snap.runId, Command(kind="send", target="nr_whatever", content=huge))
    [record] = [e for e in kernel.events(snap.runId) if isinstance(e, CommandReceived)]
    assert record.content is None and record.contentBytes == 10_000_000
    assert record.contentPreview is not None and len(record.contentPreview) == PREVIEW_CHARS
    assert _db_bytes(db) - before < 500_000


def test_a_large_refused_message_through_another_process_leaves_no_body_behind(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "r.db"
    path = write_flow(tmp_path, "listen", [{"id": "listener", "type": "python", "input": {"function": "await_message"}}])
    proc = spawn("run", path, "--json", "--db", str(db), cwd=tmp_path, env=clean_env)
    assert proc.stdout is not None
    big = "y" * 120_000  # near the kernel's limit for one argument (128 KiB)
    try:
        run_id = next(events_until(proc.stdout, lambda e: e["type"] == "node:start"))["flowRunId"]
        res = fk("send", run_id, "--to", "nr_not_a_node_run", big, "--db", str(db), cwd=tmp_path, env=clean_env)
        assert res.returncode == 2 and "is not a live node run" in res.stderr
        assert len(res.stderr) < 1000
        assert fk("abort", run_id, "--db", str(db), cwd=tmp_path, env=clean_env).returncode == 0
        proc.wait(timeout=30)
    finally:
        proc.kill()
    refused = next(r for r in received(run_id, tmp_path, clean_env | {"FLOWKERNEL_DB": str(db)})
                   if not r["accepted"])
    assert refused["contentBytes"] == 120_000 and len(refused["contentPreview"]) == PREVIEW_CHARS
    con = sqlite3.connect(db)
    try:
        assert max(len(body) for (body,) in con.execute("SELECT body FROM commands")) < 200
        assert max(len(body) for (body,) in con.execute("SELECT body FROM events")) < 2000
    finally:
        con.close()


# -- 12.2: --to NODE_ID ----------------------------------------------------------------------------

def test_reply_to_a_node_id_answers_its_one_waiting_node_run(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run_id, target = waiting_approval(tmp_path, clean_env)
    wrong = fk("reply", run_id, "--to", "after", "yes", cwd=tmp_path, env=clean_env)
    assert wrong.returncode == 2
    assert wrong.stderr == f"flowkernel: node after of run {run_id} has no node run waiting for a reply\n"
    res = fk("reply", run_id, "--to", "ask", "yes", "--json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 0, res.stderr
    accepted = [r for r in received(run_id, tmp_path, clean_env) if r["accepted"]]
    assert [(r["command"], r["target"]) for r in accepted] == [("reply", target)]  # the record names the node run


def test_send_to_a_node_id_with_several_live_node_runs_lists_them(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "r.db"
    path = write_flow(tmp_path, "fan", [
        {"id": "start", "type": "noop", "input": {}},
        {"id": "listener", "type": "python", "input": {"function": "await_message"}}],
        [{"from": "start", "to": "listener", "forEach": {"in": "[1, 2]", "as": "i"}}])
    proc = spawn("run", path, "--json", "--db", str(db), cwd=tmp_path, env=clean_env)
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "node:start" and e.get("item") == 1))
        run_id = seen[0]["flowRunId"]
        items = sorted(e["runId"] for e in seen if e["type"] == "node:start" and e.get("item") is not None)
        res = fk("send", run_id, "--to", "listener", "hi", "--db", str(db), cwd=tmp_path, env=clean_env)
        assert res.returncode == 2
        assert res.stderr == (f"flowkernel: node listener of run {run_id} has 2 node runs live ({', '.join(items)}); "
                              "name one with --to NODE_RUN_ID\n")
        for nr in items:
            assert fk("send", run_id, "--to", nr, "hi", "--db", str(db), cwd=tmp_path, env=clean_env).returncode == 0
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
