"""The pytest plugin's ``flowkernel`` fixture, used as the README shows."""

from __future__ import annotations

from pathlib import Path

from flowkernel.testing.pytest_plugin import FlowTester

ROOT = Path(__file__).resolve().parent.parent


def test_review_loop_loops_once_then_passes(flowkernel: FlowTester) -> None:
    result = flowkernel.run(ROOT / "flows/review-loop.json", {"feature": "CSV export"},
                            fixtures=ROOT / "fixtures/review-loop")
    assert result.status == "completed"
    assert result.outputs["reviewer"]["structuredOutput"]["passed"] is True
    flowkernel.assert_events(result, ["node:complete planner", "node:complete reviewer", "loop:iterate",
                                      "node:complete coder", "node:complete reviewer", "flow:complete"])
    assert [m["role"] for m in result.messages if m["nodeId"] == "coder"] == ["user", "assistant"] * 2


def test_approval_waits_then_completes_after_replies(flowkernel: FlowTester) -> None:
    result = flowkernel.run(ROOT / "flows/approval.json", {"topic": "dark mode in the settings page"},
                            fixtures=ROOT / "fixtures/approval", store="file")
    assert result.status == "waiting"
    result = flowkernel.reply(result, "review", "Mention that it ships on Friday.")
    result = flowkernel.reply(result, "review", "approve")
    assert result.status == "completed"
    assert "Friday" in result.outputs["publish"]["announcement"]


def test_a_fixture_mismatch_names_the_node_and_the_differing_path(flowkernel: FlowTester) -> None:
    result = flowkernel.run(ROOT / "flows/review-loop.json", {"feature": "PDF export"},
                            fixtures=ROOT / "fixtures/review-loop")
    assert result.status == "failed" and result.error is not None and "planner" in result.error
    [failure] = result.failures
    assert (failure.node, failure.item, failure.error_type) == ("planner", None, "fixture_mismatch")
    assert failure.diff is not None
    [changed] = [d for d in failure.diff if "PDF export" in d["live"]]
    assert "CSV export" in changed["recorded"] and changed["path"].startswith("messages[0]")
    try:
        result.assert_completed()
    except AssertionError as exc:
        message = str(exc)
    else:
        raise AssertionError("assert_completed passed on a failed run")
    assert message.startswith(f"run {result.run_id} is failed, not completed\n")
    assert "planner: fixture_mismatch: node 'planner', call 0: the request differs" in message
    assert f"{changed['path']}: recorded" in message and "PDF export" in message


def test_failures_forget_a_node_that_was_done_again(flowkernel: FlowTester, tmp_path: Path) -> None:
    from flowkernel.plugins.registry import default_registry

    registry = default_registry().copy()
    calls: list[int] = []

    @registry.register_function("twice")
    def twice() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first time")
        return "ok"

    flow = {"name": "retried", "nodes": [{"id": "t", "type": "python", "input": {"function": "twice"},
                                          "policy": {"retry": {"maxAttempts": 2, "backoffMs": 0}}}]}
    result = flowkernel.run(flow, registry=registry, check=True)
    assert result.failures == [] and result.error is None and result.outputs["t"] == "ok"


def test_the_pytest_output_of_a_failing_flow_test_shows_why(tmp_path: Path) -> None:
    """What a user sees from pytest: the diff, not just `'failed' == 'completed'`; a missing fixture
    directory names `flowkernel record`."""
    import subprocess
    import sys

    test_file = tmp_path / "test_user_flows.py"
    test_file.write_text(
        "from pathlib import Path\n"
        f"ROOT = Path({str(ROOT)!r})\n\n"
        "def test_checked(flowkernel):\n"
        "    flowkernel.run(ROOT / 'flows/review-loop.json', {'feature': 'PDF export'},\n"
        "                   fixtures=ROOT / 'fixtures/review-loop', check=True)\n\n"
        "def test_plain_assert(flowkernel):\n"
        "    result = flowkernel.run(ROOT / 'flows/review-loop.json', {'feature': 'PDF export'},\n"
        "                            fixtures=ROOT / 'fixtures/review-loop')\n"
        "    assert result.status == 'completed'\n\n"
        "def test_no_fixtures(flowkernel, tmp_path):\n"
        "    flowkernel.run(ROOT / 'flows/review-loop.json', {'feature': 'x'}, fixtures=tmp_path / 'none')\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(test_file)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    text = out.stdout
    assert "3 failed" in text, text
    checked = text[text.index("_ test_checked _"):text.index("_ test_plain_assert _")]
    assert "AssertionError: run run_" in checked and "is failed, not completed" in checked
    assert 'recorded "' in checked and "PDF export" in checked  # the differing prompt, both sides
    plain = text[text.index("_ test_plain_assert _"):text.index("_ test_no_fixtures _")]
    assert "flowkernel: runs that did not complete" in plain  # a report section of the failed test
    assert "planner: fixture_mismatch" in plain and 'live     "Plan the feature: PDF export"' in plain
    missing = text[text.index("_ test_no_fixtures _"):]
    assert "flowkernel record --flow FLOW --output DIR" in missing
