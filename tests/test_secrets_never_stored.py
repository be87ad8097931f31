"""An API key or auth token never reaches the store, an API answer, `show`, `export` or a log line:
not when the upstream's error echoes the request's headers, nor when a tool's error quotes them."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from flowkernel.redaction import REDACTED, RedactingFilter, install_log_redaction, redact_text
from flowkernel.testing.fake_api import FakeAnthropic, ToolUse, http_error, reply

from tests.server_support import wait_for
from tests.test_server_runs import answering, free_port

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-ant-test-SECRET-" + "k" * 40
TOKEN = "tok-SECRET-" + "t" * 30
SECRETS = (KEY, TOKEN, "SECRET")
FLOW = {"name": "leaky", "nodes": [{"id": "agent", "type": "claude.agent", "input": {
    "prompt": "Is the service up?", "tools": ["status_page"], "maxTokens": 1000}}]}


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        # A tool call whose tool fails quoting its headers, then a proxy's error page that echoes the
        # request's headers: once retried (529), then for good (400).
        f.script(reply(ToolUse("status_page", {"service": "api"})),
                 http_error(529, retry_after=0.01, echo_headers=True),
                 http_error(400, "blocked by the proxy", echo_headers=True))
        yield f


def environment(fake: FakeAnthropic) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "ANTHROPIC_BASE_URL": fake.base_url,
           "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_AUTH_TOKEN": TOKEN, "FLOWKERNEL_PLUGINS": "tests.plugins.leaky"}
    for name in ("FLOWKERNEL_DB", "FLOWKERNEL_API_TOKEN"):
        env.pop(name, None)
    return env


def fk(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=120)


def assert_no_secret(where: str, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    for secret in SECRETS:
        assert secret.encode() not in data, f"{where} holds {secret[:12]}…"


def assert_store_clean(folder: Path) -> None:
    files = [p for p in folder.iterdir() if p.name.startswith("runs.db")]
    assert any(p.name == "runs.db" for p in files)
    for path in files:  # the database, its write-ahead log and shared memory
        assert_no_secret(path.name, path.read_bytes())


def test_the_upstream_echoing_headers_leaves_no_secret_anywhere_through_the_cli(
        fake: FakeAnthropic, tmp_path: Path) -> None:
    env = environment(fake)
    flow = tmp_path / "leaky.json"
    flow.write_text(json.dumps(FLOW))
    run = fk(env, tmp_path, "run", str(flow), "--json", "--db", "runs.db")
    assert run.returncode == 1, run.stderr
    # The secrets were sent, and came back in the errors: what follows is what kept them out.
    assert KEY in json.dumps(fake.requests[1].headers)
    run_id = json.loads(run.stdout.splitlines()[0])["flowRunId"]
    assert_no_secret("run's output", run.stdout + run.stderr)
    assert "x-api-key" in run.stdout and REDACTED in run.stdout  # the error is there, its key is not

    outputs = {"show --full": ("show", run_id, "--full"), "show --json": ("show", run_id, "--json"),
               "show --messages": ("show", run_id, "--messages"), "show --tool-calls": ("show", run_id, "--tool-calls"),
               "events --json": ("events", run_id, "--json"), "runs": ("runs",), "export": ("export", run_id)}
    for name, args in outputs.items():
        done = fk(env, tmp_path, *args, "--db", "runs.db")
        assert done.returncode == 0, (name, done.stderr)
        assert_no_secret(name, done.stdout + done.stderr)
    export = fk(env, tmp_path, "export", run_id, "--db", "runs.db").stdout
    assert "request headers" in export and "sent headers" in export  # both errors, redacted
    assert_store_clean(tmp_path)


def test_the_upstream_echoing_headers_leaves_no_secret_anywhere_through_serve(
        fake: FakeAnthropic, tmp_path: Path) -> None:
    env = environment(fake)
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "flowkernel", "serve", "--port", str(port), "--db", "runs.db",
                                "--workers", "1"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/api/v1"
    answers: list[str] = []
    try:
        wait_for(lambda: answering(port), what="serve to answer")
        created = httpx.post(f"{base}/runs", json={"flowDocument": FLOW, "input": {}}, params={"wait": 60}, timeout=90)
        assert created.status_code == 201, created.text
        run_id = created.json()["runId"]
        wait_for(lambda: httpx.get(f"{base}/runs/{run_id}").json()["run"]["status"] == "failed", timeout=60,
                 what="the run to fail")
        agent_run = httpx.get(f"{base}/agent-runs", params={"runId": run_id}).json()["items"][0]["agentRunId"]
        for path in (f"/runs/{run_id}", f"/runs/{run_id}/events", f"/runs/{run_id}/messages",
                     f"/runs/{run_id}/tool-calls", "/runs", "/agent-runs", f"/agent-runs/{agent_run}",
                     f"/agent-runs/{agent_run}/messages", f"/agent-runs/{agent_run}/tool-calls"):
            answer = httpx.get(base + path, timeout=30)
            assert answer.status_code == 200, (path, answer.text)
            answers.append(answer.text)
            assert_no_secret(path, answer.text)
        with httpx.stream("GET", f"{base}/runs/{run_id}/stream", timeout=30) as stream:  # what the UI's timeline reads
            streamed = "".join(stream.iter_text())
        assert "flow:complete" in streamed
        assert_no_secret("the event stream", streamed)
        assert any("request headers" in a and REDACTED in a for a in answers)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert_no_secret("serve's log", err)
    assert_store_clean(tmp_path)


def test_log_lines_are_redacted_by_the_filter_the_cli_installs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logging.getLogger().addHandler(handler)
    try:
        install_log_redaction()
        log = logging.getLogger("flowkernel.test")
        log.error("upstream failed: %s", {"authorization": f"Bearer {TOKEN}", "x-api-key": KEY})
        try:
            raise RuntimeError(f"echoed {KEY}")
        except RuntimeError:
            log.exception("and with a traceback")
    finally:
        logging.getLogger().removeHandler(handler)
    written = out.getvalue()
    assert "upstream failed" in written and "echoed [REDACTED]" in written
    assert_no_secret("the log", written)
    assert any(isinstance(f, RedactingFilter) for f in handler.filters)


def test_redaction_keeps_the_text_around_a_credential() -> None:
    text = (f"HTTP 400 blocked (request headers: {{\"x-api-key\": \"{KEY}\", \"Authorization\": \"Bearer abc123xyz\", "
            f"\"accept\": \"application/json\"}}) at {time.strftime('%Y')}")
    assert redact_text(text) == (f"HTTP 400 blocked (request headers: {{\"x-api-key\": \"[REDACTED]\", "
                                 f"\"Authorization\": \"Bearer [REDACTED]\", \"accept\": \"application/json\"}}) "
                                 f"at {time.strftime('%Y')}")
