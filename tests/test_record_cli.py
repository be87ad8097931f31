"""`flowkernel record`: a flow run live, through the real `anthropic` client against the fake Messages API
(ANTHROPIC_BASE_URL), written as fixtures that `flowkernel run --fixtures` then replays offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from flowkernel.fixtures import RECORD_HINT
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_support import sent

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "flowkernel.cli"]

REVIEW_LOOP = [reply(Text("1. Write it. 2. Test it.", deltas=3)), reply(Text("def export_csv(): ...")),
               reply(Text('{"passed": false, "issues": ["no rows"]}')), reply(Text("def export_csv(rows): ...")),
               reply(Text('{"passed": true, "issues": []}'))]


def flowkernel(env: dict[str, str], *args: str, db: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--db", str(db)] if db is not None else []
    return subprocess.run([*CLI, *args, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def env(clean_env: dict[str, str]) -> dict[str, str]:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        clean_env.pop(name, None)
    return clean_env


@pytest.fixture
def fake(env: dict[str, str]) -> object:
    with FakeAnthropic() as api:
        env["ANTHROPIC_BASE_URL"] = api.base_url
        env["ANTHROPIC_API_KEY"] = "test"
        yield api


def test_errors_that_point_at_recording_name_the_command_that_exists(env: dict[str, str]) -> None:
    assert "flowkernel record --flow FLOW --output DIR" in RECORD_HINT
    usage = flowkernel(env, "record", "--help")
    assert usage.returncode == 0 and "--flow FLOW --output DIR" in " ".join(usage.stdout.split())


def test_without_a_key_or_base_url_record_fails_in_one_line_before_anything_runs(env: dict[str, str],
                                                                                tmp_path: Path) -> None:
    done = flowkernel(env, "record", "--flow", "flows/review-loop.json", "--output", str(tmp_path / "out"),
                      "--input", "feature=CSV export")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "ANTHROPIC_API_KEY" in done.stderr, done.stderr
    assert done.stdout == "" and not (tmp_path / "out").exists()


def test_record_writes_fixtures_that_replay_offline(env: dict[str, str], fake: FakeAnthropic,
                                                   tmp_path: Path) -> None:
    fake.script(*REVIEW_LOOP)
    out = tmp_path / "recorded"
    done = flowkernel(env, "record", "--flow", "flows/review-loop.json", "--output", str(out),
                      "--input", "feature=CSV export")
    assert done.returncode == 0, done.stderr
    assert fake.request_count == 5
    assert all("test" in (r.headers.get("x-api-key"), r.headers.get("authorization", "").removeprefix("Bearer "))
               for r in fake.requests)  # the key from the environment reached the API
    assert sorted(done.stdout.split()) == [str(out / f"{n}.json") for n in ("coder", "planner", "reviewer")]
    progress = done.stderr.splitlines()
    for line in ("flowkernel record: planner: start", "flowkernel record: planner: model call 0",
                 "flowkernel record: planner: complete", "flowkernel record: coder: model call 1",
                 "flowkernel record: reviewer: complete"):
        assert line in progress, done.stderr
    recorded = {n: json.loads((out / f"{n}.json").read_text(encoding="utf-8")) for n in ("planner", "coder")}
    # the first request depends only on the flow and its input: the same as the shipped recording's
    shipped = json.loads((ROOT / "fixtures" / "review-loop" / "planner.json").read_text(encoding="utf-8"))
    assert recorded["planner"]["calls"][0]["input"] == shipped["calls"][0]["input"]
    assert recorded["planner"]["flow"] == "review-loop"
    assert sent(recorded["coder"]["calls"][0]["input"]["messages"][0])["content"] == "Implement: 1. Write it. 2. Test it."
    assert [c["call"] for c in recorded["coder"]["calls"]] == [0, 1]

    env.pop("ANTHROPIC_API_KEY")
    env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens: the replay must not call out
    replayed = flowkernel(env, "run", "flows/review-loop.json", "--input", "feature=CSV export", "--fixtures",
                          str(out), "--json", db=tmp_path / "runs.db")
    assert replayed.returncode == 0, replayed.stderr
    events = [json.loads(line) for line in replayed.stdout.splitlines()]
    assert [e["type"] for e in events].count("loop:iterate") == 1
    assert fake.request_count == 5

    again = flowkernel({**env, "ANTHROPIC_API_KEY": "test"}, "record", "--flow", "flows/review-loop.json",
                       "--output", str(out), "--input", "feature=CSV export")
    assert again.returncode == 2 and "already exists" in again.stderr and "--force" in again.stderr
    assert fake.request_count == 5  # refused before any model call


def test_record_answers_waits_with_replies_and_loads_its_plugin(env: dict[str, str], fake: FakeAnthropic,
                                                                tmp_path: Path) -> None:
    fake.script(reply(ToolUse("lookup_fact", {"topic": "sqlite"})),
                reply(ToolUse("ask_human", {"question": "Transactions or analytics?"})),
                reply(Text("Use SQLite.")))
    out = tmp_path / "research"
    question = "question=Which database should our desktop app use?"
    done = flowkernel(env, "record", "--flow", "flows/research.json", "--output", str(out), "--input", question,
                      "--reply", "Mostly record transactions.", "--plugin", "flowkernel.examples.research_tools")
    assert done.returncode == 0, done.stderr
    assert "flowkernel record: researcher: waiting" in done.stderr
    calls = json.loads((out / "researcher.json").read_text(encoding="utf-8"))["calls"]
    assert len(calls) == 3
    assert calls[2]["input"]["messages"][-1]["content"][0]["content"] == "Mostly record transactions."

    env.pop("ANTHROPIC_API_KEY")
    env["FLOWKERNEL_PLUGINS"] = "flowkernel.examples.research_tools"
    first = flowkernel(env, "run", "flows/research.json", "--input", question, "--fixtures", str(out), "--json",
                       db=tmp_path / "runs.db")
    assert first.returncode == 3, first.stderr
    waiting = [json.loads(line) for line in first.stdout.splitlines() if '"node:waiting"' in line][-1]
    second = flowkernel(env, "reply", waiting["flowRunId"], "--to", waiting["runId"], "Mostly record transactions.",
                        "--fixtures", str(out), db=tmp_path / "runs.db")
    assert second.returncode == 0, second.stderr


def test_a_wait_without_a_reply_stops_with_what_was_recorded(env: dict[str, str], fake: FakeAnthropic,
                                                             tmp_path: Path) -> None:
    fake.script(reply(Text("Dark mode is here.")))
    out = tmp_path / "approval"
    done = flowkernel(env, "record", "--flow", "flows/approval.json", "--output", str(out),
                      "--input", "topic=dark mode")
    assert done.returncode == 3, done.stderr
    assert "review waits for a reply" in done.stderr and "--reply" in done.stderr and "Traceback" not in done.stderr
    assert json.loads((out / "drafter.json").read_text(encoding="utf-8"))["calls"][0]["call"] == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--flow", "flows/nope.json"], "nope.json"),
    (["--flow", "flows/review-loop.json"], "feature"),  # a required input is missing
    (["--flow", "flows/review-loop.json", "--input", "feature=x", "--input-json", "missing.json"], "--input-json"),
    (["--flow", "flows/research.json", "--input", "question=q", "--plugin", "no_such_module"], "no_such_module"),
])
def test_bad_arguments_are_refused_before_any_model_call(env: dict[str, str], fake: FakeAnthropic, tmp_path: Path,
                                                         args: list[str], message: str) -> None:
    done = flowkernel(env, "record", *args, "--output", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert fake.request_count == 0 and not (tmp_path / "out").exists()
