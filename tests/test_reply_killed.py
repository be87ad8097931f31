"""A `reply` killed after it printed "accepted" leaves its answer stored and not delivered: a second
reply is refused (recorded) with the command that continues, `show` says to resume, and `resume`
delivers the stored answer once."""

from __future__ import annotations

import json
from pathlib import Path

from flowkernel.run.kernel import Kernel

from tests.crash_support import EXAMPLES, FIXTURES, KILLED, conversation, flowkernel
from tests.server_support import serving

PLUGIN = ("flowkernel.examples.research_tools",)
QUESTION = "question=Which database should our desktop app use?"
ANSWER = "Mostly record transactions."


def waiting_research_run(db: Path) -> tuple[str, str]:
    """The research example up to its question: (run id, the waiting node run)."""
    done = flowkernel(db, "run", str(EXAMPLES / "research.json"), "--input", QUESTION, "--fixtures",
                      str(FIXTURES / "research"), "--json", plugins=PLUGIN)
    assert done.returncode == 3, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    return events[0]["flowRunId"], next(e["runId"] for e in events if e["type"] == "node:waiting")


def killed_after_accepted(db: Path, run_id: str, node_run: str) -> None:
    """`reply`, killed (SIGKILL) at its first write after it printed that the run accepted the reply:
    the one that continues the run."""
    done = flowkernel(db, "reply", run_id, "--to", node_run, ANSWER, plugins=PLUGIN, crash="before-commit:2")
    assert done.returncode == KILLED, done.stderr
    assert f"flowkernel: reply accepted by run {run_id}" in done.stderr


def answers_given(db: Path, run_id: str) -> int:
    """How many times the agent was given the answer, in its stored conversation."""
    kernel = Kernel(str(db))
    try:
        return sum(1 for m in conversation(kernel, run_id, "researcher") if m["role"] == "user"
                   for block in (m["content"] if isinstance(m["content"], list) else [m["content"]])
                   if ANSWER in json.dumps(block))
    finally:
        kernel.close()


def test_a_reply_killed_after_accepted_is_delivered_once_by_resume(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    run_id, node_run = waiting_research_run(db)
    killed_after_accepted(db, run_id, node_run)

    shown = flowkernel(db, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"flowkernel resume {run_id}" in shown.stdout
    assert f"flowkernel reply {run_id} --to {node_run}" not in shown.stdout  # the hint that answered twice

    again = flowkernel(db, "reply", run_id, "--to", node_run, ANSWER, plugins=PLUGIN)
    assert again.returncode == 2, again.stderr
    [line] = again.stderr.strip().splitlines()
    assert "already holds a reply, accepted at event" in line and f"`flowkernel resume {run_id}` delivers it" in line

    resumed = flowkernel(db, "resume", run_id, plugins=PLUGIN)
    assert resumed.returncode == 0, resumed.stderr
    kernel = Kernel(str(db))
    try:
        assert kernel.snapshot(run_id).status == "completed"
        received = [(e.command, e.accepted) for e in kernel.events(run_id) if e.type == "command:received"]
        assert received == [("reply", True), ("reply", False), ("resume", True)]
    finally:
        kernel.close()
    assert answers_given(db, run_id) == 1


def test_the_http_api_refuses_a_second_reply_with_409_naming_resume(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    run_id, node_run = waiting_research_run(db)
    killed_after_accepted(db, run_id, node_run)
    with serving(str(db)) as live, live.client() as http:
        answer = http.post(f"/api/v1/runs/{run_id}/reply", json={"to": node_run, "content": ANSWER})
        assert answer.status_code == 409, answer.text
        assert f"`flowkernel resume {run_id}` delivers it" in answer.json()["detail"]
        assert live.kernel.snapshot(run_id).inbox[node_run][0].content == ANSWER
        assert len(live.kernel.snapshot(run_id).inbox[node_run]) == 1
