"""A real Claude Code session (``claude_agent_sdk.query`` and the CLI its wheel bundles) against the
fake Messages API, mirrored into a SQLite store through ``RunSessionStore``.

WHEN the fake scripts a Write tool_use and then a text answer THEN the CLI writes the file in the
session's folder and the store holds the transcript. WHEN the session is resumed with a new message
from another home and config folder (the first one deleted) THEN it continues from the store alone:
the model sees the whole history once, then the new message.

Not skipped: if the CLI cannot start here the test fails and says why (``.[test]`` installs it).
The run is a hand-made row (the session is driven here, not by a flow): the replay audit is skipped.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from flowkernel.agents.session_store import RunSessionStore
from flowkernel.store.base import RunRecord
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.claude_code import cli_problem, hermetic_session
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

pytestmark = pytest.mark.no_audit

PROMPT = "Write hello.txt saying hello"


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"]


async def _run(prompt: str, options: Any, stderr: list[str]) -> Any:
    from claude_agent_sdk import ResultMessage, query

    results = []
    try:
        async for message in query(prompt=prompt, options=options):
            if isinstance(message, ResultMessage):
                results.append(message)
    except Exception as exc:
        raise AssertionError(f"the session failed: {exc!r}; CLI stderr:\n" + "".join(stderr)[-3000:]) from exc
    [result] = results
    assert result.subtype == "success" and not result.is_error, (result, "".join(stderr)[-3000:])
    return result


async def test_a_session_is_mirrored_into_the_store_and_resumes_from_it_on_a_fresh_home(tmp_path: Path) -> None:
    from claude_agent_sdk import project_key_for_directory

    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    store.create_run(RunRecord(runId="run_cc", flowName="f", flowHash="h", status="running", seq=0, input={},
                               createdAt=1000, updatedAt=1000), [], b"{}", document="{}")
    work = tmp_path / "work"
    work.mkdir()
    session_id = str(uuid.uuid4())
    key = (project_key_for_directory(str(work)), session_id)
    with FakeAnthropic() as fake:
        fake.script(reply(ToolUse("Write", {"file_path": str(work / "hello.txt"), "content": "hello\n"}, id="toolu_w1")),
                    reply(Text("Wrote hello.txt.")),
                    reply(Text("Still here.")))
        with hermetic_session(fake.base_url) as first:
            assert (problem := cli_problem(first.env())) is None, problem
            options = first.options(cwd=work, allowed_tools=["Write"], session_id=session_id,
                                    session_store=RunSessionStore(store, "run_cc"), session_store_flush="eager")
            result = await _run(PROMPT, options, first.stderr)
            assert result.result == "Wrote hello.txt." and result.session_id == session_id
        assert not first.home.exists()  # the first worker's home is gone: only the store is left
        assert (work / "hello.txt").read_text() == "hello\n"
        stored = store.load_session_entries(*key) or []
        kinds = [e["type"] for e in stored]
        assert kinds.count("user") >= 2 and kinds.count("assistant") >= 2, kinds
        assert "toolu_w1" in json.dumps(stored) and "Wrote hello.txt." in json.dumps(stored)
        [listed] = store.list_sessions(run_id="run_cc")
        assert listed.sessionId == session_id and listed.summary is not None
        assert PROMPT in listed.summary["first_prompt"]

        before = fake.request_count
        other = SqliteStore(db)  # another worker's connection
        with hermetic_session(fake.base_url) as second:
            options = second.options(cwd=work, allowed_tools=["Write"], resume=session_id,
                                     session_store=RunSessionStore(other, "run_cc"), session_store_flush="eager")
            result = await _run("And now?", options, second.stderr)
            assert result.result == "Still here." and result.session_id == session_id
            assert not list((second.home / ".claude").glob(f"projects/*/{session_id}.jsonl"))
        [resumed] = fake.requests[before:]
        messages = resumed.body["messages"]
        said = [t for m in messages if m["role"] == "user" for t in _texts(m["content"])]
        assert sum(PROMPT in t for t in said) == 1  # the first prompt once, as history
        assert said[-1] == "And now?"
        flat = json.dumps(messages)
        assert "toolu_w1" in flat and '"tool_result"' in flat and "Wrote hello.txt." in flat
        after = other.load_session_entries(*key) or []
        assert after[:len(stored)] == stored and len(after) > len(stored)
        uuids = [e["uuid"] for e in after if "uuid" in e]
        assert len(uuids) == len(set(uuids))
        other.close()
    store.close()
