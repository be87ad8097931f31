"""What a browser does with `flowkernel serve`, seen from Chromium: a page of another loopback port
cannot command a run, and a browser's stream of a finished run ends instead of reconnecting forever.

A real `flowkernel serve` process and Debian's Chromium, as in tests/test_webui.py; the attacking
page is served by a plain HTTP server of this process on another loopback port.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.run.kernel import Kernel
from flowkernel.store.open import open_store

from tests.browser_support import CHROMIUM_ARGS, Server, Watched, chromium_path, serve, watch, why_no_browser

pytestmark = pytest.mark.skipif(why_no_browser() is not None, reason=f"browser tests: {why_no_browser()}")

ASK = {"name": "ask", "nodes": [{"id": "q", "type": "human.input", "input": {"prompt": "Proceed?"}}], "edges": []}
DONE = {"name": "done", "nodes": [{"id": "a", "type": "noop", "input": {"v": 1}},
                                  {"id": "b", "type": "noop", "input": {"v": 2}}], "edges": [{"from": "a", "to": "b"}]}
BOUND_MS = 20_000  # how long the page gives a stream to end before it reports that it did not (only a failure waits)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = str(tmp_path_factory.mktemp("crosssite") / "runs.db")
    Kernel(open_store(db, create=True)).close()
    return db


@pytest.fixture(scope="module")
def server(store_path: str) -> Iterator[Server]:
    with serve(store_path, "--workers", "0") as s:
        yield s


@pytest.fixture
def kernel(store_path: str) -> Iterator[Kernel]:
    k = Kernel(open_store(store_path))
    yield k
    k.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    yield context.new_page()
    context.close()


class _Pages(http.server.ThreadingHTTPServer):
    html = ""


class _Page(http.server.BaseHTTPRequestHandler):
    server: _Pages

    def do_GET(self) -> None:
        body = self.server.html.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def other_origin() -> Iterator[_Pages]:
    """An HTTP server on another loopback port: another origin, which serves ``html`` at every path."""
    pages = _Pages(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=pages.serve_forever, daemon=True)
    thread.start()
    yield pages
    pages.shutdown()
    pages.server_close()


def executed(kernel: Kernel, flow: dict[str, Any]) -> RunSnapshot:
    """A run of ``flow`` executed until it stops, in a thread of its own (as another process would; the
    browser driver owns this thread's event loop)."""
    done: list[RunSnapshot] = []
    thread = threading.Thread(target=lambda: done.append(anyio.run(kernel.run, kernel.compile(flow), {})))
    thread.start()
    thread.join(60)
    assert done, "the run did not stop"
    return done[0]


def waiting_run(kernel: Kernel) -> str:
    snap = executed(kernel, ASK)
    assert snap.status == "waiting"
    return snap.runId


def test_a_page_of_another_loopback_port_cannot_abort_or_pause_a_run(
        page: Any, server: Server, kernel: Kernel, other_origin: _Pages) -> None:
    run_id = waiting_run(kernel)
    before = kernel.store.get_run(run_id)
    api = f"{server.url}/api/v1/runs/{run_id}"
    # What the page that aborted runs did: a POST the browser sends without asking the server first
    # (no-cors, text/plain, empty body), then forms, which navigate there.
    other_origin.html = f"""<!doctype html><html><body>
<form id="pause" method="POST" action="{api}/pause" enctype="text/plain"><input name="x" value="y"></form>
<form id="abort" method="POST" action="{api}/abort"><input name="reason" value="gotcha"></form>
<script>
if (location.search === "?fetch") {{
  window.sent = fetch("{api}/abort", {{method: "POST", mode: "no-cors", body: "",
                                       headers: {{"Content-Type": "text/plain"}}}})
    .then(() => "sent", (error) => "failed: " + error);
}}
</script></body></html>"""
    attacker = f"http://127.0.0.1:{other_origin.server_address[1]}/"
    assert attacker.rstrip("/") != server.url  # same host, another port: another origin
    with page.expect_response(f"{api}/abort") as fetched:
        page.goto(attacker + "?fetch")
    assert page.evaluate("window.sent") == "sent"  # the request left the page (its answer is opaque to it)
    assert fetched.value.status == 403
    for form in ("pause", "abort"):
        page.goto(attacker)
        with page.expect_navigation(url=f"{api}/{form}") as posted:  # to the server's answer, loaded
            page.evaluate(f"document.getElementById('{form}').submit()")
        assert posted.value is not None and posted.value.status == 403, form
    after = kernel.store.get_run(run_id)
    assert (after.status, after.seq) == ("waiting", before.seq)  # not aborted, nothing even recorded


def open_ui(browser: Any, server: Server) -> tuple[Any, Watched]:
    context = browser.new_context()
    ui = watch(context.new_page(), server.url)
    ui.goto("")
    return context, ui


def test_an_event_source_on_a_completed_run_gets_every_event_once_and_stops_reconnecting(
        browser: Any, server: Server, kernel: Kernel) -> None:
    run_id = executed(kernel, DONE).runId
    last = kernel.store.get_run(run_id).seq
    context, ui = open_ui(browser, server)
    try:
        got = ui.page.evaluate("""([runId, bound]) => new Promise((resolve) => {
          const seqs = [];
          let opens = 0;
          const source = new EventSource(`api/v1/runs/${runId}/stream`);
          for (const type of ["flow:start", "node:start", "node:complete", "edge:fire", "flow:complete"]) {
            source.addEventListener(type, (e) => seqs.push(Number(e.lastEventId)));
          }
          source.onopen = () => { opens += 1; };
          source.onerror = () => {
            if (source.readyState === EventSource.CLOSED) resolve({ended: true, opens, seqs});
          };
          setTimeout(() => { source.close(); resolve({ended: false, opens, seqs}); }, bound);
        })""", [run_id, BOUND_MS])
    finally:
        context.close()
    assert got["ended"], got  # the browser gave up reconnecting: the server said there is no more
    assert sorted(got["seqs"]) == list(range(1, last + 1)) and got["opens"] == 1, got
    streams = [u for u in ui.requests if f"/runs/{run_id}/stream" in u]
    assert len(streams) == 2, streams  # the stream, and the one reconnection that was told it is over


def test_the_web_ui_stops_following_a_finished_run_it_has_seen_to_the_end(
        browser: Any, server: Server, kernel: Kernel) -> None:
    run_id = executed(kernel, DONE).runId
    last = kernel.store.get_run(run_id).seq
    context, ui = open_ui(browser, server)
    try:
        got = ui.page.evaluate("""async ([runId, after, bound]) => {
          const { followStream } = await import("./api.js");
          const stop = new AbortController();
          const states = [];
          const following = followStream(runId, {after, signal: stop.signal,
            onEvent: (event) => states.push(`event ${event.seq}`), onState: (state) => states.push(state)});
          const outcome = await Promise.race([following.then(() => "returned"),
            new Promise((resolve) => setTimeout(() => resolve("still following"), bound))]);
          stop.abort();
          return {outcome, states};
        }""", [run_id, last, BOUND_MS])
        ui.assert_clean()
    finally:
        context.close()
    assert got == {"outcome": "returned", "states": ["closed"]}, got
    assert len([u for u in ui.requests if f"/runs/{run_id}/stream" in u]) == 1

