"""The API's docs page (``/api/v1/docs``) renders the document from files shipped in the package, in a
real Chromium against a ``flowkernel serve`` process: nothing is requested from any other host, no
inline script runs (its Content-Security-Policy forbids it), and behind a token the page asks for it
and shows the document once given."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.run.kernel import Kernel
from flowkernel.server.docs_page import ASSETS
from flowkernel.store.open import open_store

from tests.browser_support import CHROMIUM_ARGS, WAIT_MS, chromium_path, serve, watch, why_no_browser

pytestmark = pytest.mark.skipif(why_no_browser() is not None, reason=f"browser tests: {why_no_browser()}")

TOKEN = "docs-page-token"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def test_the_page_ships_its_assets_and_no_inline_script() -> None:
    page = (ASSETS / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<script(?![^>]*\ssrc=)", page) is None, "an inline script"
    assert re.search(r"<[^>]*\son\w+=", page) is None and "<style" not in page and "style=" not in page
    assert {"swagger-ui-bundle.js", "swagger-ui.css", "LICENSE", "NOTICE", "docs.js", "docs.css"} <= {
        p.name for p in ASSETS.iterdir()}
    assert "Apache License" in (ASSETS / "LICENSE").read_text(encoding="utf-8")


@pytest.mark.parametrize("token", [None, TOKEN])
def test_the_docs_page_renders_the_document_offline_and_asks_for_the_token(
        browser: Any, tmp_path: Path, token: str | None) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    db = str(tmp_path / "runs.db")
    Kernel(open_store(db, create=True)).close()
    with serve(db, "--workers", "0", token=token) as server:
        # No network but this server: any other request fails (and is recorded as foreign).
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(server.url)
                      else route.abort())
        ui = watch(context.new_page(), server.url)
        ui.goto("api/v1/docs")
        page = ui.page
        if token is not None:
            form = page.locator("#token-form")
            expect(form).to_be_visible()
            page.get_by_label("API token").fill("wrong")
            form.get_by_role("button").click()
            expect(page.locator("#token-message")).to_contain_text("refused")
            page.get_by_label("API token").fill(token)
            form.get_by_role("button").click()
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("flowkernel")
        operations = sum(len(item) for item in server.api("GET", "/openapi.json").json()["paths"].values())
        expect(page.locator(".opblock")).to_have_count(operations)  # every operation of the document
        # "Try it out" sends the token the page was given.
        runs = page.locator(".opblock-get", has=page.locator(".opblock-summary-path",
                                                             has_text=re.compile(r"^/api/v1/runs$")))
        runs.locator(".opblock-summary").click()
        runs.get_by_role("button", name="Try it out").click()
        runs.get_by_role("button", name="Execute").click()
        expect(runs.locator(".live-responses-table tr.response .response-col_status")).to_have_text("200")
        # The document refused without the token is expected on the first load; nothing else is.
        ui.assert_clean(allowed=("401",) if token else ())
        context.close()
