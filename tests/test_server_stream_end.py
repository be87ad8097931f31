"""Streams end: a stream asked for after the last event of a run nothing can continue (completed,
aborted) ends at once, with 204, which tells an EventSource to stop reconnecting (it reconnects after
every stream that ends, with the last id it saw). Against a real `flowkernel serve` process; the
browser side is in tests/test_webui_crosssite.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from flowkernel.run.kernel import Kernel
from flowkernel.server import ServerConfig
from flowkernel.store.open import open_store

from tests.browser_support import serve
from tests.server_support import serving, sse_frames

DONE = {"name": "done", "nodes": [{"id": "a", "type": "noop", "input": {"v": 1}},
                                  {"id": "b", "type": "noop", "input": {"v": 2}}], "edges": [{"from": "a", "to": "b"}]}
ASK = {"name": "ask", "nodes": [{"id": "q", "type": "human.input", "input": {"prompt": "Proceed?"}}], "edges": []}
FAILS = {"name": "fails", "nodes": [{"id": "a", "type": "transform", "input": {"expr": '$error("boom")'}}],
         "edges": []}
# Well under the server's 15 s keepalive: a stream that does not end at once fails the test, not hangs it.
QUICK = httpx.Timeout(10.0)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    k = Kernel(open_store(str(tmp_path / "runs.db"), create=True))
    yield k
    k.close()


def run(kernel: Kernel, flow: dict[str, object]) -> str:
    snap = anyio.run(kernel.run, kernel.compile(flow), {})
    return snap.runId


def test_a_stream_resumed_at_or_past_the_end_of_a_completed_or_aborted_run_ends_at_once(kernel: Kernel) -> None:
    completed = run(kernel, DONE)
    aborted = run(kernel, ASK)
    with serve(kernel.store.location, "--workers", "0") as server, \
            httpx.Client(base_url=f"{server.url}/api/v1", timeout=QUICK) as http:
        assert http.post(f"/runs/{aborted}/abort", json={}).status_code == 202
        assert kernel.store.get_run(aborted).status == "aborted"
        for run_id in (completed, aborted):
            last = kernel.store.get_run(run_id).seq
            for ask in ({"headers": {"Last-Event-ID": str(last)}}, {"params": {"after": last}},
                        {"params": {"after": last + 10}}, {"headers": {"Last-Event-ID": str(last + 1)}}):
                ended = http.get(f"/runs/{run_id}/stream", **ask)  # type: ignore[arg-type]
                assert ended.status_code == 204, (run_id, ask, ended.text)
                assert ended.content == b""
            # from the start: every event, then the end (as before)
            with http.stream("GET", f"/runs/{run_id}/stream") as events:
                frames = list(sse_frames(events))
            assert [f.id for f in frames] == list(range(1, last + 1))
            assert frames[-1].event == "flow:complete"


def test_what_a_finished_run_recorded_after_its_end_is_streamed_and_then_the_stream_ends(kernel: Kernel) -> None:
    run_id = run(kernel, DONE)
    end = kernel.store.get_run(run_id).seq
    with serve(kernel.store.location, "--workers", "0") as server, \
            httpx.Client(base_url=f"{server.url}/api/v1", timeout=QUICK) as http:
        # a command the completed run refuses is recorded after its flow:complete
        assert http.post(f"/runs/{run_id}/pause", json={}).status_code == 409
        refused = kernel.store.get_run(run_id).seq
        assert refused == end + 1
        with http.stream("GET", f"/runs/{run_id}/stream", headers={"Last-Event-ID": str(end)}) as events:
            frames = list(sse_frames(events))
        assert [(f.id, f.event) for f in frames] == [(refused, "command:received")]
        assert http.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": str(refused)}).status_code == 204


def test_a_stream_resumed_at_the_end_of_a_failed_run_stays_open_for_a_retry(kernel: Kernel, tmp_path: Path) -> None:
    run_id = run(kernel, FAILS)
    last = kernel.store.get_run(run_id).seq
    with serving(kernel.store.location, ServerConfig(keepalive_s=0.2)) as live, live.client() as http, \
            http.stream("GET", f"/api/v1/runs/{run_id}/stream", params={"after": last}) as events:
        assert events.status_code == 200
        first = next(sse_frames(events))
        assert first.comment == "keepalive" and first.id is None  # open, waiting for what a retry brings
