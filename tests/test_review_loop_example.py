"""The flagship example does what it shows: in flows/review-loop.json the reviewer's findings reach the
coder on the pass after a failed review, from the shipped fixtures (through the CLI) and from a live
API that finds something else (the flow, not the recording, passes the review on)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
from flowkernel.testing.fake_api import FakeAnthropic, Text, reply

from tests.claude_support import make_kernel, sent

ROOT = Path(__file__).resolve().parent.parent
FLOW = ROOT / "flows" / "review-loop.json"


def fk(env: dict[str, str], db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel", *args, "--db", str(db)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_coders_second_pass_gets_the_reviewers_findings_from_the_shipped_fixtures(
        clean_env: dict[str, str], tmp_path: Path) -> None:
    env = {**clean_env, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}  # nothing listens: fixtures only
    env.pop("ANTHROPIC_API_KEY", None)
    db = tmp_path / "runs.db"
    done = fk(env, db, "run", str(FLOW), "--input", "feature=CSV export", "--fixtures", "fixtures/review-loop",
              "--json")
    assert done.returncode == 0, done.stderr  # each live request matched its recording
    events = [json.loads(line) for line in done.stdout.splitlines()]
    run_id = events[0]["flowRunId"]
    first_review = next(e for e in events if e["type"] == "node:complete" and e["nodeId"] == "reviewer")
    issues = first_review["output"]["structuredOutput"]["issues"]
    assert issues == ["no header row", "newline='' missing on open()"]

    coder_runs = [e["runId"] for e in events if e["type"] == "node:start" and e["nodeId"] == "coder"]
    assert len(coder_runs) == 2
    shown = fk(env, db, "show", run_id, "--messages", "--node-run", coder_runs[1], "--json")
    prompts = [m["content"] for m in map(json.loads, shown.stdout.splitlines()) if m["role"] == "user"]
    assert sent(prompts[-1]) == "The review did not pass. Fix these issues:\n- no header row\n- newline='' missing on open()"


def test_the_flow_passes_whatever_the_review_found_to_the_coder(tmp_path: Path) -> None:
    with FakeAnthropic() as fake:
        fake.script(reply(Text("1. Write it.")), reply(Text("def f(): pass")),
                    reply(Text('{"passed": false, "issues": ["f returns nothing", "no tests"]}')),
                    reply(Text("def f(): return 1")), reply(Text('{"passed": true, "issues": []}')))
        kernel = make_kernel(tmp_path, fake)
        try:
            snap = anyio.run(kernel.run, kernel.load_flow(FLOW), {"feature": "f"})
        finally:
            kernel.close()
        assert snap.status == "completed" and snap.loopCounters == {"reviewer->coder": 1}
        first, again = [r.body for r in fake.requests if sent(r.body["messages"][0])["content"] == "Implement: 1. Write it."]
    assert len(first["messages"]) == 1  # the first pass: the plan
    last = sent(again["messages"][-1])
    assert last == {"role": "user", "content": "The review did not pass. Fix these issues:\n- f returns nothing\n- no tests"}
