"""The CLI as a user types it: real subprocesses, a real SQLite file in a temp directory."""

from __future__ import annotations

import hashlib
import json
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELLO = ROOT / "flows" / "hello.json"


def fk(*args: str, cwd: Path, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_run_hello_shows_a_live_view_and_stores_the_run_in_the_default_database(tmp_path: Path,
                                                                                clean_env: dict[str, str]) -> None:
    res = fk("run", str(HELLO), "--input", "name=Ada", cwd=tmp_path, env=clean_env)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "▶ hello" in out and "■ completed" in out
    assert "↻ review->draft" in out and "loop iteration 2" in out
    assert "shout[2]" in out and "fired with 3 items" in out
    assert "skipped (edge)" in out
    assert (tmp_path / ".flowkernel" / "runs.db").exists()

    runs = fk("runs", "--json", cwd=tmp_path, env=clean_env)
    [record] = [json.loads(line) for line in runs.stdout.splitlines()]
    assert record["status"] == "completed" and record["flowName"] == "hello"

    show = fk("show", record["runId"], "--json", cwd=tmp_path, env=clean_env)
    snap = json.loads(show.stdout)["snapshot"]
    assert snap["outputs"]["finish"] == {"greeting": "Hello, Ada! That is a short name.", "drafts": 3,
                                         "letters": "A-D-A!"}
    assert snap["loopCounters"] == {"review->draft": 2}
    readable = fk("show", record["runId"], cwd=tmp_path, env=clean_env)
    assert "status   completed" in readable.stdout and "finish" in readable.stdout


def test_run_json_prints_one_event_per_line_with_gapless_seq(tmp_path: Path, clean_env: dict[str, str]) -> None:
    res = fk("run", str(HELLO), "--input", "name=Grace", "--json", "--db", str(tmp_path / "r.db"),
             cwd=tmp_path, env=clean_env)
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "flow:start" and events[-1] == {**events[-1], "type": "flow:complete",
                                                                "status": "completed"}
    assert any(e["type"] == "node:skipped" and e["nodeId"] == "short" for e in events)  # long name branch
    stored = fk("events", events[0]["flowRunId"], "--json", "--db", str(tmp_path / "r.db"), cwd=tmp_path,
                env=clean_env)
    assert [json.loads(line) for line in stored.stdout.splitlines()] == events


def test_replay_re_emits_stored_events_and_rebuilds_the_snapshot(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = str(tmp_path / "r.db")
    run = fk("run", str(HELLO), "--input", "name=Al", "--json", "--db", db, cwd=tmp_path, env=clean_env)
    run_id = json.loads(run.stdout.splitlines()[0])["flowRunId"]
    before = digest(tmp_path / "r.db")
    replay = fk("replay", run_id, "--json", "--db", db, cwd=tmp_path, env=clean_env)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout == run.stdout
    assert "rebuilt snapshot matches the stored snapshot" in replay.stderr
    assert digest(tmp_path / "r.db") == before  # calls nothing, writes nothing
    readable = fk("replay", run_id, "--db", db, cwd=tmp_path, env=clean_env)
    assert "■ completed" in readable.stdout


def test_show_at_seq_prints_the_snapshot_as_it_was(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = str(tmp_path / "r.db")
    run = fk("run", str(HELLO), "--input", "name=Al", "--json", "--db", db, cwd=tmp_path, env=clean_env)
    events = [json.loads(line) for line in run.stdout.splitlines()]
    first_done = next(e["seq"] for e in events if e["type"] == "node:complete")
    show = fk("show", events[0]["flowRunId"], "--at", str(first_done), "--json", "--db", db, cwd=tmp_path,
              env=clean_env)
    snap = json.loads(show.stdout)["snapshot"]
    assert snap["seq"] == first_done
    assert snap["nodeStatus"]["greet"] == "done" and snap["nodeStatus"]["finish"] == "pending"


def test_validate_reports_all_problems_with_exit_code_2_and_no_traceback(tmp_path: Path,
                                                                         clean_env: dict[str, str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "b", "nodes": [{"id": "a", "type": "nope"}, {"id": "a", "type": "noop"}],
                               "edges": [{"from": "a", "to": "zz"}]}))
    res = fk("validate", str(bad), cwd=tmp_path, env=clean_env)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "3 problems" in res.stderr
    for fragment in ("$.nodes[0].type: unknown node type 'nope'", "$.nodes[1].id: duplicate node id 'a'",
                     "$.edges[0].to: no node with id 'zz'"):
        assert fragment in res.stderr
    ok = fk("validate", str(HELLO), cwd=tmp_path, env=clean_env)
    assert ok.returncode == 0 and "ok" in ok.stdout


def test_schema_prints_json_schema(tmp_path: Path, clean_env: dict[str, str]) -> None:
    res = fk("schema", cwd=tmp_path, env=clean_env)
    schema = json.loads(res.stdout)
    assert schema["title"] == "flowkernel flow" and "When" in schema["$defs"]


@pytest.mark.parametrize("case", ["missing", "directory", "not_json", "invalid", "bad_input", "bad_input_json"])
def test_bad_input_is_one_line_exit_2_and_leaves_an_existing_database_unchanged(
        case: str, tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "keep.db"
    seeded = fk("run", str(HELLO), "--input", "name=Ada", "--db", str(db), cwd=tmp_path, env=clean_env)
    assert seeded.returncode == 0
    fk("runs", "--db", str(db), cwd=tmp_path, env=clean_env)  # settle the WAL into the main file
    before = digest(db)
    flow = str(HELLO)
    extra: list[str] = ["--input", "name=Ada"]
    if case == "missing":
        flow = str(tmp_path / "nope.json")
    elif case == "directory":
        flow = str(tmp_path)
    elif case == "not_json":
        (tmp_path / "x.json").write_text("{nodes")
        flow = str(tmp_path / "x.json")
    elif case == "invalid":
        (tmp_path / "x.json").write_text(json.dumps({"name": "x", "nodes": [{"id": "a", "type": "zz"}]}))
        flow = str(tmp_path / "x.json")
    elif case == "bad_input":
        extra = ["--input", "nome=Ada"]
    elif case == "bad_input_json":
        (tmp_path / "in.json").write_text("[1]")
        extra = ["--input-json", str(tmp_path / "in.json")]
    res = fk("run", flow, *extra, "--db", str(db), cwd=tmp_path, env=clean_env)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("flowkernel: ")
    assert digest(db) == before
    runs = fk("runs", "--json", "--db", str(db), cwd=tmp_path, env=clean_env)
    assert len(runs.stdout.splitlines()) == 1


def test_input_not_matching_the_schema_names_the_field(tmp_path: Path, clean_env: dict[str, str]) -> None:
    res = fk("run", str(HELLO), "--input", "name=", "--db", str(tmp_path / "r.db"), cwd=tmp_path, env=clean_env)
    assert res.returncode == 2
    assert "input.name: '' should be non-empty" in res.stderr
    assert not (tmp_path / "r.db").exists()


def test_a_missing_required_input_says_how_to_give_it_and_the_hint_runs_as_printed(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = str(tmp_path / "r.db")
    res = fk("run", str(HELLO), "--db", db, cwd=tmp_path, env=clean_env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "input: 'name' is a required property; give it with --input name=" in res.stderr, res.stderr
    assert not Path(db).exists()
    hinted = res.stderr.split("give it with ", 1)[1].split(" (or --input-json FILE)", 1)[0]
    again = subprocess.run(f"{shlex.quote(sys.executable)} -m flowkernel.cli run {shlex.quote(str(HELLO))} "
                           f"--db {shlex.quote(db)} {hinted}", shell=True, cwd=tmp_path, env=clean_env, text=True,
                           capture_output=True, timeout=60)
    assert again.returncode == 0, again.stderr


def test_unknown_run_id_is_exit_2_with_a_hint(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "r.db"
    fk("run", str(HELLO), "--input", "name=Ada", "--db", str(db), cwd=tmp_path, env=clean_env)
    for cmd in (["show", "run_nope"], ["events", "run_nope"], ["resume", "run_nope"], ["replay", "run_nope"]):
        res = fk(*cmd, "--db", str(db), cwd=tmp_path, env=clean_env)
        assert res.returncode == 2, (cmd, res.stderr)
        assert "no run 'run_nope'" in res.stderr and "flowkernel runs" in res.stderr
        assert "Traceback" not in res.stderr


@pytest.mark.no_audit
def test_corrupt_database_is_a_clear_error_and_stays_byte_for_byte(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "corrupt.db"
    db.write_bytes(b"this is not a database" * 100)
    before = digest(db)
    for cmd in (["run", str(HELLO), "--input", "name=Ada"], ["runs"], ["show", "run_x"]):
        res = fk(*cmd, "--db", str(db), cwd=tmp_path, env=clean_env)
        assert res.returncode == 1, res.stderr
        assert "not a flowkernel database or corrupt" in res.stderr and "Traceback" not in res.stderr
        assert digest(db) == before


def test_locked_database_is_a_clear_error_and_stays_unchanged(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "locked.db"
    fk("run", str(HELLO), "--input", "name=Ada", "--db", str(db), cwd=tmp_path, env=clean_env)
    fk("runs", "--db", str(db), cwd=tmp_path, env=clean_env)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        before = digest(db)
        env = {**clean_env, "FLOWKERNEL_BUSY_TIMEOUT_MS": "200"}
        res = fk("run", str(HELLO), "--input", "name=Ada", "--db", str(db), cwd=tmp_path, env=env)
        assert res.returncode == 1
        assert "locked" in res.stderr and "Traceback" not in res.stderr
        assert digest(db) == before
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_help_lists_the_commands(tmp_path: Path, clean_env: dict[str, str]) -> None:
    res = fk("--help", cwd=tmp_path, env=clean_env)
    for cmd in ("validate", "schema", "run", "runs", "show", "events", "replay", "resume", "send", "reply",
                "pause", "abort", "retry"):
        assert cmd in res.stdout
