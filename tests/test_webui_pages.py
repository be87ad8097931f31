"""The web UI's flows, search, time travel, workers and the safety of run data, in a real headless
Chromium against one ``flowkernel serve`` process for the module (DESIGN §10).

The server has the example flows and a folder of its own (a flow whose name, description, node ids,
prompt, output and error are HTML and script), executes runs with its own workers (model calls from
the fixture files), and the page is allowed to reach nothing but it: every other request is aborted
and counted. Screenshots of every page at 1280 by 800 and 420 by 800 go to ``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import flowkernel.examples.research_tools  # noqa: F401  (registers lookup_fact for the in-process agent)
import pytest
from flowkernel.run.kernel import Kernel
from flowkernel.server.webui import CONTENT_SECURITY_POLICY
from flowkernel.store.open import open_store

import tests.plugins.waiters  # noqa: F401  (registers wait_for_file)
from tests.browser_support import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    WAIT_MS,
    Executor,
    Server,
    Watched,
    chromium_path,
    serve,
    watch,
    why_no_browser,
)
from tests.server_support import wait_for

pytestmark = pytest.mark.skipif(why_no_browser() is not None, reason=f"browser tests: {why_no_browser()}")

ROOT = Path(__file__).resolve().parent.parent
FLOWS = ROOT / "flows"
FIXTURES = ROOT / "fixtures"
SHOTS = ARTIFACTS / "screenshots"
WIDTHS = {"wide": (1280, 800), "narrow": (420, 800)}

# What a model, a tool or a flow author could put in a run's data. Any of it that ran would set
# window.__pwned or open a dialog; any of it that loaded would be a request to another host.
SCRIPT = ("<img src=x onerror=\"window.__pwned='img'\"><script>window.__pwned='script'</script>"
          "<svg onload=\"window.__pwned='svg'\"></svg><img src=y onerror=alert('img')>")
FLOW_NAME = "<img src=x onerror=alert('flow-name')>"
NODE_ID = "<svg onload=alert('node-id')>"
AGENT_TEXT = """# Findings

- **bold** point
- a `code` point

```python
print("<script>window.__pwned='code'</script>")
```

