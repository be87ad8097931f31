"""The web UI offers the send form only for node runs whose node takes messages (the run detail's
``nodes[…].takesMessages``), in a real Chromium against a ``flowkernel serve`` process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.run.kernel import Kernel
from flowkernel.store.open import open_store

import tests.plugins.waiters  # noqa: F401  (registers await_message, wait_for_file)
from tests.browser_support import (
    CHROMIUM_ARGS,
    WAIT_MS,
    Executor,
    Server,
    chromium_path,
    serve,
    watch,
    why_no_browser,
)
from tests.server_support import wait_for

pytestmark = pytest.mark.skipif(why_no_browser() is not None, reason=f"browser tests: {why_no_browser()}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    db = str(tmp_path / "runs.db")
    Kernel(open_store(db, create=True)).close()
    with serve(db, "--workers", "0", "--plugin", "tests.plugins.waiters") as s:
        yield s


def test_the_send_form_lists_only_node_runs_that_take_messages(browser: Any, server: Server, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    gate = tmp_path / "open"
    flow = tmp_path / "two.json"
    flow.write_text(json.dumps({"name": "two-waiters", "nodes": [
        {"id": "listen", "type": "python", "input": {"function": "await_message"}},
        {"id": "hold", "type": "python", "input": {"function": "wait_for_file", "args": {"path": str(gate)}}}],
        "edges": []}))
    executor = Executor(server.db)
    run_id = executor.start(flow)
    try:
        wait_for(lambda: len(server.api("GET", f"/runs/{run_id}").json()["snapshot"]["nodeRuns"]) == 2,
                 what="both nodes to start")
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        ui = watch(context.new_page(), server.url)
        ui.goto(f"#/runs/{run_id}")
        form = ui.page.locator("form.send-form")
        options = form.get_by_label("To node run").locator("option")
        expect(options).to_have_count(1)
        expect(options).to_have_text(["listen (running)"])
        form.get_by_label("Message").fill("hi")
        form.get_by_role("button", name="Send").click()
        expect(ui.page.locator(".actions .outcome")).to_contain_text("send accepted")
        # Only `hold` is live now, and it reads no messages: no send form at all.
        wait_for(lambda: server.api("GET", f"/runs/{run_id}").json()["snapshot"]["nodeStatus"]["listen"] == "done",
                 what="listen to finish")
        expect(ui.page.locator(".run-head .badge")).to_have_text("running")
        expect(ui.page.locator("form.send-form")).to_have_count(0)
        expect(ui.page.get_by_role("button", name="Pause")).to_be_visible()
        ui.assert_clean()
        context.close()
    finally:
        gate.write_text("")
        executor.join()
