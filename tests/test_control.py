"""What continues a run through the worker pool is the Kernel's to decide (the server only calls it):
the seq of the command that accepted a resume or retry, read off the command itself; the hand-back
of a replied pooled run to the workers; the refusal of a run no worker may take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.errors import NotPooledError
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore

from tests.helpers import flow, py, registry, t

ASK = flow([{"id": "q", "type": "human.input", "input": {"prompt": "Tea?", "schema": {"type": "string"}}},
            t("done", "q")], [{"from": "q", "to": "done"}], name="ask")


def _fails() -> None:
    raise RuntimeError("not yet")


def _kernel(tmp_path: Path) -> Kernel:
    return Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry(fails=_fails, works=lambda: "ok"))


def _failed_pooled_run(kernel: Kernel) -> str:
    """A run queued for the workers whose one node failed (executed here, as a worker would)."""
    run_id = kernel.enqueue(kernel.compile(flow([py("f", "fails")], name="flaky")))
    assert anyio.run(kernel.execute, run_id).status == "failed"
    return run_id


@pytest.mark.parametrize("changed", [False, True])
def test_continue_in_pool_returns_the_seq_of_its_command_received_when_the_flow_changes(
        tmp_path: Path, changed: bool) -> None:
    kernel = _kernel(tmp_path)
    try:
        run_id = _failed_pooled_run(kernel)
        update = flow([py("f", "works"), t("g", "f")], [{"from": "f", "to": "g"}], name="flaky") if changed else None
        accepted = anyio.run(lambda: kernel.continue_in_pool(run_id, "retry", flow=update))
        events = kernel.events(run_id)
        accepting = events[accepted.seq - 1]
        assert accepting.type == "command:received" and accepting.command == "retry" and accepting.accepted
        after = [e.type for e in events[accepted.seq:]]
        assert after == (["flow:updated", "flow:resumed"] if changed else ["flow:resumed"])
        record = kernel.store.get_run(run_id)
        assert (record.status, record.leaseOwner) == ("running", None), "left to the workers"
    finally:
        kernel.close()


def test_continue_in_pool_of_a_run_not_queued_for_the_workers_is_refused_and_records_nothing(
        tmp_path: Path) -> None:
    kernel = _kernel(tmp_path)
    try:
        snap = anyio.run(kernel.run, kernel.compile(flow([py("f", "fails")])), {})
        with pytest.raises(NotPooledError, match=f"continue it with `flowkernel resume {snap.runId}`"):
            anyio.run(lambda: kernel.continue_in_pool(snap.runId, "resume", message="go"))
        assert kernel.store.get_run(snap.runId).seq == snap.seq
    finally:
        kernel.close()


def test_accept_hands_a_replied_pooled_run_back_to_the_workers(tmp_path: Path) -> None:
    kernel = _kernel(tmp_path)
    try:
        run_id = kernel.enqueue(kernel.compile(ASK))
        waiting = anyio.run(kernel.execute, run_id)
        assert waiting.status == "waiting"
        node_run = waiting.waiting["q"].runId
        accepted = anyio.run(kernel.accept, run_id, Command(kind="reply", target=node_run, content="green"))
        events = kernel.events(run_id)
        assert events[accepted.seq - 1].type == "command:received"
        assert [e.type for e in events[accepted.seq:]] == ["flow:resumed"]
        record = kernel.store.get_run(run_id)
        assert (record.status, record.leaseOwner) == ("running", None), "handed back, not executed here"
        # A worker carries on with it, from where the reply left it.
        assert anyio.run(kernel.execute, run_id).outputs["done"] == "green"
    finally:
        kernel.close()


def test_accept_of_an_abort_of_a_run_nobody_executes_records_it_and_returns_its_seq(tmp_path: Path) -> None:
    kernel = _kernel(tmp_path)
    try:
        run_id = kernel.enqueue(kernel.compile(ASK))
        assert anyio.run(kernel.execute, run_id).status == "waiting"
        accepted = anyio.run(kernel.accept, run_id, Command(kind="abort", reason="lunch"))
        events: list[Any] = kernel.events(run_id)
        assert events[accepted.seq - 1].type == "command:received"
        assert [e.type for e in events[accepted.seq:]] == ["flow:complete"]
    finally:
        kernel.close()
