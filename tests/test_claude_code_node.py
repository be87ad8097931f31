"""``claude.code`` as a node type: registered as a built-in agent type, its input validated with JSON
paths and did-you-mean, in ``flowkernel schema``, ``cwd`` confined to the flow's folders, and a clear
message naming the extra to install when the Claude Agent SDK is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flowkernel.errors import FlowValidationError
from flowkernel.plugins.builtins import BUILTIN_AGENT_TYPES, BUILTIN_NODE_TYPES
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore

from tests.claude_code_support import Recorded, code_flow, success

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLOWKERNEL_")}


def test_claude_code_is_a_built_in_agent_type_in_the_printed_schema(tmp_path: Path) -> None:
    assert BUILTIN_NODE_TYPES["claude.code"] == "flowkernel.nodes.claude_code:ClaudeCodeNode"
    assert "claude.code" in BUILTIN_AGENT_TYPES
    done = subprocess.run([sys.executable, "-m", "flowkernel.cli", "schema"], capture_output=True, text=True,
                          timeout=60, env=_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = json.dumps(json.loads(done.stdout))
    assert '"claude.code"' in printed and "allowedTools" in printed and "maxBudgetUsd" in printed


@pytest.mark.parametrize(("node_input", "path", "says"), [
    ({"prompt": "x", "allowedTool": ["Read"]}, "$.nodes[0].input.allowedTool", "did you mean 'allowedTools'?"),
    ({"cwd": "."}, "$.nodes[0].input.prompt", "is required"),
    ({"prompt": "x", "permissionMode": "yolo"}, "$.nodes[0].input.permissionMode", ""),
    ({"prompt": "x", "maxBudgetUsd": 0}, "$.nodes[0].input.maxBudgetUsd", ""),
    ({"prompt": "x", "allowedTools": ["Bash"], "ask": ["Bash"]}, "$.nodes[0].input.ask[0]", "allowedTools too"),
])
def test_a_bad_input_is_refused_with_its_json_path(node_input: dict[str, Any], path: str, says: str) -> None:
    with pytest.raises(FlowValidationError) as caught:
        Kernel(SqliteStore(":memory:")).compile(code_flow(**node_input))
    text = str(caught.value)
    assert path in text and says in text, text


def test_without_the_sdk_validation_names_the_extra_to_install(tmp_path: Path) -> None:
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(code_flow(prompt="Fix it")))
    hide = ("import sys; sys.modules['claude_agent_sdk'] = None; from flowkernel.cli import main; "
            "sys.argv = ['flowkernel', 'validate', sys.argv[1]]; sys.exit(main())")
    done = subprocess.run([sys.executable, "-c", hide, str(flow)], capture_output=True, text=True, timeout=60,
                          env=_env(), cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "pip install 'flowkernel[claude-code]'" in done.stderr and "$.nodes[0].input" in done.stderr
    assert "Traceback" not in done.stderr
    shown = subprocess.run([sys.executable, "-m", "flowkernel.cli", "validate", str(flow)], capture_output=True,
                           text=True, timeout=60, env=_env(), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr


async def test_a_cwd_outside_the_allowed_folders_fails_the_node_before_a_session_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWKERNEL_ALLOW_DIRS", str(tmp_path / "allowed"))
    (tmp_path / "allowed").mkdir()
    sessions = Recorded([success("done")])
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), services={"session_query": sessions})
    snap = await kernel.run(kernel.compile(code_flow(prompt="Fix it", cwd=str(tmp_path))), {})
    assert snap.status == "failed" and sessions.requests == []
    [error] = [e for e in kernel.events(snap.runId) if e.type == "node:error"]
    assert error.errorType == "invalid_input" and "outside" in error.message and "--allow-dir" in error.message

    inside = await kernel.run(kernel.compile(code_flow(prompt="Fix it", cwd=str(tmp_path / "allowed"))), {})
    assert inside.status == "completed", kernel.events(inside.runId)[-1]
    assert sessions.requests[0].options["cwd"] == str((tmp_path / "allowed").resolve())


def test_every_claude_code_input_key_is_documented() -> None:
    from flowkernel.nodes.claude_code.config import KEYS

    text = (ROOT / "docs" / "node-types.md").read_text(encoding="utf-8")
    section = text.split("\n## claude.code\n")[1].split("\n## ")[0]
    for key in KEYS:
        assert f"| `{key}` |" in section, f"claude.code input key {key} is not documented"
    assert "pip install 'flowkernel[claude-code]'" in section


def test_a_run_without_credentials_or_fixtures_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(code_flow(prompt="Fix it")))
    env = {k: v for k, v in _env().items() if not k.startswith("ANTHROPIC_")}
    env["HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "flowkernel.cli", "run", str(flow), "--db", str(tmp_path / "r.db")],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "node 'code' calls the Anthropic Messages API and no credentials are set" in done.stderr
    assert "nothing was run" in done.stderr and "Traceback" not in done.stderr
