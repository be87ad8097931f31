"""The event fields DESIGN §4 promises are always present, as a user reading `--json` output sees them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flowkernel.core.events import NodeComplete, NodeStart, decode, encode

ROOT = Path(__file__).resolve().parent.parent
HELLO = ROOT / "flows" / "hello.json"


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60)


def test_node_start_always_carries_attempt_and_node_complete_always_duration(tmp_path: Path,
                                                                              clean_env: dict[str, str]) -> None:
    res = fk("run", str(HELLO), "--input", "name=Ada", "--json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    starts = [e for e in events if e["type"] == "node:start"]
    completes = [e for e in events if e["type"] == "node:complete"]
    assert starts and completes
    assert all(e["attempt"] == 1 for e in starts)
    assert all(isinstance(e["durationMs"], int) and e["durationMs"] >= 0 for e in completes)


def test_state_set_outputs_the_item_it_appended_not_the_whole_list(tmp_path: Path,
                                                                   clean_env: dict[str, str]) -> None:
    res = fk("run", str(HELLO), "--input", "name=Ada", "--json", cwd=tmp_path, env=clean_env)
    drafts = [e["output"] for e in map(json.loads, res.stdout.splitlines())
              if e["type"] == "node:complete" and e["nodeId"] == "draft"]
    assert drafts == [f"draft {i}: Hello, Ada! That is a short name." for i in (1, 2, 3)]


def test_stored_events_written_without_attempt_or_duration_still_decode() -> None:
    start = decode(b'{"type":"node:start","seq":3,"nodeId":"a","runId":"nr_x"}')
    done = decode(b'{"type":"node:complete","seq":4,"nodeId":"a","runId":"nr_x","output":1}')
    assert isinstance(start, NodeStart) and start.attempt == 1
    assert isinstance(done, NodeComplete) and done.durationMs == 0
    # ... and are written with them from then on.
    assert b'"attempt":1' in encode(start) and b'"durationMs":0' in encode(done)
