"""Every example flow runs out of the box from its recorded fixtures, through the CLI, without a key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "flowkernel.cli"]


def flowkernel(env: dict[str, str], db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args, "--db", str(db)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def env(clean_env: dict[str, str]) -> dict[str, str]:
    clean_env.pop("ANTHROPIC_API_KEY", None)
    clean_env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens: a real call would fail
    return clean_env


@pytest.mark.parametrize(("name", "inputs"), [
    ("review-loop", ["feature=CSV export"]),
    ("fanout", []),
    ("subflow", ["topic=durable workflows"]),
])
def test_example_flow_completes_from_its_fixtures(env: dict[str, str], tmp_path: Path, name: str,
                                                  inputs: list[str]) -> None:
    args = [a for i in inputs for a in ("--input", i)]
    done = flowkernel(env, tmp_path / "runs.db", "run", f"flows/{name}.json", *args, "--fixtures", f"fixtures/{name}")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "completed" in done.stdout


def _waiting_run(out: str) -> tuple[str, str]:
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    waiting = [e for e in events if e["type"] == "node:waiting"][-1]
    return waiting["flowRunId"], waiting["runId"]


def test_approval_pauses_for_the_human_and_completes_after_two_replies(env: dict[str, str], tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    first = flowkernel(env, db, "run", "flows/approval.json", "--input", "topic=dark mode in the settings page",
                       "--fixtures", "fixtures/approval", "--json")
    assert first.returncode == 3, first.stderr
    run_id, node_run = _waiting_run(first.stdout)
    second = flowkernel(env, db, "reply", run_id, "--to", node_run, "Mention that it ships on Friday.",
                        "--fixtures", "fixtures/approval", "--json")
    assert second.returncode == 3, second.stderr
    _, node_run = _waiting_run(second.stdout)
    third = flowkernel(env, db, "reply", run_id, "--to", node_run, "approve", "--fixtures", "fixtures/approval",
                       "--json")
    assert third.returncode == 0, third.stderr
    shown = json.loads(flowkernel(env, db, "show", run_id, "--json").stdout)
    assert shown["snapshot"]["outputs"]["publish"]["announcement"].startswith("Dark mode ships on Friday")


def test_research_agent_asks_the_human_then_answers(env: dict[str, str], tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    env["FLOWKERNEL_PLUGINS"] = "flowkernel.examples.research_tools"
    first = flowkernel(env, db, "run", "flows/research.json", "--input",
                       "question=Which database should our desktop app use?", "--fixtures", "fixtures/research",
                       "--json")
    assert first.returncode == 3, first.stderr
    events = [json.loads(line) for line in first.stdout.splitlines()]
    assert [e["toolName"] for e in events if e["type"] == "agent:tool"] == ["lookup_fact", "lookup_fact"]
    run_id, node_run = _waiting_run(first.stdout)
    done = flowkernel(env, db, "reply", run_id, "--to", node_run, "Mostly record transactions.",
                      "--fixtures", "fixtures/research")
    assert done.returncode == 0, done.stderr
    again = flowkernel(env, db, "rerun", run_id)
    assert again.returncode == 0 and "matches" in again.stdout, again.stdout + again.stderr

    # The stored conversation and tool calls, page by page and filtered, as `show` lists them.
    tools = flowkernel(env, db, "show", run_id, "--tool-calls", "--json")
    calls = [json.loads(line) for line in tools.stdout.splitlines()]
    assert [c["toolName"] for c in calls] == ["lookup_fact", "lookup_fact", "ask_human"]
    only = flowkernel(env, db, "show", run_id, "--tool-calls", "--tool", "ask_human", "--tool-status", "completed",
                      "--json")
    assert [json.loads(line)["output"] for line in only.stdout.splitlines()] == ["Mostly record transactions."]
    first_page = flowkernel(env, db, "show", run_id, "--messages", "--limit", "2", "--json")
    page = [json.loads(line) for line in first_page.stdout.splitlines()]
    assert len(page) == 2 and page[0]["role"] in ("system", "user")
    cursor = first_page.stderr.split("--after ")[1].split()[0]
    rest = flowkernel(env, db, "show", run_id, "--messages", "--after", cursor, "--limit", "100", "--json")
    later = [json.loads(line) for line in rest.stdout.splitlines()]
    assert later and later[0]["id"] > page[-1]["id"] and later[-1]["role"] == "assistant"
    readable = flowkernel(env, db, "show", run_id)
    assert "agents" in readable.stdout and "session" in readable.stdout


def test_a_reply_the_recording_did_not_have_is_reported_as_a_changed_prompt(env: dict[str, str],
                                                                            tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    first = flowkernel(env, db, "run", "flows/approval.json", "--input", "topic=dark mode in the settings page",
                       "--fixtures", "fixtures/approval", "--json")
    run_id, node_run = _waiting_run(first.stdout)
    other = flowkernel(env, db, "reply", run_id, "--to", node_run, "Make it funnier.", "--fixtures",
                       "fixtures/approval")
    assert other.returncode == 1
    assert "call 1" in other.stderr and "messages[2].content" in other.stderr


def test_fixtures_flag_with_a_missing_directory_is_invalid_input(env: dict[str, str], tmp_path: Path) -> None:
    done = flowkernel(env, tmp_path / "runs.db", "run", "flows/fanout.json", "--fixtures", "fixtures/nope")
    assert done.returncode == 2 and "no such directory" in done.stderr


def test_help_does_not_import_the_runtime() -> None:
    code = "import sys; from kernel import cli; print('flowkernel.run.kernel' in sys.modules, 'anthropic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "False False"
