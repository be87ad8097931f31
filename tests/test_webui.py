"""The web UI in a real headless Chromium against a real ``flowkernel serve`` (DESIGN §10, issue 16).

Runs are executed by threads of this process with their own kernels on the server's SQLite file:
to the server that is another process executing runs, as a worker is. Every test ends by checking
that the page requested nothing from any host but the server and logged no console error.
Screenshots go to ``test-artifacts/`` (git-ignored).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import flowkernel.examples.research_tools  # noqa: F401  (registers lookup_fact)
import pytest
from flowkernel.core.commands import Command
from flowkernel.fixtures import MockQuery
from flowkernel.run.kernel import Kernel
from flowkernel.store.open import open_store

import tests.plugins.extras  # registers fail_first_time
import tests.plugins.waiters  # noqa: F401  (registers await_message, block_first_run)
from tests.browser_support import (
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
QUESTION = "Which database should our desktop app use?"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # The system's Chromium, never one Playwright downloads; a fresh profile per launch.
        b = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = str(tmp_path_factory.mktemp("webui") / "runs.db")
    Kernel(open_store(db, create=True)).close()
    # Its own workers execute the runs made over the API (POST /runs), and the ones it resumes or
    # retries; the functions those flows call are registered by the same plugins as in this process.
    with serve(db, "--flows", str(FLOWS), "--workers", "2", "--grace-s", "1",
               "--plugin", "tests.plugins.waiters", "--plugin", "tests.plugins.extras") as s:
        yield s


@pytest.fixture
def executor(server: Server) -> Iterator[Executor]:
    ex = Executor(server.db)
    yield ex
    ex.join()


@pytest.fixture
def open_page(browser: Any, server: Server) -> Iterator[Callable[..., Watched]]:
    contexts: list[Any] = []

    def open_(fragment: str = "", *, width: int = 1280, height: int = 800, at: Server | None = None) -> Watched:
        context = browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        watched = watch(context.new_page(), (at or server).url)
        watched.goto(fragment)
        return watched

    yield open_
    for c in contexts:
        c.close()


def expect(locator: Any) -> Any:
    """Playwright's ``expect``: retried until true, up to a deadline generous enough for a busy machine."""
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=WAIT_MS)
    return playwright_expect(locator)


