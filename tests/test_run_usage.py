"""Run-level usage and cost (DESIGN §12): every model call counts, child runs add up in their parent.

Agents run through the real ``anthropic`` client against the loopback fake of the Messages API, on a
real SQLite file; the replay audit (conftest) checks that each run row's totals are the fold of its
``agent:usage`` events.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from flowkernel.agents.tools import tool
from flowkernel.core.events import AgentUsage
from flowkernel.nodes.claude.pricing import DEFAULT_PRICES, cost_usd
from flowkernel.plugins.registry import default_registry
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_support import agent_flow, make_kernel

SONNET = DEFAULT_PRICES["claude-sonnet-4-6"]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def _usage(i: int, o: int, cw: int = 0, cr: int = 0) -> dict[str, int]:
    return {"inputTokens": i, "outputTokens": o, "cacheCreationInputTokens": cw, "cacheReadInputTokens": cr}


def test_every_model_call_is_counted_in_the_run_as_it_happens(tmp_path: Path, fake: FakeAnthropic) -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return key.upper()

    registry = default_registry().copy()
    registry.add_tool("lookup", lookup)
    fake.script(reply(ToolUse("lookup", {"key": "a"}), input_tokens=100, output_tokens=20,
                      cache_creation_input_tokens=1000),
                reply(Text("done"), input_tokens=30, output_tokens=5, cache_read_input_tokens=1000))
    kernel = make_kernel(tmp_path, fake, registry=registry)
    snap = anyio.run(kernel.run, kernel.compile(agent_flow(prompt="go", tools=["lookup"], model="claude-sonnet-4-6")),
                     {})
    assert snap.status == "completed"
    calls = [e for e in kernel.events(snap.runId) if isinstance(e, AgentUsage)]
    assert [c.usage for c in calls] == [_usage(100, 20, cw=1000), _usage(30, 5, cr=1000)]
    expected = cost_usd(_usage(100, 20, cw=1000), SONNET) + cost_usd(_usage(30, 5, cr=1000), SONNET)
    assert [round(c.costUsd, 10) for c in calls] == [round(cost_usd(c.usage, SONNET), 10) for c in calls]
    assert snap.usage == _usage(130, 25, 1000, 1000)
    assert snap.totalCostUsd == pytest.approx(expected, abs=1e-9)
    record = kernel.store.get_run(snap.runId)
    assert record.usage == snap.usage and record.totalCostUsd == snap.totalCostUsd
    summary = kernel.summary(snap.runId)
    assert summary.totalCostUsd == pytest.approx(expected, abs=1e-9)
    assert (summary.usage.inputTokens, summary.usage.cacheReadInputTokens) == (130, 1000)
    assert summary.completedAt is not None and summary.durationMs == summary.completedAt - summary.createdAt
    # Same totals as the agent's own account of itself.
    assert snap.outputs["agent"]["usage"] == snap.usage


def test_a_failed_agent_still_costs_what_its_calls_cost(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("not json"), input_tokens=50, output_tokens=10),
                reply(Text("still not json"), input_tokens=60, output_tokens=10))
    kernel = make_kernel(tmp_path, fake)
    flow = agent_flow(prompt="answer in JSON", outputSchema={"type": "object"}, outputRetries=1,
                      model="claude-sonnet-4-6")
    snap = anyio.run(kernel.run, kernel.compile(flow), {})
    assert snap.status == "failed"
    assert snap.usage == _usage(110, 20)
    assert kernel.summary(snap.runId).totalCostUsd == pytest.approx(
        cost_usd(_usage(110, 20), DEFAULT_PRICES["claude-sonnet-4-6"]), abs=1e-9)


def test_child_runs_add_up_in_their_parent(tmp_path: Path, fake: FakeAnthropic) -> None:
    child = {"name": "child", "nodes": [{"id": "inner", "type": "claude.agent",
                                              "input": {"prompt": "inner", "model": "claude-sonnet-4-6"}}]}
    (tmp_path / "child.json").write_text(json.dumps(child))
    parent = {"name": "parent", "nodes": [
        {"id": "outer", "type": "claude.agent", "input": {"prompt": "outer", "model": "claude-sonnet-4-6"}},
        {"id": "call", "type": "flow.call", "input": {"flow": "child.json"}}],
        "edges": [{"from": "outer", "to": "call"}]}
    (tmp_path / "parent.json").write_text(json.dumps(parent))
    fake.script(reply(Text("one"), input_tokens=1000, output_tokens=100),
                reply(Text("two"), input_tokens=2000, output_tokens=200))
    kernel = make_kernel(tmp_path, fake)
    snap = anyio.run(kernel.run, kernel.load_flow(tmp_path / "parent.json"), {})
    assert snap.status == "completed"
    [kid] = kernel.runs(parent=snap.runId)
    own, theirs = _usage(1000, 100), _usage(2000, 200)
    assert snap.usage == own and kernel.store.get_run(kid.runId).usage == theirs
    total = kernel.summary(snap.runId)
    assert (total.usage.inputTokens, total.usage.outputTokens) == (3000, 300)
    assert total.totalCostUsd == pytest.approx(cost_usd(own, SONNET) + cost_usd(theirs, SONNET), abs=1e-9)
    detail = kernel.detail(snap.runId)
    assert detail["run"]["totalCostUsd"] == total.totalCostUsd
    assert [c["runId"] for c in detail["children"]] == [kid.runId]
    assert detail["children"][0]["usage"]["inputTokens"] == 2000
    page, _ = kernel.run_page()
    assert {r.runId: r.usage.inputTokens for r in page} == {snap.runId: 3000, kid.runId: 2000}


def test_runs_and_show_print_the_cost(tmp_path: Path, fake: FakeAnthropic, clean_env: dict[str, str]) -> None:
    fake.script(reply(Text("hi"), input_tokens=100_000, output_tokens=0))
    kernel = make_kernel(tmp_path, fake)
    snap = anyio.run(kernel.run, kernel.compile(agent_flow(prompt="hi", model="claude-sonnet-4-6")), {})
    kernel.close()
    db = str(tmp_path / "runs.db")

    def fk(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "flowkernel", *args, "--db", db], capture_output=True,
                              text=True, env=clean_env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = fk("runs")
    assert "$0.3000" in listed and "100,000" in listed
    [row] = [json.loads(line) for line in fk("runs", "--json").splitlines()]
    assert row["totalCostUsd"] == 0.3 and row["usage"]["inputTokens"] == 100_000 and row["seq"] == snap.seq
    shown = fk("show", snap.runId)
    assert "cost     $0.3000  100,000 in / 0 out tokens" in shown
    detail = json.loads(fk("show", snap.runId, "--json"))
    assert detail["run"]["totalCostUsd"] == 0.3 and detail["snapshot"]["totalCostUsd"] == pytest.approx(0.3)
