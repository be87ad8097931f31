"""The web UI shows an agent's compaction: the ``agent:compaction`` event in the timeline and the
compaction block in the stored conversation, in a real Chromium against a ``flowkernel serve`` process."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.run.kernel import Kernel
from flowkernel.store.open import open_store

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

pytestmark = pytest.mark.skipif(why_no_browser() is not None, reason=f"browser tests: {why_no_browser()}")

SUMMARY = "Summary: the user wants a database for a desktop app; SQLite was read about."


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
    with serve(db, "--workers", "0") as s:
        yield s


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=WAIT_MS)
    return playwright_expect(locator)


async def compacting_model(request: dict[str, Any], emit: Callable[[Any], None], ctx: Any) -> dict[str, Any]:
    """A query function (the model-call seam) whose answer starts with a compaction block."""
    return {"content": [{"type": "compaction", "content": SUMMARY, "signature": "sig-c"},
                        {"type": "text", "text": "Use SQLite."}],
            "stopReason": "end_turn", "model": request["model"], "id": "msg_c",
            "usage": {"inputTokens": 900, "outputTokens": 40, "cacheCreationInputTokens": 0, "cacheReadInputTokens": 0},
            "iterations": [{"type": "compaction", "inputTokens": 160_000, "outputTokens": 300},
                           {"type": "message", "inputTokens": 900, "outputTokens": 40}]}


def test_a_compaction_shows_in_the_timeline_and_in_the_conversation(browser: Any, server: Server,
                                                                    tmp_path: Path) -> None:
    flow = tmp_path / "compacting.json"
    flow.write_text(json.dumps({"name": "compacting", "nodes": [
        {"id": "advisor", "type": "claude.agent", "input": {"prompt": "Which database?"}}], "edges": []}))
    executor = Executor(server.db)
    run_id = executor.run(flow, services={"query_fn": compacting_model})
    executor.join()
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        ui = watch(context.new_page(), server.url)
        ui.goto(f"#/runs/{run_id}")
        page = ui.page
        expect(page.locator(".run-head .badge")).to_have_text("completed")
        row = page.locator('li.noderun[data-node="advisor"] li.ev-compaction')
        expect(row).to_have_count(1)
        expect(row).to_contain_text("context compacted: 160000 tokens summarized, the answer made from 900")

        page.get_by_role("tab", name="Agents").click()
        agent = page.locator('details.agent-run[data-node="advisor"]')
        agent.locator("summary").first.click()
        block = agent.locator("details.block-compaction")
        expect(block).to_have_count(1)
        expect(block.locator("summary")).to_have_text("compaction: the conversation before this was summarized")
        block.locator("summary").click()
        expect(block).to_contain_text(SUMMARY)
        ui.assert_clean()
    finally:
        context.close()