def write_flow(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / f"{document['name']}.json"
    path.write_text(json.dumps(document))
    return path


def snapshot(server: Server, run_id: str) -> dict[str, Any]:
    got = server.api("GET", f"/runs/{run_id}")
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


def events(server: Server, run_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = server.api("GET", f"/runs/{run_id}/events", params={"limit": 500}).json()["items"]
    return items


def create_run(server: Server, document: dict[str, Any], input: Any = None) -> str:
    """A run of ``document`` made over the API: queued, and executed by the server's workers."""
    created = server.api("POST", "/runs", json={"flowDocument": document, "input": input})
    assert created.status_code == 201, created.text
    run_id: str = created.json()["runId"]
    return run_id


def fails_once(tmp_path: Path) -> dict[str, Any]:
    """a -> b, where b fails the first time it runs (the run ends failed) and passes when run again."""
    return {"name": "flaky", "nodes": [
        {"id": "a", "type": "noop", "input": {"v": 1}},
        {"id": "b", "type": "python", "input": {"function": "fail_first_time",
                                                "args": {"marker": str(tmp_path / "failed-once")}}}],
        "edges": [{"from": "a", "to": "b"}]}


def research_fixtures() -> dict[str, Any]:
    return {"query_fn": MockQuery(FIXTURES / "research")}


def node(page: Any, node_id: str) -> Any:
    return page.locator(f'svg.flow-graph g.node[data-node="{node_id}"]')


def status_class(status: str) -> re.Pattern[str]:
    return re.compile(rf"\bst-{status}\b")


# --- the runs list ------------------------------------------------------------------------------


def test_the_runs_list_shows_status_flow_times_cost_and_parent_and_follows_new_runs(
        open_page: Callable[..., Watched], server: Server, executor: Executor) -> None:
    hello = executor.run(FLOWS / "hello.json", {"name": "Ada"})
    research = executor.run(FLOWS / "research.json", {"question": QUESTION}, services=research_fixtures())
    parent = executor.run(FLOWS / "subflow.json", {"topic": "durable workflows"},
                          services={"query_fn": MockQuery(FIXTURES / "subflow")})
    child = snapshot(server, parent)["children"][0]["runId"]

    ui = open_page("#/")
    page = ui.page
    row = page.locator(f'tr[data-run="{hello}"]')
    expect(row.locator(".badge")).to_have_text("completed")
    expect(row.locator(".badge")).to_have_class(status_class("done"))
    expect(row).to_contain_text("hello")
    summary = snapshot(server, hello)["run"]
    expect(row.locator("td").nth(3)).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"))
    expect(row.locator("td").nth(4)).to_have_text(re.compile(r"^\d+(\.\d+)? m?s$"))
    assert summary["durationMs"] is not None
    waiting = page.locator(f'tr[data-run="{research}"]')
    expect(waiting.locator(".badge")).to_have_text("waiting")
    research_cost = snapshot(server, research)["run"]["totalCostUsd"]
    assert research_cost > 0
    expect(waiting.locator("td").nth(5)).to_have_text(f"${research_cost:.4f}")
    expect(page.locator(f'tr[data-run="{child}"] td').nth(6)).to_have_text(parent)
    page.locator(f'tr[data-run="{child}"] td').nth(6).locator("a").click()
    expect(page).to_have_url(re.compile(rf"#/runs/{parent}$"))
    page.go_back()

    # Live: a run created after the page was loaded shows up without a reload.
    page.evaluate("window.__same_page = true")
    later = executor.run(FLOWS / "hello.json", {"name": "Grace"})
    expect(page.locator(f'tr[data-run="{later}"] .badge')).to_have_text("completed")
    assert page.evaluate("window.__same_page") is True
    ui.screenshot("runs-list")

    # Filters: by status, then by flow; both are kept in the address.
    page.select_option("select[name=status]", "waiting")
    expect(page).to_have_url(re.compile(r"status=waiting"))
    expect(page.locator(f'tr[data-run="{hello}"]')).to_have_count(0)
    expect(page.locator(f'tr[data-run="{research}"]')).to_have_count(1)
    expect(page.locator("tbody tr[data-status]:not([data-status=waiting])")).to_have_count(0)
    page.select_option("select[name=status]", "")
    page.select_option("select[name=flow]", "hello")
    expect(page.locator(f'tr[data-run="{research}"]')).to_have_count(0)
    expect(page.locator(f'tr[data-run="{hello}"]')).to_have_count(1)
    expect(page.locator(f'tr[data-run="{later}"]')).to_have_count(1)

    # Pages: one run a page here, newest first, through the API's cursors.
    ui.goto("#/?flow=hello&limit=1")
    expect(page.locator("tbody tr[data-run]")).to_have_count(1)
    expect(page.locator(f'tr[data-run="{later}"]')).to_have_count(1)
    page.get_by_role("button", name="Older →").click()
    expect(page.locator(f'tr[data-run="{hello}"]')).to_have_count(1)
    expect(page.locator("tbody tr[data-run]")).to_have_count(1)
    page.get_by_role("button", name="← Newer").click()
    expect(page.locator(f'tr[data-run="{later}"]')).to_have_count(1)
    ui.assert_clean()


# --- the run page -------------------------------------------------------------------------------


LIVE_FLOW = {"name": "live", "description": "waits for a message, then finishes", "nodes": [
    {"id": "prepare", "type": "transform", "input": {"expr": "'ready'"}},
    {"id": "wait", "type": "python", "input": {"function": "await_message"}},
    {"id": "finish", "type": "transform", "input": {"expr": "{'got': wait}"}}],
    "edges": [{"from": "prepare", "to": "wait"}, {"from": "wait", "to": "finish"}]}


def test_a_run_page_shows_every_node_with_its_status_and_the_timeline_fills_in_live(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    run_id = executor.start(write_flow(tmp_path, LIVE_FLOW))
    wait_for(lambda: snapshot(server, run_id)["snapshot"]["nodeStatus"].get("wait") == "running", what="wait to run")

    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(page.locator("svg.flow-graph g.node")).to_have_count(3)
    expect(node(page, "prepare")).to_have_class(status_class("done"))
    expect(node(page, "wait")).to_have_class(status_class("running"))
    expect(node(page, "finish")).to_have_class(status_class("pending"))
    expect(page.locator('g.edge[data-edge="prepare->wait"]')).to_have_class(re.compile(r"\bes-fired\b"))
    expect(page.locator(".run-head .badge")).to_have_text("running")
    group = page.locator('li.noderun[data-node="wait"]')
    expect(group).to_have_attribute("data-status", "running")
    expect(page.locator(".stream-state")).to_have_text("● live")
    page.evaluate("window.__same_page = true")

    # A message sent from the page reaches the node run; the rest of the run arrives over the stream.
    form = page.locator("form.send-form")
    form.get_by_label("To node run").select_option(label="wait (running)")
    form.get_by_label("Message").fill("hello from the page")
    form.get_by_role("button", name="Send").click()
    expect(page.locator(".actions .outcome")).to_contain_text("send accepted")
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    expect(group).to_have_attribute("data-status", "done")
    expect(page.locator('li.noderun[data-node="finish"]')).to_have_attribute("data-status", "done")
    expect(page.locator(".timeline > li.ev .ev-type").last).to_have_text("flow:complete")
    expect(node(page, "finish")).to_have_class(status_class("done"))
    expect(page.locator('g.edge[data-edge="wait->finish"]')).to_have_class(re.compile(r"\bes-fired\b"))
    assert page.evaluate("window.__same_page") is True  # all of it live, no reload
    seqs = [int(s) for s in page.locator(".timeline li.ev[data-seq]").evaluate_all("els => els.map(e => e.dataset.seq)")]
    assert sorted(seqs) == list(range(1, len(events(server, run_id)) + 1))  # every event, once
    assert snapshot(server, run_id)["snapshot"]["outputs"]["finish"] == {"got": ["hello from the page"]}
    ui.screenshot("run-page")
    ui.assert_clean()


HUMAN_FLOW = {"name": "release", "nodes": [
    {"id": "review", "type": "human.input", "input": {"prompt": "Approve the release?", "schema": {
        "type": "object", "required": ["approved", "comment", "risk"],
        "properties": {"approved": {"type": "boolean", "title": "Approved"},
                       "comment": {"type": "string", "minLength": 3, "description": "what the team should know"},
                       "risk": {"enum": ["low", "high"]},
                       "reviewers": {"type": "integer", "minimum": 1}}}}},
    {"id": "publish", "type": "transform", "input": {"expr": "review"}}],
    "edges": [{"from": "review", "to": "publish"}]}


def test_a_waiting_human_nodes_form_is_built_from_its_schema_validated_and_completes_the_run(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    run_id = executor.run(write_flow(tmp_path, HUMAN_FLOW))
    assert snapshot(server, run_id)["run"]["status"] == "waiting"
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    card = page.locator('.card.waiting[data-node="review"]')
    expect(card.locator("pre.prompt")).to_have_text("Approve the release?")
    expect(node(page, "review")).to_have_class(status_class("waiting"))

    # Checked in the page before anything is sent: the problem is shown at its field.
    card.get_by_label("comment").fill("ok")
    card.get_by_label("reviewers").fill("0")
    card.get_by_role("button", name="Send reply").click()
    expect(card.locator(".field-error").filter(has_text="comment must be at least 3 characters")).to_be_visible()
    expect(card.locator(".field-error").filter(has_text="reviewers must be at least 1")).to_be_visible()
    expect(card.get_by_label("comment")).to_have_attribute("aria-invalid", "true")
    before = len(events(server, run_id))
    card.get_by_label("comment").fill("Ship it")
    card.get_by_label("reviewers").fill("2")
    card.get_by_label("Approved").check()
    card.get_by_label("risk").select_option(label="low")
    assert len(events(server, run_id)) == before  # nothing was sent while the form was invalid
    card.get_by_role("button", name="Send reply").click()
    expect(page.locator(".actions .outcome")).to_contain_text("reply accepted")

    executor.continue_run(run_id)  # what a worker does with a run whose wait was answered
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    expect(node(page, "publish")).to_have_class(status_class("done"))
    expect(page.locator(".actions")).to_contain_text("The run is completed: no command applies.")
    answer = {"approved": True, "comment": "Ship it", "risk": "low", "reviewers": 2}
    assert snapshot(server, run_id)["snapshot"]["outputs"]["publish"] == answer
    ui.assert_clean()


def test_an_agent_run_from_fixtures_shows_its_conversation_tool_calls_and_answers_ask_human(
        open_page: Callable[..., Watched], server: Server, executor: Executor) -> None:
    run_id = executor.run(FLOWS / "research.json", {"question": QUESTION}, services=research_fixtures())
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page

    # The timeline nests the agent's text and tool calls under its node run.
    group = page.locator('li.noderun[data-node="researcher"]')
    expect(group.locator("pre.agent-text").first).to_have_text("Let me look up the candidates.")
    tools = group.locator("details.tool")
    expect(tools).to_have_count(2)
    # The two calls of one model turn run concurrently and may finish in either order.
    sqlite = tools.filter(has_text='"topic": "sqlite"')
    expect(sqlite).to_have_count(1)
    expect(sqlite.locator(".tool-name")).to_have_text("lookup_fact")
    sqlite.locator("summary").click()
    expect(sqlite.locator(".tool-part").first).to_contain_text('"topic": "sqlite"')
    stored = server.api("GET", f"/runs/{run_id}/tool-calls").json()["items"]
    output = next(c["output"] for c in stored if c["input"] == {"topic": "sqlite"})
    expect(sqlite.locator(".tool-part").nth(1)).to_contain_text(str(output)[:40])
    expect(sqlite.locator("summary")).to_contain_text(re.compile(r"\d+ ms"))

    # The agent's conversation: every stored message and tool call.
    page.get_by_role("tab", name="Agents").click()
    agent = page.locator('details.agent-run[data-node="researcher"]').first
    agent.locator("summary").first.click()
    messages = agent.locator("li.message")
    stored_messages = server.api("GET", f"/runs/{run_id}/messages").json()["items"]
    expect(messages).to_have_count(len(stored_messages))
    expect(messages.first.locator(".role")).to_have_text("system")
    expect(messages.nth(1)).to_contain_text(QUESTION)
    expect(agent.locator(".block-tool-use").first).to_contain_text("lookup_fact")
    expect(agent.locator(".tool-calls tbody tr")).to_have_count(2)
    # The stored JSON of a message comes from the API when asked for.
    agent.locator("li.message details.raw > summary").first.click()
    expect(agent.locator("li.message details.raw").first).to_contain_text('"role": "system"')

    # Answering the agent's ask_human from the page.
    page.get_by_role("tab", name="Timeline").click()
    card = page.locator('.card.waiting[data-node="researcher"]')
    expect(card).to_contain_text("The agent asks (ask_human)")
    card.get_by_label("Your answer").fill("Mostly record transactions.")
    card.get_by_role("button", name="Answer").click()
    expect(page.locator(".actions .outcome")).to_contain_text("reply accepted")
    executor.continue_run(run_id, services=research_fixtures())
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    # The answer resumed the agent in a new node run, which carries on the same conversation.
    page.get_by_role("tab", name="Agents").click()
    runs = page.locator('details.agent-run[data-node="researcher"]')
    expect(runs).to_have_count(2)
    resumed = next(a for a in server.api("GET", "/agent-runs", params={"runId": run_id}).json()["items"]
                   if a["resumedFrom"])
    expect(runs.last).to_have_attribute("data-agent-run", resumed["agentRunId"])
    expect(runs.last.locator(".continues")).to_contain_text(resumed["resumedFrom"])
    runs.last.locator("summary").first.click()
    expect(runs.last.locator(".tool-calls tbody tr")).to_have_count(1)
    expect(runs.last.locator(".tool-calls tbody tr")).to_contain_text("ask_human")
    expect(runs.last.locator("li.message").last).to_contain_text("Use SQLite")
    expect(page.locator(".run-meta .total-cost")).to_have_text(
        f"${snapshot(server, run_id)['run']['totalCostUsd']:.4f}")
    ui.screenshot("agent-conversation")
    ui.assert_clean()


def test_a_run_continued_on_an_updated_flow_is_drawn_with_the_flow_it_followed_at_each_event(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    flaky = fails_once(tmp_path)
    run_id = executor.run(write_flow(tmp_path, flaky))
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(node(page, "b")).to_have_class(status_class("failed"))
    expect(node(page, "c")).to_have_count(0)

    # `flowkernel retry RUN --flow FILE` elsewhere: the new flow adds c after b
    extended = {**flaky, "nodes": [*flaky["nodes"], {"id": "c", "type": "noop", "input": {"v": 3}}],
                "edges": [*flaky["edges"], {"from": "b", "to": "c"}]}
    updated = tmp_path / "flaky-2.json"
    updated.write_text(json.dumps(extended))
    executor.retry(run_id, flow=updated)
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    expect(node(page, "c")).to_have_class(status_class("done"))  # drawn live, with the flow it follows now

    # before the update, the run followed the first flow: c is not drawn there; after it, it is
    update_seq = next(e["seq"] for e in events(server, run_id) if e["type"] == "flow:updated")
    ui.goto(f"#/runs/{run_id}?at={update_seq - 1}")
    expect(node(page, "b")).to_have_class(status_class("failed"))
    expect(node(page, "c")).to_have_count(0)
    ui.goto(f"#/runs/{run_id}?at={update_seq}")
    expect(node(page, "c")).to_have_class(status_class("pending"))
    page.get_by_role("button", name="Back to live").click()
    expect(node(page, "c")).to_have_class(status_class("done"))
    # a page opened on an event before the update asks the server for the flow followed then
    ui.goto(f"#/runs/{run_id}?at={update_seq - 1}")
    page.reload()
    expect(node(page, "b")).to_have_class(status_class("failed"))
    expect(node(page, "c")).to_have_count(0)
    ui.assert_clean()


def test_the_snapshot_after_any_event_by_a_click_on_it_or_the_slider(
        open_page: Callable[..., Watched], server: Server, executor: Executor) -> None:
    run_id = executor.run(FLOWS / "hello.json", {"name": "Ada"})
    greet_start = next(e["seq"] for e in events(server, run_id) if e["type"] == "node:start" and e["nodeId"] == "greet")
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(node(page, "finish")).to_have_class(status_class("done"))

    page.locator(f'li[data-seq="{greet_start}"] button.seq').first.click()
    expect(page).to_have_url(re.compile(rf"\?at={greet_start}$"))
    expect(node(page, "greet")).to_have_class(status_class("running"))
    expect(node(page, "join")).to_have_class(status_class("pending"))
    expect(page.locator(".travel-note")).to_contain_text(f"event #{greet_start} (node:start)")
    expect(page.locator(f'li[data-seq="{greet_start + 1}"]').first).to_have_class(re.compile(r"\bfuture\b"))
    page.get_by_role("tab", name="Snapshot").click()
    expect(page.locator(".snapshot-panel h3")).to_have_text(f"Snapshot after event #{greet_start}")

    # The slider, by keyboard: Home goes to the first event, where nothing has run yet.
    page.get_by_label("Snapshot after event").focus()
    page.keyboard.press("Home")
    expect(page).to_have_url(re.compile(r"\?at=1$"))
    expect(node(page, "greet")).to_have_class(status_class("pending"))
    # An address with ?at=SEQ opens there.
    ui.goto(f"#/runs/{run_id}?at={greet_start}")
    page.reload()
    expect(node(page, "greet")).to_have_class(status_class("running"))
    page.get_by_role("button", name="Back to live").click()
    expect(page).to_have_url(re.compile(rf"#/runs/{run_id}$"))
    expect(node(page, "greet")).to_have_class(status_class("done"))
    expect(page.locator(".travel-note")).to_be_hidden()
    ui.assert_clean()


def test_loops_foreach_progress_and_skipped_edges_are_drawn(
        open_page: Callable[..., Watched], server: Server, executor: Executor) -> None:
    run_id = executor.run(FLOWS / "hello.json", {"name": "Ada"})
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(node(page, "long")).to_have_class(status_class("skipped"))
    expect(page.locator('g.edge[data-edge="greet->long"]')).to_have_class(re.compile(r"\bes-skipped\b"))
    loop = snapshot(server, run_id)["snapshot"]["loopCounters"]["review->draft"]
    expect(page.locator('g.edge[data-edge="review->draft"] .edge-label')).to_have_text(f"↻ {loop}/5")
    expect(node(page, "shout").locator(".node-badge")).to_have_text("3/3")
    node(page, "shout").click()
    expect(page.locator(".inspector")).to_contain_text("3 of 3 done")
    ui.assert_clean()


# --- actions ------------------------------------------------------------------------------------


def test_a_refused_command_shows_the_apis_reason_and_abort_takes_a_reason(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    # dependentRequired is checked by the server, not by the page: the refusal comes from the API.
    flow = {"name": "strict", "nodes": [{"id": "q", "type": "human.input", "input": {"prompt": "Name and surname?",
            "schema": {"type": "object", "properties": {"name": {"type": "string"}, "surname": {"type": "string"}},
                       "dependentRequired": {"name": ["surname"]}}}}], "edges": []}
    run_id = executor.run(write_flow(tmp_path, flow))
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    card = page.locator('.card.waiting[data-node="q"]')
    card.get_by_label("name", exact=True).fill("Ada")
    card.get_by_role("button", name="Send reply").click()
    alert = page.locator(".actions .refusal")
    expect(alert).to_be_visible()
    refused = [e for e in events(server, run_id) if e["type"] == "command:received" and not e["accepted"]]
    assert len(refused) == 1
    expect(alert).to_contain_text(f"reply refused (422): {refused[0]['reason']}")

    page.get_by_label("Abort with a reason").fill("no longer needed")
    page.get_by_role("button", name="Abort run").click()
    expect(page.locator(".run-head .badge")).to_have_text("aborted")
    expect(page.locator(".run-error")).to_contain_text("no longer needed")
    expect(page.locator(".actions")).to_contain_text("The run is aborted: no command applies.")
    ui.assert_clean(allowed=("status of 422",))


def test_pause_from_the_page_pauses_a_running_run(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    flow = {"name": "blocked", "nodes": [{"id": "work", "type": "python", "input": {"function": "block_first_run"}}],
            "edges": []}
    run_id = executor.start(write_flow(tmp_path, flow))
    wait_for(lambda: snapshot(server, run_id)["snapshot"]["nodeStatus"].get("work") == "running", what="work to run")
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(page.get_by_role("button", name="Pause")).to_be_visible()
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".run-head .badge")).to_have_text("paused")
    expect(page.locator('li.noderun[data-node="work"]')).to_have_attribute("data-status", "interrupted")
    expect(page.get_by_label("Resume with a message")).to_be_visible()
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)
    ui.assert_clean()


# --- the page itself ------------------------------------------------------------------------------


def test_a_token_is_asked_for_once_and_kept_for_the_session(browser: Any, tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    Kernel(open_store(db, create=True)).close()
    run_id = Executor(db).run(FLOWS / "hello.json", {"name": "Ada"})
    with serve(db, token="s3cret-token") as guarded:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        try:
            ui = watch(context.new_page(), guarded.url)
            ui.goto("#/")
            page = ui.page
            dialog = page.locator("#token-dialog")
            expect(dialog).to_be_visible()
            page.get_by_label("API token").fill("wrong")
            page.get_by_role("button", name="Use token").click()
            expect(dialog).to_contain_text("That token was refused")
            page.get_by_label("API token").fill("s3cret-token")
            page.get_by_role("button", name="Use token").click()
            expect(page.locator(f'tr[data-run="{run_id}"]')).to_have_count(1)
            page.locator(f'tr[data-run="{run_id}"] a').first.click()
            expect(node(page, "finish")).to_have_class(status_class("done"))
            page.reload()
            expect(node(page, "finish")).to_have_class(status_class("done"))
            expect(dialog).to_be_hidden()  # asked once: the session keeps it
            ui.assert_clean(allowed=("status of 401",))
            fresh = watch(context.new_page(), guarded.url)  # another tab of the session: sessionStorage is per tab
            fresh.goto("#/")
            expect(fresh.page.locator("#token-dialog")).to_be_visible()
        finally:
            context.close()


def test_keyboard_reaches_the_graph_and_the_actions_and_a_narrow_window_has_no_sideways_scroll(
        open_page: Callable[..., Watched], server: Server, executor: Executor) -> None:
    run_id = executor.run(FLOWS / "research.json", {"question": QUESTION}, services=research_fixtures())
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(node(page, "researcher")).to_have_class(status_class("waiting"))
    expect(page.locator('li.noderun[data-node="researcher"] details.tool')).to_have_count(2)
    ui.screenshot("run-page-agent")
    reached: list[str] = []
    for _ in range(80):
        page.keyboard.press("Tab")
        reached.append(page.evaluate(
            "() => { const e = document.activeElement; return e.dataset.node ? 'node:' + e.dataset.node"
            " : (e.textContent || e.getAttribute('aria-label') || e.tagName).trim().slice(0, 40); }"))
        if "Answer" in reached and "node:report" in reached:
            break
    assert "node:researcher" in reached and "Answer" in reached, reached
    node(page, "report").focus()
    page.keyboard.press("Enter")
    expect(page.locator(".inspector h3")).to_have_text("report")

    narrow = open_page(f"#/runs/{run_id}", width=420, height=800)
    expect(node(narrow.page, "researcher")).to_have_class(status_class("waiting"))
    overflow = narrow.page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at 420px"
    narrow.screenshot("run-page-narrow", full_page=True)
    listing = open_page("#/", width=420, height=800)
    expect(listing.page.locator(f'tr[data-run="{run_id}"]')).to_have_count(1)
    overflow = listing.page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the runs list scrolls sideways by {overflow}px at 420px"
    for watched in (ui, narrow, listing):
        watched.assert_clean()


def test_a_failed_run_shows_its_errors_with_their_details_and_offers_retry(
        open_page: Callable[..., Watched], server: Server, executor: Executor) -> None:
    # The recorded planner call asked for "CSV export": another feature makes the fixture refuse it.
    run_id = executor.run(FLOWS / "review-loop.json", {"feature": "csv export"},
                          services={"query_fn": MockQuery(FIXTURES / "review-loop")})
    detail = snapshot(server, run_id)
    assert detail["run"]["status"] == "failed"
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(page.locator(".run-head .badge")).to_have_text("failed")
    expect(page.locator(".run-error")).to_contain_text(detail["run"]["error"][:60])
    expect(node(page, "planner")).to_have_class(status_class("failed"))
    expect(node(page, "coder")).to_have_class(status_class("pending"))
    failure = next(e for e in events(server, run_id) if e["type"] == "node:error")
    row = page.locator(f'li.ev[data-seq="{failure["seq"]}"]')
    expect(row).to_contain_text(failure["errorType"])
    # The run's error is the node's: the banner says it, the node's event points to it.
    expect(row).to_contain_text("the run's error, shown above")
    expect(page.locator(".run-error")).to_contain_text("differs from the recording")
    page.get_by_role("tab", name=re.compile("^Run")).click()
    expect(page.locator(".errors")).to_contain_text("differs from the recording")
    node(page, "planner").click()
    expect(page.locator(".inspector .fault")).to_contain_text(failure["errorType"])
    expect(page.get_by_role("button", name="Retry failed nodes")).to_be_visible()
    expect(page.get_by_label("Resume with a message")).to_be_visible()
    ui.assert_clean()


def test_resume_and_retry_of_a_run_a_cli_process_started_are_disabled_saying_how_to_continue_it(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    """The API cannot hand such a run to its workers (409 not-pooled): the page says so before a click."""
    def flaky(marker: str) -> dict[str, Any]:
        return {"name": "flaky", "nodes": [{"id": "b", "type": "python", "input": {
            "function": "fail_first_time", "args": {"marker": str(tmp_path / marker)}}}], "edges": []}

    run_id = executor.run(write_flow(tmp_path, flaky("failed-once")))  # as `flowkernel run` would: not the pool's
    assert snapshot(server, run_id)["run"]["pooled"] is False
    assert server.api("POST", f"/runs/{run_id}/retry", json={}).status_code == 409
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(page.locator(".run-head .badge")).to_have_text("failed")
    retry = page.get_by_role("button", name="Retry failed nodes")
    expect(retry).to_be_disabled()
    expect(retry).to_have_attribute("title", re.compile(rf"flowkernel run process.*flowkernel retry {run_id}"))
    resume = page.get_by_role("button", name="Resume", exact=True)
    expect(resume).to_be_disabled()
    expect(resume).to_have_attribute("title", re.compile(rf"flowkernel resume {run_id}"))
    expect(page.get_by_label("Resume with a message")).to_be_disabled()
    note = page.locator(".actions .not-pooled-note")
    expect(note).to_contain_text(f"flowkernel retry {run_id}")
    expect(note).to_contain_text(f"flowkernel resume {run_id}")
    expect(retry).to_have_attribute("aria-describedby", note.get_attribute("id") or "missing")
    # A run the pool executes keeps them enabled (retrying it from the page is the next test's).
    pooled = create_run(server, flaky("pooled-failed-once"))
    wait_for(lambda: snapshot(server, pooled)["run"]["status"] == "failed", what="the pooled run to fail")
    assert snapshot(server, pooled)["run"]["pooled"] is True
    ui.goto(f"#/runs/{pooled}")
    expect(page.locator(".run-head .badge")).to_have_text("failed")
    expect(page.get_by_role("button", name="Retry failed nodes")).to_be_enabled()
    expect(page.get_by_role("button", name="Resume", exact=True)).to_be_enabled()
    expect(page.locator(".actions .not-pooled-note")).to_have_count(0)
    ui.assert_clean()


def test_the_runs_list_shows_a_run_created_over_the_api(
        open_page: Callable[..., Watched], server: Server) -> None:
    ui = open_page("#/")
    created = server.api("POST", "/runs", json={"flow": "hello", "input": {"name": "Ada"}})
    assert created.status_code == 201, created.text
    run_id = created.json()["runId"]
    row = ui.page.locator(f'tr[data-run="{run_id}"]')
    expect(row).to_contain_text("hello")
    expect(row.locator(".badge")).to_have_text(re.compile(r"^(queued|running|completed)$"))
    expect(row.locator(".badge")).to_have_text("completed")  # a worker of the server ran it; the list follows
    ui.assert_clean()


def test_resume_with_a_message_from_the_page(open_page: Callable[..., Watched], server: Server) -> None:
    flow = {"name": "resumable", "nodes": [{"id": "work", "type": "python", "input": {"function": "block_first_run"}}],
            "edges": []}
    run_id = create_run(server, flow)
    wait_for(lambda: snapshot(server, run_id)["snapshot"]["nodeStatus"].get("work") == "running", what="work to run")
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".run-head .badge")).to_have_text("paused")
    page.get_by_label("Resume with a message").fill("carry on, please")
    page.get_by_role("button", name="Resume").click()
    expect(page.locator(".actions .outcome")).to_contain_text("resume accepted")
    resumed = page.locator(".timeline li.ev").filter(has_text="resumed: carry on, please")
    expect(resumed).to_have_count(1)
    # A worker of the server continues the run: the node run it starts gets the message.
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    output = snapshot(server, run_id)["snapshot"]["outputs"]["work"]
    assert output["inbox"] == ["carry on, please"] and output["resumedFrom"]
    ui.assert_clean()


def test_retry_from_the_page_reruns_the_failed_node(
        open_page: Callable[..., Watched], server: Server, tmp_path: Path) -> None:
    flow = fails_once(tmp_path)
    run_id = create_run(server, flow)
    wait_for(lambda: snapshot(server, run_id)["run"]["status"] == "failed", what="the run to fail")
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(node(page, "b")).to_have_class(status_class("failed"))
    page.get_by_role("button", name="Retry failed nodes").click()
    expect(page.locator(".actions .outcome")).to_contain_text("retry accepted")
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    expect(node(page, "b")).to_have_class(status_class("done"))
    retried = [e for e in events(server, run_id) if e["type"] == "flow:resumed"]
    assert len(retried) == 1
    expect(page.locator(f'.timeline li.ev[data-seq="{retried[0]["seq"]}"]')).to_contain_text("retried")
    ui.assert_clean()


def test_a_failed_run_retried_elsewhere_goes_on_live_on_its_open_page(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    flow = fails_once(tmp_path)
    run_id = executor.run(write_flow(tmp_path, flow))
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(page.locator(".run-head .badge")).to_have_text("failed")
    expect(page.locator(".stream-state")).to_have_text("finished")
    page.evaluate("window.__same_page = true")

    executor.retry(run_id)  # from a terminal: `flowkernel retry RUN`
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    expect(node(page, "b")).to_have_class(status_class("done"))
    expect(page.locator(".stream-state")).to_have_text("finished")
    retried = next(e for e in events(server, run_id) if e["type"] == "flow:resumed")
    expect(page.locator(f'.timeline li.ev[data-seq="{retried["seq"]}"]')).to_contain_text("retried")
    assert page.evaluate("window.__same_page") is True
    seqs = [int(s) for s in page.locator(".timeline li.ev[data-seq]").evaluate_all("els => els.map(e => e.dataset.seq)")]
    assert sorted(seqs) == list(range(1, len(events(server, run_id)) + 1))  # every event, once
    ui.assert_clean()


class SlowAgent:
    """A query function (the model-call seam) that streams thinking and text, then holds the call
    open until the test lets it finish: what a slow model looks like from the page."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    async def __call__(self, request: dict[str, Any], emit: Callable[[Any], None], ctx: Any) -> dict[str, Any]:
        from flowkernel.core.events import AgentTextDelta, AgentThinkingDelta

        emit(AgentThinkingDelta(content="Weighing embedded "))
        emit(AgentThinkingDelta(content="databases."))
        emit(AgentTextDelta(content="SQLite, "))
        while not self.gate.is_set():
            await anyio.sleep(0.02)
        emit(AgentTextDelta(content="because one file holds it all."))
        return {"content": [{"type": "thinking", "thinking": "Weighing embedded databases.", "signature": "sig"},
                            {"type": "text", "text": "SQLite, because one file holds it all."}],
                "stopReason": "end_turn", "model": request["model"], "id": "msg_slow",
                "usage": {"inputTokens": 12, "outputTokens": 9, "cacheCreationInputTokens": 0,
                          "cacheReadInputTokens": 0}}


def test_agent_thinking_and_text_stream_into_the_timeline_while_the_call_runs(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    flow = {"name": "slow-agent", "nodes": [{"id": "advisor", "type": "claude.agent",
                                             "input": {"prompt": "Which database?"}}], "edges": []}
    agent = SlowAgent()
    run_id = executor.start(write_flow(tmp_path, flow), services={"query_fn": agent})
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    group = page.locator('li.noderun[data-node="advisor"]')
    expect(group.locator("pre.agent-thinking")).to_have_text("Weighing embedded databases.")
    expect(group.locator("li.streaming pre.agent-text")).to_have_text("SQLite, ")  # mid-call, still streaming
    agent.gate.set()
    expect(group.locator("pre.agent-text")).to_have_text("SQLite, because one file holds it all.")
    expect(group.locator("li.streaming")).to_have_count(0)
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    ui.assert_clean()


class ScriptedModel:
    """A query function (the model-call seam) that answers each call with the next scripted message."""

    def __init__(self, *replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)

    async def __call__(self, request: dict[str, Any], emit: Callable[[Any], None], ctx: Any) -> dict[str, Any]:
        content = self.replies.pop(0)
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        return {"content": content, "stopReason": stop, "model": request["model"], "id": f"msg_{len(self.replies)}",
                "usage": {"inputTokens": 20, "outputTokens": 5, "cacheCreationInputTokens": 0,
                          "cacheReadInputTokens": 0}}


def test_a_failing_tool_call_shows_its_error_in_the_timeline_and_the_conversation(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    flow = {"name": "tool-fault", "nodes": [{"id": "fixer", "type": "claude.agent",
                                             "input": {"prompt": "Clean up the disk."}}], "edges": []}
    model = ScriptedModel(
        [{"type": "text", "text": "Deleting."},
         {"type": "tool_use", "id": "toolu_gone", "name": "delete_everything", "input": {"path": "/"}}],
        [{"type": "text", "text": "That tool is not available; nothing was deleted."}])
    run_id = executor.run(write_flow(tmp_path, flow), services={"query_fn": model})
    stored = server.api("GET", f"/runs/{run_id}/tool-calls").json()["items"]
    assert [c["status"] for c in stored] == ["error"]
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(page.locator(".run-head .badge")).to_have_text("completed")

    group = page.locator('li.noderun[data-node="fixer"]')
    tool = group.locator("details.tool")
    expect(tool).to_have_count(1)
    expect(tool).to_have_class(re.compile(r"\bfailed\b"))
    expect(tool.locator("summary .badge")).to_have_text("error")
    tool.locator("summary").click()
    expect(tool.locator(".error-text")).to_contain_text("no tool named 'delete_everything'")
    expect(tool.locator(".tool-part").first).to_contain_text('"path": "/"')
    expect(group.locator("li.ev").filter(has_text="error_tool_use")).to_have_count(1)

    page.get_by_role("tab", name="Agents").click()
    agent = page.locator('details.agent-run[data-node="fixer"]')
    agent.locator("summary").first.click()
    row = agent.locator(".tool-calls tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_have_class(re.compile(r"\bfailed\b"))
    expect(row.locator(".badge")).to_have_text("error")
    expect(agent.locator("li.message").last).to_contain_text("nothing was deleted")
    ui.assert_clean()


def test_a_run_page_links_its_child_runs_and_shows_usage_with_the_childrens_included(
        open_page: Callable[..., Watched], server: Server, executor: Executor) -> None:
    parent = executor.run(FLOWS / "subflow.json", {"topic": "durable workflows"},
                          services={"query_fn": MockQuery(FIXTURES / "subflow")})
    detail = snapshot(server, parent)
    child = detail["children"][0]
    usage = detail["run"]["usage"]
    assert usage["inputTokens"] > snapshot(server, child["runId"])["run"]["usage"]["inputTokens"] > 0
    ui = open_page(f"#/runs/{parent}")
    page = ui.page
    expect(page.locator(".run-head .badge")).to_have_text("completed")
    expect(page.locator(".run-meta")).to_contain_text(f"{usage['outputTokens']} out")
    page.get_by_role("tab", name=re.compile("^Run")).click()
    facts = page.locator(".facts")
    expect(facts).to_contain_text(f"input tokens{usage['inputTokens']}")
    expect(facts).to_contain_text(f"output tokens{usage['outputTokens']}")
    children = page.locator("table.children tbody tr")
    expect(children).to_have_count(1)
    expect(children).to_contain_text(child["flowName"])
    children.locator(f'a[href="#/runs/{child["runId"]}"]').click()

    # The child's own page: its graph, and the way back to its parent.
    expect(page).to_have_url(re.compile(rf"#/runs/{child['runId']}$"))
    expect(page.locator("svg.flow-graph g.node")).to_have_count(len(
        json.loads((FLOWS / "subflow-writer.json").read_text())["nodes"]))
    page.locator(".run-meta").get_by_role("link", name=parent).click()
    expect(page).to_have_url(re.compile(rf"#/runs/{parent}$"))
    ui.assert_clean()


def test_the_timeline_reconnects_after_the_server_restarts_and_misses_or_repeats_no_event(
        browser: Any, tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    Kernel(open_store(db, create=True)).close()
    executor = Executor(db)
    run_id = executor.start(write_flow(tmp_path, LIVE_FLOW))
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        with serve(db) as first:
            wait_for(lambda: snapshot(first, run_id)["snapshot"]["nodeStatus"].get("wait") == "running",
                     what="wait to run")
            ui = watch(context.new_page(), first.url)
            ui.goto(f"#/runs/{run_id}")
            page = ui.page
            expect(page.locator(".stream-state")).to_have_text("● live")
            expect(page.locator('li.noderun[data-node="wait"]')).to_have_attribute("data-status", "running")
            port = int(first.url.rsplit(":", 1)[1])
        expect(page.locator(".stream-state")).to_have_text("reconnecting…")

        # While no server answers, the run goes on to its end: the page must get all of it later.
        # (In a thread of its own: Playwright's sync API holds this thread's event loop.)
        def send() -> None:
            kernel = Kernel(open_store(db))
            try:
                target = kernel.snapshot(run_id).nodeRuns["wait"]
                outcome = anyio.run(lambda: kernel.command(run_id, Command(kind="send", target=target,
                                                                           content="while away")))
                assert outcome.accepted
            finally:
                kernel.close()

        sender = threading.Thread(target=send)
        sender.start()
        sender.join(30)
        executor.join()

        with serve(db, port=port):
            expect(page.locator(".run-head .badge")).to_have_text("completed")
            expect(page.locator(".stream-state")).to_have_text("finished")
            seqs = [int(s) for s in page.locator(".timeline li.ev[data-seq]").evaluate_all(
                "els => els.map(e => e.dataset.seq)")]
            stored = Kernel(open_store(db))
            try:
                last = stored.snapshot(run_id).seq
            finally:
                stored.close()
            assert sorted(seqs) == list(range(1, last + 1))  # every event once, none lost while away
        # The browser logs the refused connections while the server was down: network, not the page.
        ui.assert_clean(allowed=("Failed to load resource: net::ERR_",))
    finally:
        context.close()


def test_an_agent_run_stopped_by_a_pause_is_listed_interrupted_as_the_api_says(
        open_page: Callable[..., Watched], server: Server, executor: Executor, tmp_path: Path) -> None:
    flow = {"name": "paused-agent", "nodes": [{"id": "advisor", "type": "claude.agent",
                                               "input": {"prompt": "Which database?"}}], "edges": []}
    run_id = executor.start(write_flow(tmp_path, flow), services={"query_fn": SlowAgent()})  # never answers
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    page.get_by_role("tab", name="Agents").click()
    agent = page.locator('details.agent-run[data-node="advisor"]')
    expect(agent.locator(".badge")).to_have_text("running")
    expect(agent.locator(".model")).to_have_text(re.compile(r"^claude-"))
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".run-head .badge")).to_have_text("paused")
    expect(agent.locator(".badge")).to_have_text("interrupted")
    listed = server.api("GET", "/agent-runs", params={"runId": run_id}).json()["items"]
    assert [a["status"] for a in listed] == ["interrupted"]
    steps = f"{listed[0]['stepCount']}" + (f"/{listed[0]['maxSteps']}" if listed[0]["maxSteps"] else "")
    expect(agent.locator(".steps")).to_have_text(f"{steps} steps")
    ui.assert_clean()


def test_a_run_whose_process_died_is_shown_interrupted_with_how_to_continue_it(
        open_page: Callable[..., Watched], server: Server, tmp_path: Path) -> None:
    flow = write_flow(tmp_path, {"name": "orphan", "nodes": [
        {"id": "work", "type": "python", "input": {"function": "block_first_run"}}], "edges": []})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLOWKERNEL_PLUGINS": "tests.plugins.waiters", "NO_COLOR": "1"}
    env.pop("FLOWKERNEL_API_TOKEN", None)
    process = subprocess.Popen([sys.executable, "-m", "flowkernel", "run", str(flow), "--db", server.db, "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=str(ROOT))
    try:
        assert process.stdout is not None
        run_id = json.loads(process.stdout.readline())["flowRunId"]
        wait_for(lambda: snapshot(server, run_id)["snapshot"]["nodeStatus"].get("work") == "running",
                 what="work to run")
    finally:
        process.kill()  # the run's executor dies mid-node, as after a crash or kill -9
        process.wait()
    ui = open_page(f"#/runs/{run_id}")
    page = ui.page
    expect(page.locator(".run-head .badge")).to_have_text("interrupted")
    expect(page.locator(".actions .interrupted-note")).to_contain_text(f"flowkernel resume {run_id}")
    expect(page.get_by_role("button", name="Abort run")).to_be_visible()
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)
    ui.goto("#/")
    expect(page.locator(f'tr[data-run="{run_id}"] .badge')).to_have_text("interrupted")
    # The status filter offers it, as the API lists it apart from the runs a process executes.
    page.select_option("select[name=status]", "interrupted")
    expect(page).to_have_url(re.compile(r"status=interrupted"))
    expect(page.locator(f'tr[data-run="{run_id}"] .badge')).to_have_text("interrupted")
    page.select_option("select[name=status]", "running")
    expect(page.locator(f'tr[data-run="{run_id}"]')).to_have_count(0)
    ui.assert_clean()
