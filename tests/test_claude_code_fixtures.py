"""``claude.code`` fixtures: ``flowkernel record`` writes a session's SDK message stream per call (the real
CLI against the fake API), and ``run --fixtures`` replays it without starting the CLI or calling a
model, checking the recorded prompt and options against the live ones (a diff on mismatch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_code_support import cli_env, code_flow, require_cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        require_cli(f)
        yield f


def fk(*args: str, cwd: Path, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWKERNEL_", "ANTHROPIC_"))}
    env.update({"PYTHONPATH": str(ROOT), "NO_COLOR": "1", **extra})
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_recorded_session_replays_offline_and_a_changed_prompt_is_refused_with_a_diff(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("Bash", {"command": "echo from the tool"}, id="toolu_1")),
                reply(Text("The tool said hello.")))
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(code_flow(prompt="Say hello through Bash", allowedTools=["Bash"])))
    recorded = fk("record", "--flow", str(flow), "--output", str(tmp_path / "fx"), cwd=tmp_path, extra=cli_env(fake))
    assert recorded.returncode == 0, recorded.stderr
    document = json.loads((tmp_path / "fx" / "code.json").read_text())
    [call] = document["calls"]
    assert call["input"]["prompt"] == "Say hello through Bash"
    assert call["input"]["options"]["allowedTools"] == ["Bash"]
    assert [m["type"] for m in call["messages"]][-1] == "result"
    requests = fake.request_count

    # Replay: no model (nothing listens at the base URL), no CLI (a wrong one would fail to start).
    offline = {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "ANTHROPIC_API_KEY": "unused"}
    replayed = fk("run", str(flow), "--fixtures", str(tmp_path / "fx"), "--json", "--db", str(tmp_path / "r.db"),
                  cwd=tmp_path, extra=offline)
    assert replayed.returncode == 0, replayed.stderr
    events = [json.loads(line) for line in replayed.stdout.splitlines() if line.startswith("{")]
    [done] = [e for e in events if e["type"] == "node:complete"]
    assert done["output"]["text"] == "The tool said hello." and done["output"]["subtype"] == "success"
    [tool] = [e for e in events if e["type"] == "agent:tool"]
    assert tool["toolName"] == "Bash" and "from the tool" in tool["toolOutput"]
    assert fake.request_count == requests

    flow.write_text(json.dumps(code_flow(prompt="Say goodbye through Bash", allowedTools=["Bash"])))
    changed = fk("run", str(flow), "--fixtures", str(tmp_path / "fx"), "--db", str(tmp_path / "r2.db"),
                 cwd=tmp_path, extra=offline)
    assert changed.returncode == 1, changed.stderr
    assert 'prompt: recorded "Say hello through Bash", live "Say goodbye through Bash"' in changed.stderr + changed.stdout