A [safe link](https://docs.example.invalid/page), a [bad one](javascript:window.__pwned='link') and
<a href="javascript:alert('raw-link')">a raw one</a>.

![remote image](http://images.example.invalid/pixel.png)
<img src="http://images.example.invalid/raw.png" onerror="window.__pwned='md-img'">
<iframe src="http://frames.example.invalid/"></iframe>
<form action="http://forms.example.invalid/"><button>go</button></form>
<div style="background:url(http://css.example.invalid/bg.png)">styled</div>
<script>window.__pwned='md-script'</script>
"""
PAYLOAD_FLOW = {
    "name": FLOW_NAME, "description": f"<b>description</b> {SCRIPT}",
    "inputs": {"type": "object", "properties": {"who": {
        "type": "string", "title": "<b onmouseover=alert('title')>who</b>", "description": SCRIPT, "default": SCRIPT}}},
    "nodes": [{"id": NODE_ID, "type": "transform", "input": {"expr": "flow.input.who"}},
              {"id": "fail", "type": "transform", "policy": {"continueOnError": True},
               "input": {"expr": f"$error({json.dumps(SCRIPT)})"}},
              {"id": "ask", "type": "human.input", "input": {"prompt": SCRIPT, "schema": {
                  "type": "object", "properties": {"answer": {"type": "string", "title": SCRIPT}}}}}],
    "edges": [{"from": NODE_ID, "to": "fail"}, {"from": "fail", "to": "ask"}]}
HELD = {"name": "held", "maxConcurrentRuns": 1, "nodes": [
    {"id": "hold", "type": "python", "input": {"function": "wait_for_file", "args": {"path": "{{ flow.input.gate }}"}}}],
    "edges": []}
APPROVAL = {"name": "release", "description": "a human approves the release before it is published", "nodes": [
    {"id": "review", "type": "human.input", "input": {"prompt": "Approve the release of version 2.4?", "schema": {
        "type": "object", "required": ["approved"],
        "properties": {"approved": {"type": "boolean", "title": "Approved"},
                       "comment": {"type": "string", "description": "what the team should know"},
                       "risk": {"enum": ["low", "high"]}}}}},
    {"id": "publish", "type": "transform", "input": {"expr": "review"}}],
    "edges": [{"from": "review", "to": "publish"}]}
SHOUT = {"name": "shout", "nodes": [{"id": "loud", "type": "transform", "input": {"expr": "$uppercase(flow.input.text)"}}],
         "edges": []}
FAILS = {"name": "fails", "nodes": [{"id": "boom", "type": "transform",
                                     "input": {"expr": "$error('Disk quota 100% used')"}}], "edges": []}


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
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pages")


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[Server]:
    flows = folder / "flows"
    flows.mkdir()
    for file, doc in (("payload", PAYLOAD_FLOW), ("held", HELD), ("fails", FAILS), ("shout", SHOUT)):
        (flows / f"{file}.json").write_text(json.dumps(doc))
    db = str(folder / "runs.db")
    Kernel(open_store(db, create=True)).close()
    with serve(db, "--flows", str(FLOWS), "--flows", str(flows), "--workers", "2", "--grace-s", "1",
               "--fixtures", str(FIXTURES), "--plugin", "tests.plugins.waiters",
               "--plugin", "flowkernel.examples.research_tools") as s:
        yield s


class Page(Watched):
    """A watched page that may reach only the server: anything else is aborted (and recorded), so
    nothing a run's data names is ever fetched. Dialogs are recorded and dismissed, and every answer
    of the UI (not the API) is checked for the Content-Security-Policy."""

    dialogs: list[str]
    blocked: list[str]
    unguarded: list[str]

    def assert_clean(self, *, allowed: tuple[str, ...] = ()) -> None:
        super().assert_clean(allowed=allowed)
        assert self.blocked == [], f"the page asked other hosts for {self.blocked}"
        assert self.unguarded == [], f"answered without the Content-Security-Policy: {self.unguarded}"
        assert self.dialogs == [], self.dialogs


@pytest.fixture
def open_page(browser: Any, server: Server) -> Iterator[Callable[..., Page]]:
    contexts: list[Any] = []
    origin = urlsplit(server.url).netloc

    def open_(fragment: str = "", *, width: int = 1280, height: int = 800) -> Page:
        context = browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        page = context.new_page()
        watched = watch(page, server.url)
        ui = Page(page=page, server=server.url, console=watched.console, errors=watched.errors,
                  requests=watched.requests)
        ui.dialogs, ui.blocked, ui.unguarded = [], [], []

        def route(r: Any) -> None:
            if urlsplit(r.request.url).netloc == origin or r.request.url.startswith(("data:", "blob:")):
                r.continue_()
            else:
                ui.blocked.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        page.on("dialog", lambda d: (ui.dialogs.append(d.message), d.dismiss()))
        page.on("response", lambda r: ui.unguarded.append(f"{r.status} {r.url}") if urlsplit(r.url).path.startswith("/")
                and not urlsplit(r.url).path.startswith("/api/")
                and r.headers.get("content-security-policy") != CONTENT_SECURITY_POLICY else None)
        ui.goto(fragment)
        return ui

    yield open_
    for c in contexts:
        c.close()


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=WAIT_MS)
    return playwright_expect(locator)


def api_run(server: Server, body: dict[str, Any], wait: float = 30) -> dict[str, Any]:
    created = server.api("POST", "/runs", params={"wait": wait}, json=body)
    assert created.status_code in (200, 201), created.text
    run: dict[str, Any] = created.json()
    return run


def events(server: Server, run_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = server.api("GET", f"/runs/{run_id}/events", params={"limit": 500}).json()["items"]
    return items


def shot(ui: Watched, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    ui.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def assert_fits(ui: Watched, what: str) -> None:
    """Nothing is wider than the window: the page never scrolls sideways."""
    overflow = ui.page.evaluate("document.scrollingElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{what} scrolls sideways by {overflow}px"


class ScriptedAgent:
    """The model-call seam, answering each call with the next scripted content."""

    def __init__(self, *replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)

    async def __call__(self, request: dict[str, Any], emit: Callable[[Any], None], ctx: Any) -> dict[str, Any]:
        from flowkernel.core.events import AgentText

        content = self.replies.pop(0)
        for block in content:
            if block["type"] == "text":
                emit(AgentText(content=block["text"]))  # what a streamed text block ends with
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        return {"content": content, "stopReason": stop, "model": request["model"], "id": f"msg_{len(self.replies)}",
                "usage": {"inputTokens": 20, "outputTokens": 5, "cacheCreationInputTokens": 0,
                          "cacheReadInputTokens": 0}}


# --- starting runs -------------------------------------------------------------------------------


def test_a_run_started_from_a_flows_form_opens_live_and_an_idempotency_key_opens_it_again(
        open_page: Callable[..., Page], server: Server) -> None:
    ui = open_page("#/flows")
    page = ui.page
    card = page.locator('.flow-card[data-flow="hello"]')
    expect(card).to_contain_text(json.loads((FLOWS / "hello.json").read_text())["description"][:40])
    expect(card.locator(".inputs-summary")).to_contain_text("name *")
    card.get_by_role("link", name="Start a run").click()
    expect(page).to_have_url(re.compile(r"#/flows/hello$"))
    form = page.locator('.flow-card[data-flow="hello"] form.start-form')
    form.get_by_label("Idempotency key (optional)").fill("the-same-start")
    form.get_by_role("button", name="Start run").click()
    expect(form.locator(".field-error").first).to_be_visible()  # `name` is required: checked before sending
    form.get_by_label("name").fill("Ada")
    form.get_by_role("button", name="Start run").click()
    expect(page).to_have_url(re.compile(r"#/runs/run_[0-9a-z]+$"))
    run_id = page.url.rsplit("/", 1)[1]
    expect(page.locator(".run-head .badge")).to_have_text("completed")  # a worker ran it; the page followed
    assert server.api("GET", f"/runs/{run_id}").json()["run"]["input"] == {"name": "Ada"}

    # The same key again opens the run it started; JSON gives what a form cannot.
    ui.goto("#/flows/hello")
    form = page.locator('.flow-card[data-flow="hello"] form.start-form')
    form.locator("details.as-json > summary").click()
    form.get_by_label("The run's input, a JSON value").fill('{"name": "Ada"}')
    form.get_by_label("Idempotency key (optional)").fill("the-same-start")
    form.get_by_role("button", name="Start run").click()
    expect(page).to_have_url(re.compile(rf"#/runs/{run_id}$"))
    ui.assert_clean()


# --- time travel ---------------------------------------------------------------------------------


def test_fork_from_an_event_with_a_changed_input_and_rerun_from_the_run_page(
        open_page: Callable[..., Page], server: Server, folder: Path) -> None:
    original = api_run(server, {"flow": "hello", "input": {"name": "Ada"}})["runId"]
    recorded = events(server, original)
    at = next(e["seq"] for e in recorded if e["type"] == "node:start" and e["nodeId"] == "greet")
    ui = open_page(f"#/runs/{original}?at={at}")
    page = ui.page
    # ?at=SEQ: that event is highlighted, in view, and the slider is on it.
    row = page.locator(f'.timeline li.ev[data-seq="{at}"]')
    expect(row).to_have_class(re.compile(r"\bcurrent\b"))
    expect(row).to_be_in_viewport()
    expect(page.get_by_label("Snapshot after event")).to_have_value(str(at))

    page.get_by_role("button", name="Fork from here").click()
    fork = page.locator("form.fork-form")
    expect(fork.locator("h3")).to_have_text(f"Fork from the snapshot after event #{at} (node:start)")
    fork.get_by_label("Input changes (JSON object, optional)").fill("[1]")
    fork.get_by_role("button", name="Start the fork").click()
    expect(fork.locator(".field-error")).to_contain_text("must be a JSON object")
    fork.get_by_label("Input changes (JSON object, optional)").fill('{"name": "Grace"}')
    fork.get_by_role("button", name="Start the fork").click()
    expect(page).to_have_url(re.compile(r"#/runs/run_[0-9a-z]+$"))
    fork_id = page.url.rsplit("/", 1)[1]
    assert fork_id != original
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    expect(page.locator(".run-meta")).to_contain_text(f"fork of{original} at #{at}")
    # Its first events are the original's up to the fork, then it went on from there.
    types = page.locator(".timeline li.ev[data-seq]")
    expect(page.locator(f'.timeline li.ev[data-seq="{at + 1}"] .ev-type')).to_have_text("flow:resumed")
    copied = events(server, fork_id)
    assert [e["type"] for e in copied[:at]] == [e["type"] for e in recorded[:at]]
    assert copied[0]["forkedFrom"] == original and copied[0]["input"] == {"name": "Grace"}
    assert types.count() == len(copied)

    # Rerun: a new run from the original's recording, which says it matches.
    ui.goto(f"#/runs/{original}")
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    page.get_by_role("button", name="Rerun").click()
    expect(page).to_have_url(re.compile(r"#/runs/run_[0-9a-z]+$"))
    expect(page.locator(".rerun-note .rerun-verdict")).to_have_text(f"Matches the recording of {original}.")
    expect(page.locator(".run-meta")).to_contain_text(f"rerun of{original}")
    rerun_id = page.url.rsplit("/", 1)[1]
    assert events(server, rerun_id)[-1]["rerun"] == {"of": original, "matches": True}

    # A rerun takes the flow file as it is now: a changed flow diverges, and the page says where.
    shouted = api_run(server, {"flow": "shout", "input": {"text": "hi"}})["runId"]
    changed = {**SHOUT, "nodes": [{**SHOUT["nodes"][0], "input": {"expr": "$lowercase(flow.input.text)"}}]}
    (folder / "flows" / "shout.json").write_text(json.dumps(changed))
    try:
        ui.goto(f"#/runs/{shouted}")
        expect(page.locator(".run-head .badge")).to_have_text("completed")
        page.get_by_role("button", name="Rerun").click()
        verdict = page.locator(".rerun-note .rerun-verdict.diverges")
        start = next(e["seq"] for e in events(server, shouted) if e["type"] == "node:start")
        expect(verdict).to_contain_text(f"Diverges from the recording at event #{start} of {shouted} (event):")
        expect(verdict.locator("pre")).to_contain_text("$uppercase(flow.input.text)")
        verdict.get_by_role("link").click()
        expect(page).to_have_url(re.compile(rf"#/runs/{shouted}\?at={start}$"))
        expect(page.locator(f'.timeline li.ev[data-seq="{start}"]')).to_have_class(re.compile(r"\bcurrent\b"))
    finally:
        (folder / "flows" / "shout.json").write_text(json.dumps(SHOUT))
    ui.assert_clean()


# --- finding runs --------------------------------------------------------------------------------


def test_runs_are_searched_by_id_error_text_and_status_and_the_search_is_in_the_address(
        open_page: Callable[..., Page], server: Server) -> None:
    failed = [api_run(server, {"flow": "fails"})["runId"] for _ in range(2)]
    ok = api_run(server, {"flow": "hello", "input": {"name": "Ada"}})["runId"]
    ui = open_page("#/")
    page = ui.page
    expect(page.locator(f'tr[data-run="{ok}"]')).to_have_count(1)
    page.get_by_label("Error").fill("QUOTA 100%")
    page.get_by_label("Error").press("Enter")
    expect(page).to_have_url(re.compile(r"error=QUOTA\+100%25"))
    expect(page.locator("tbody tr[data-run]")).to_have_count(2)
    for run_id in failed:
        expect(page.locator(f'tr[data-run="{run_id}"] .error-cell')).to_contain_text("Disk quota 100% used")
    shared = page.url
    # The address is the search: opened anew, it shows the same runs.
    again = open_page(shared.split("/", 3)[3])
    expect(again.page.get_by_label("Error")).to_have_value("QUOTA 100%")
    expect(again.page.locator("tbody tr[data-run]")).to_have_count(2)
    page.get_by_label("Error").fill("")
    page.get_by_label("Run id").fill(ok)
    page.get_by_role("button", name="Search").click()
    expect(page.locator("tbody tr[data-run]")).to_have_count(1)
    expect(page.locator(f'tr[data-run="{ok}"]')).to_have_count(1)
    page.select_option("select[name=status]", "failed")
    expect(page.locator("tbody tr .empty")).to_have_text("No run matches these filters.")
    ui.assert_clean()
    again.assert_clean()


# --- reading a run -------------------------------------------------------------------------------


def test_typing_into_a_field_before_the_last_search_lands_is_kept(open_page: Callable[..., Page],
                                                                    server: Server) -> None:
    """Leaving one field searches (its change event sets the address); the page learns of the new
    address a moment later, by when the user may have typed into the next field: that text stays."""
    ok = api_run(server, {"flow": "hello", "input": {"name": "Grace"}})["runId"]
    api_run(server, {"flow": "fails"})
    ui = open_page("#/?error=QUOTA")
    page = ui.page
    expect(page.get_by_label("Error")).to_have_value("QUOTA")
    # One task: the error field is emptied and left (a search for everything), and the run id typed,
    # all before the hashchange of that search is handled.
    page.evaluate("""(id) => {
        const error = document.querySelector('input[name=error]');
        error.value = '';
        error.dispatchEvent(new Event('change'));
        document.querySelector('input[name=run]').value = id;
    }""", ok)
    expect(page).to_have_url(re.compile(r"#/$"))
    expect(page.get_by_label("Run id")).to_have_value(ok)
    page.get_by_role("button", name="Search").click()
    expect(page).to_have_url(re.compile(rf"run={ok}$"))
    expect(page.locator("tbody tr[data-run]")).to_have_count(1)
    # An address from elsewhere (Back) still fills the fields.
    page.go_back()
    expect(page.get_by_label("Run id")).to_have_value("")
    ui.assert_clean()


def test_a_failed_run_shows_its_error_once_with_the_diffs_lines_and_the_timeline_reads_in_order(
        open_page: Callable[..., Page], server: Server) -> None:
    # The recorded planner call asked for "CSV export": another feature makes the fixture refuse it.
    run = api_run(server, {"flow": "review-loop", "input": {"feature": "csv export"}})
    assert run["status"] == "failed"
    failure = next(e for e in events(server, run["runId"]) if e["type"] == "node:error")
    first_line = failure["message"].splitlines()[0]
    ui = open_page(f"#/runs/{run['runId']}")
    page = ui.page
    banner = page.locator(".run-error")
    expect(banner.locator("pre.error-message")).to_contain_text(failure["message"].splitlines()[1].strip())
    # recorded and live lines stay one under the other (innerText follows the CSS: collapsed, they would not)
    assert banner.locator("pre.error-message").inner_text().splitlines()[1:3] == failure["message"].splitlines()[1:3]
    expect(banner.locator("details")).to_contain_text(f"details (event #{failure['seq']})")
    row = page.locator(f'li.ev[data-seq="{failure["seq"]}"]')
    expect(row).to_contain_text(f"{failure['errorType']}: the run's error, shown above")
    expect(page.locator(".timeline li.ev .ev-type").last).to_have_text("flow:complete")
    expect(page.locator(".timeline li.ev").last.locator(".ev-text")).to_have_text("run failed: the run's error, shown above")
    timeline = page.locator(".panel-timeline")
    assert timeline.inner_text().count(first_line) == 0  # the banner says it; the timeline does not repeat it

    page.get_by_role("button", name="in order").click()
    expect(page).to_have_url(re.compile(r"timeline=order"))
    expect(page.locator(".timeline li.noderun")).to_have_count(0)
    seqs = [int(s) for s in page.locator(".timeline > li.ev").evaluate_all("els => els.map(e => e.dataset.seq)")]
    assert seqs == list(range(1, len(events(server, run["runId"])) + 1))  # every event, in seq order
    expect(page.locator(f'.timeline > li.ev[data-seq="{failure["seq"]}"] .ev-node')).to_have_text("planner")
    page.get_by_role("button", name="by node run").click()
    expect(page.locator(".timeline li.noderun")).not_to_have_count(0)
    ui.assert_clean()


def test_resume_from_the_page_sends_a_new_budget(open_page: Callable[..., Page], server: Server, folder: Path) -> None:
    gate = folder / "resume-gate"
    run_id = api_run(server, {"flow": "held", "input": {"gate": str(gate)}}, wait=0)["runId"]
    wait_for(lambda: server.api("GET", f"/runs/{run_id}").json()["snapshot"]["nodeStatus"].get("hold") == "running",
             what="hold to run")
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".run-head .badge")).to_have_text("paused")
    gate.write_text("")
    page.get_by_label("Budget (USD)").fill("0")
    page.get_by_role("button", name="Resume").click()
    expect(page.locator(".actions .refusal")).to_contain_text("above 0")
    page.get_by_label("Budget (USD)").fill("2.5")
    page.get_by_label("Resume with a message").fill("with more money")
    page.get_by_role("button", name="Resume").click()
    expect(page.locator(".actions .outcome")).to_contain_text("resume accepted")
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    resumed = [e for e in events(server, run_id) if e["type"] == "flow:resumed"]
    assert [(e["message"], e["budgetUsd"]) for e in resumed] == [("with more money", 2.5)]
    ui.assert_clean()


# --- operations ----------------------------------------------------------------------------------


def test_the_workers_page_lists_the_servers_workers_and_the_queue_oldest_first(
        open_page: Callable[..., Page], server: Server, folder: Path) -> None:
    gate = folder / "queue-gate"
    runs = [api_run(server, {"flow": "held", "input": {"gate": str(gate)}}, wait=0)["runId"] for _ in range(3)]
    try:
        wait_for(lambda: server.api("GET", "/runs", params={"status": "queued", "flow": "held"}).json()["items"],
                 what="runs to wait in the queue")
        ui = open_page("#/workers")
        page = ui.page
        worker = page.locator("tr[data-worker]")
        expect(worker).to_have_count(1)
        expect(worker.locator("td").nth(2)).to_have_text(str(server.process.pid))
        expect(worker.locator("td.held a")).to_contain_text([runs[0]])
        queue = page.locator(".queue tbody tr[data-run]")
        expect(queue).to_have_count(2)  # the flow's maxConcurrentRuns holds the others back
        assert queue.evaluate_all("rows => rows.map(r => r.dataset.run)") == runs[1:]  # oldest first
        shot(ui, "workers-wide")
    finally:
        gate.write_text("")
    expect(page.locator(".queue tbody tr[data-run]")).to_have_count(0)  # the page follows the queue
    ui.assert_clean()


# --- run data is data ----------------------------------------------------------------------------


def test_html_and_script_in_run_data_never_run_or_load_anything(
        open_page: Callable[..., Page], server: Server, tmp_path: Path) -> None:
    planted = api_run(server, {"flow": FLOW_NAME, "input": {"who": SCRIPT}})
    assert planted["status"] == "waiting", planted
    agent_flow = tmp_path / "agent.json"
    agent_flow.write_text(json.dumps({"name": "markdown-agent", "nodes": [{"id": "writer", "type": "claude.agent",
                                      "input": {"prompt": f"Write it up. {SCRIPT}", "tools": ["lookup_fact"]}}],
                                      "edges": []}))
    model = ScriptedAgent([{"type": "text", "text": "Looking it up."},
                           {"type": "tool_use", "id": "toolu_1", "name": "lookup_fact", "input": {"topic": SCRIPT}}],
                          [{"type": "text", "text": AGENT_TEXT}])
    agent = Executor(server.db).run(agent_flow, services={"query_fn": model})

    def assert_inert(ui: Page) -> None:
        assert ui.page.evaluate("window.__pwned") is None
        assert ui.dialogs == [] and ui.blocked == [] and ui.unguarded == []
        assert ui.page.locator("img, iframe, form[action], script:not([src])").count() == 0
        assert ui.page.locator('[href^="javascript:"], [onerror], [onload], [onmouseover]').count() == 0

    ui = open_page("#/")
    page = ui.page
    expect(page.locator(f'tr[data-run="{planted["runId"]}"] td').nth(2)).to_have_text(FLOW_NAME)
    expect(page.locator(f'tr[data-run="{planted["runId"]}"] .badge')).to_have_text("waiting")
    assert_inert(ui)
    ui.goto(f"#/flows/{FLOW_NAME}")
    card = page.locator(".flow-card.selected")
    expect(card.locator("h2")).to_have_text(FLOW_NAME)
    expect(card.locator(".description")).to_contain_text("<script>")
    expect(card.locator("form.start-form textarea, form.start-form input").first).to_have_value(SCRIPT)
    assert_inert(ui)

    ui.goto(f"#/runs/{planted['runId']}")
    expect(page.locator(".card.waiting pre.prompt")).to_have_text(SCRIPT)
    expect(page.locator(f'svg.flow-graph g.node[data-node="{NODE_ID}"] .node-id')).to_have_text(NODE_ID[:18] + "…")
    page.locator(f'svg.flow-graph g.node[data-node="{NODE_ID}"]').click()
    expect(page.locator(".inspector")).to_contain_text(SCRIPT)
    expect(page.locator(".timeline")).to_contain_text(SCRIPT)  # the node's error, as text
    for tab in ("Snapshot", "Run"):
        page.get_by_role("tab", name=re.compile(f"^{tab}")).click()
        for summary in page.locator(f".panel-{'snapshot' if tab == 'Snapshot' else 'details'} summary").all():
            summary.click()
    page.get_by_role("tab", name="Timeline").click()
    page.get_by_role("button", name="in order").click()
    expect(page.locator(".timeline > li.ev").first).to_be_visible()
    assert_inert(ui)

    ui.goto(f"#/runs/{agent}")
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    text = page.locator('li.noderun[data-node="writer"] .markdown.agent-text').last
    expect(text.locator("h1")).to_have_text("Findings")
    expect(text.locator("li")).to_have_count(2)
    expect(text.locator("pre code")).to_contain_text("<script>window.__pwned='code'</script>")
    assert "mono" in text.locator("pre code").evaluate("e => getComputedStyle(e).fontFamily").lower()
    safe = text.get_by_role("link", name="safe link")
    expect(safe).to_have_attribute("rel", "noopener noreferrer nofollow")
    expect(safe).to_have_attribute("target", "_blank")
    expect(text).to_contain_text("[image: remote image]")
    tool = page.locator('li.noderun[data-node="writer"] details.tool')
    tool.locator("summary").click()
    expect(tool.locator(".tool-part").first).to_contain_text("<script>")
    page.get_by_role("tab", name="Agents").click()
    conversation = page.locator('details.agent-run[data-node="writer"]')
    conversation.locator("summary").first.click()
    expect(conversation.locator("li.message")).to_have_count(4)  # user, assistant, tool result, assistant
    expect(conversation.locator("li.message").first).to_contain_text("Write it up. <img")
    expect(conversation.locator(".markdown h1")).to_have_text("Findings")
    for summary in conversation.locator(".tool-calls summary").all():
        summary.click()
    expect(conversation.locator(".tool-calls")).to_contain_text("No fact is known about")
    assert_inert(ui)
    ui.assert_clean()


# --- how it looks --------------------------------------------------------------------------------


def test_every_page_holds_its_layout_wide_and_narrow(
        open_page: Callable[..., Page], server: Server, tmp_path: Path) -> None:
    """Screenshots of every page at both widths (test-artifacts/screenshots/); none scrolls sideways
    and each page's main controls are in view."""
    research = api_run(server, {"flow": "research", "input": {"question": "Which database should our desktop app use?"}})
    assert research["status"] == "waiting"
    waiting = api_run(server, {"flowDocument": APPROVAL})
    assert waiting["status"] == "waiting"
    failed = api_run(server, {"flow": "review-loop", "input": {"feature": "csv export"}})
    pages: list[tuple[str, str, Callable[[Any], Any]]] = [
        ("runs", "#/", lambda p: p.get_by_label("Error")),
        ("flows", "#/flows/hello", lambda p: p.get_by_role("button", name="Start run")),
        ("run-agents", f"#/runs/{research['runId']}", lambda p: p.get_by_role("button", name="Answer")),
        ("run-waiting", f"#/runs/{waiting['runId']}", lambda p: p.locator(".actions")),
        ("run-failed", f"#/runs/{failed['runId']}", lambda p: p.get_by_role("button", name="Retry failed nodes")),
        ("workers", "#/workers", lambda p: p.locator("tr[data-worker]")),
    ]
    for width_name, (width, height) in WIDTHS.items():
        ui = open_page("#/", width=width, height=height)
        for name, fragment, control in pages:
            ui.goto(fragment)  # a new address in the same page: the app draws that page
            expect(control(ui.page).first).to_be_visible()
            if name.startswith("run-"):
                expect(ui.page.locator("svg.flow-graph g.node").first).to_be_visible()
                expect(ui.page.locator(".timeline li.ev").first).to_be_visible()
            control(ui.page).first.scroll_into_view_if_needed()
            expect(control(ui.page).first).to_be_in_viewport()
            assert_fits(ui, f"{name} at {width}px")
            shot(ui, f"{name}-{width_name}")
        ui.assert_clean()
