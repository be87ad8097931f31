"""No key, no fixtures: a run of a flow whose nodes call the Messages API is refused in one line before
anything is stored, saying how to give a key or use --fixtures (the sentence ``record`` refuses with);
a worker executing such a run fails it with that sentence, not the SDK's TypeError, and the hint after
a failed model call says to give the key first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flowkernel.testing.fake_api import FakeAnthropic, Text, reply

from tests.server_support import pool_worker, serving

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(Path(sys.executable).with_name("flowkernel"))
HOW = ("calls the Anthropic Messages API and no credentials are set: set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN, "
       "or ANTHROPIC_BASE_URL for a compatible server), or serve its model calls from recorded fixtures with "
       "--fixtures DIR")


@pytest.fixture
def keyless(clean_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """No credentials of any kind: no ANTHROPIC_* variable, and a home without an SDK config folder."""
    env = {k: v for k, v in clean_env.items() if not k.startswith("ANTHROPIC_")}
    env["HOME"] = str(tmp_path / "home")
    return env


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=120)


def runs(db: Path, cwd: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    listed = fk("runs", "--db", str(db), "--json", cwd=cwd, env=env)
    assert listed.returncode == 0, listed.stderr
    return [json.loads(line) for line in listed.stdout.splitlines()]


def test_run_without_a_key_or_fixtures_is_refused_before_anything_is_stored(tmp_path: Path,
                                                                            keyless: dict[str, str]) -> None:
    db = tmp_path / "runs.db"
    res = fk("run", str(ROOT / "flows" / "review-loop.json"), "--input", "feature=x", "--db", str(db),
             cwd=tmp_path, env=keyless)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr == f"flowkernel: node 'planner' {HOW}; nothing was run\n"
    assert runs(db, tmp_path, keyless) == []

    with_fixtures = fk("run", str(ROOT / "flows" / "review-loop.json"), "--input", "feature=CSV export",
                       "--fixtures", str(ROOT / "fixtures" / "review-loop"), "--db", str(db), cwd=tmp_path, env=keyless)
    assert with_fixtures.returncode == 0, with_fixtures.stderr


def test_only_a_flow_that_calls_the_model_itself_or_in_a_child_is_refused(tmp_path: Path,
                                                                         keyless: dict[str, str]) -> None:
    db = str(tmp_path / "runs.db")
    plain = fk("run", str(ROOT / "flows" / "hello.json"), "--input", "name=Ada", "--db", db, cwd=tmp_path, env=keyless)
    assert plain.returncode == 0, plain.stderr

    (tmp_path / "child.json").write_text(json.dumps({"name": "child", "nodes": [
        {"id": "writer", "type": "claude.agent", "input": {"prompt": "Write."}}]}))
    (tmp_path / "parent.json").write_text(json.dumps({"name": "parent", "nodes": [
        {"id": "first", "type": "noop", "input": {}},
        {"id": "call", "type": "flow.call", "input": {"flow": "child.json"}}]}))
    res = fk("run", "parent.json", "--db", db, cwd=tmp_path, env=keyless)
    assert res.returncode == 2
    assert res.stderr == f"flowkernel: node 'writer' of child flow child.json {HOW}; nothing was run\n"
    assert [r["flowName"] for r in runs(tmp_path / "runs.db", tmp_path, keyless)] == ["hello"]


def test_a_worker_without_a_key_fails_the_run_with_the_sentence_and_the_hint_says_to_give_one(
        tmp_path: Path, keyless: dict[str, str]) -> None:
    (tmp_path / "ask.json").write_text(json.dumps({"name": "ask", "nodes": [
        {"id": "agent", "type": "claude.agent", "input": {"prompt": "Is it on?"}}]}))
    db = str(tmp_path / "runs.db")
    queued = fk("run", "ask.json", "--queue", "--db", db, cwd=tmp_path, env=keyless)  # the worker's key counts
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    worker = subprocess.Popen([SCRIPT, "worker", "--db", db], cwd=tmp_path, env=keyless,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        followed = fk("events", run_id, "--follow", "--json", "--db", db, cwd=tmp_path, env=keyless)
    finally:
        worker.terminate()
        _, worker_log = worker.communicate(timeout=60)
    assert followed.returncode == 0, followed.stderr + worker_log
    errors = [e for e in map(json.loads, followed.stdout.splitlines()) if e["type"] == "node:error"]
    assert [(e["errorType"], e["message"]) for e in errors] == [("authentication", f"node 'agent' {HOW}")]
    shown = json.loads(fk("show", run_id, "--json", "--db", db, cwd=tmp_path, env=keyless).stdout)
    assert shown["run"]["status"] == "failed"
    assert shown["run"]["error"] == f"node 'agent' failed: node 'agent' {HOW}"
    assert "TypeError" not in followed.stdout + worker_log

    again = fk("retry", run_id, "--db", db, cwd=tmp_path, env=keyless)  # still no key: the hint says so
    assert again.returncode == 1
    assert again.stderr.splitlines()[-1] == (
        f"flowkernel: run {run_id} failed: node 'agent' failed: node 'agent' {HOW}; set ANTHROPIC_API_KEY (or "
        "ANTHROPIC_AUTH_TOKEN, or ANTHROPIC_BASE_URL for a compatible server) and re-run its failed nodes with: "
        f"flowkernel retry {run_id} --db {db} (or serve them from recorded fixtures: flowkernel retry {run_id} "
        f"--db {db} --fixtures DIR)")

    with FakeAnthropic() as fake:  # a compatible server that takes no key
        fake.script(reply(Text("Yes.")))
        done = fk("retry", run_id, "--db", db, cwd=tmp_path, env={**keyless, "ANTHROPIC_BASE_URL": fake.base_url})
    assert done.returncode == 0, done.stderr
    assert "authorization" not in fake.requests[0].headers and "x-api-key" not in fake.requests[0].headers


def test_serve_executing_a_run_without_a_key_fails_it_with_the_same_sentence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ANTHROPIC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ask = {"name": "ask", "nodes": [{"id": "agent", "type": "claude.agent", "input": {"prompt": "Is it on?"}}]}
    with serving(str(tmp_path / "runs.db")) as live, pool_worker(live.db), live.client() as http:
        created = http.post("/api/v1/runs", params={"wait": 30}, json={"flowDocument": ask})
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "failed"
    assert created.json()["error"] == f"node 'agent' failed: node 'agent' {HOW}"
