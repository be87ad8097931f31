"""NaN and Infinity: JSON has neither, and msgspec would store them as ``null`` without a word.

WHEN a node's output holds NaN or ±Infinity (small, or large enough to be packed into blobs, or packed
from blocks remembered from an earlier attempt) THEN the node fails with ``invalid_output`` naming the
JSON path of the value. WHEN a node patches the state with one THEN the node fails saying where. WHEN run
input or a command holds one (through the Python API, the CLI or the HTTP API) THEN it is refused naming
where, and nothing is stored.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.events import NodeError
from flowkernel.core.nonfinite import find_non_finite, loads_strict
from flowkernel.errors import RunInputError
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore

from tests.helpers import flow, py, registry, run_flow
from tests.server_support import serving
from tests.test_server import assert_problem

NAN, INF = float("nan"), float("inf")


def _errors(events: list[Any]) -> list[NodeError]:
    return [e for e in events if isinstance(e, NodeError)]


def test_find_non_finite_names_the_first_in_document_order_as_a_json_path() -> None:
    assert find_non_finite({"scores": [1.0, 2.0, NAN], "z": INF}) == ("$.scores[2]", pytest.approx(NAN, nan_ok=True))
    assert find_non_finite({"a b": [{"x": -INF}]})[0] == '$["a b"][0].x'  # type: ignore[index]
    assert find_non_finite([1, None, "NaN", True, {"k": 1.5}]) is None
    with pytest.raises(ValueError, match="NaN is not JSON"):
        loads_strict('{"a": NaN}')
    with pytest.raises(ValueError, match="Infinity"):
        loads_strict("[1e999]")
    assert loads_strict('{"a": [1.5, null]}') == {"a": [1.5, None]}


def test_an_output_holding_nan_fails_the_node_naming_the_path_instead_of_storing_null() -> None:
    reg = registry(scores=lambda: {"scores": [1.0, 2.0, NAN], "fine": None})
    _, snap, events = run_flow(flow([py("a", "scores")]), reg=reg)
    assert snap.status == "failed"
    (err,) = _errors(events)
    assert err.errorType == "invalid_output"
    assert "$.scores[2] is NaN" in err.message, err.message
    assert "a" not in snap.outputs


def test_a_large_packed_output_holding_infinity_fails_the_node_naming_the_path() -> None:
    rows = [{"i": i, "v": None} for i in range(300)] + [{"i": 300, "v": -INF}]
    _, _, events = run_flow(flow([py("a", "rows")]), reg=registry(rows=lambda: {"rows": rows}))
    (err,) = _errors(events)
    assert err.errorType == "invalid_output"
    assert "$.rows[300].v is -Infinity" in err.message, err.message


def test_a_second_node_returning_the_same_nan_list_fails_too_though_its_blocks_are_remembered() -> None:
    """The packer knows a block again by its items' identity, without encoding it: it must remember that
    the block held a null too, or the second node would store the NaN as null."""
    same = [float(i) for i in range(3)] + [NAN] + [float(i) for i in range(100)]
    keep_going = {"continueOnError": True}
    document = flow([py("a", "same", policy=keep_going), py("b", "same", policy=keep_going)],
                    [{"from": "a", "to": "b"}])
    _, snap, events = run_flow(document, reg=registry(same=lambda: same))
    errors = _errors(events)
    assert [e.nodeId for e in errors] == ["a", "b"]
    assert all(e.errorType == "invalid_output" and "$[3] is NaN" in e.message for e in errors), errors
    assert "b" not in snap.outputs


class _PatchesNaN:
    name = "test.patch_nan"

    async def run(self, ctx: Any) -> Any:
        ctx.patch_state("set", "stats", {"mean": 1.0, "spread": [0.5, INF]})
        return "unreachable"


def test_a_state_patch_holding_infinity_fails_the_node_naming_where() -> None:
    reg = registry()
    reg.add_node_type(_PatchesNaN)
    _, snap, events = run_flow(flow([{"id": "a", "type": "test.patch_nan", "input": {}}]), reg=reg)
    (err,) = _errors(events)
    assert "state.stats" in err.message and "$.spread[1] is Infinity" in err.message, err.message
    assert snap.state == {}
    assert not any(e.type == "state:patch" for e in events)


def test_run_input_holding_nan_is_refused_through_the_python_api() -> None:
    kernel = Kernel(MemoryStore())
    compiled = kernel.compile(flow([{"id": "a", "type": "noop", "input": {}}], name="in"))
    with pytest.raises(RunInputError, match=r"input\.v\[1\] is NaN"):
        kernel.create_run(compiled, {"v": [1, NAN]})
    assert kernel.runs() == []


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=120)


ASK_NUMBER = {"name": "ask-number", "nodes": [
    {"id": "q", "type": "human.input", "input": {"prompt": "How much?", "schema": {"type": "number"}}}]}
STATE = {"name": "to-state", "nodes": [{"id": "a", "type": "state.set",
                                        "input": {"path": "x", "value": "{{ flow.input.v }}"}}]}


def test_cli_refuses_nan_and_infinity_in_inputs_and_replies_in_one_line(tmp_path: Path,
                                                                           clean_env: dict[str, str]) -> None:
    (tmp_path / "state.json").write_text(json.dumps(STATE))
    (tmp_path / "ask.json").write_text(json.dumps(ASK_NUMBER))
    (tmp_path / "in.json").write_text('{"v": [1, NaN]}')
    for args, expected in ((["--input", "v=NaN"], "--input v=…: NaN is not JSON"),
                           (["--input", "v=[1e999]"], "--input v=…: 1e999 is too large"),
                           (["--input-json", "in.json"], "--input-json in.json: not valid JSON: NaN is not JSON")):
        res = fk("run", "state.json", "--db", "runs.db", *args, cwd=tmp_path, env=clean_env)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip() == f"flowkernel: {res.stderr.strip().removeprefix('flowkernel: ')}"
        assert expected in res.stderr and "Traceback" not in res.stderr
    res = fk("run", "ask.json", "--db", "runs.db", "--json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 3, res.stderr
    start = json.loads(res.stdout.splitlines()[0])
    run_id = start["flowRunId"]
    waiting = next(json.loads(line) for line in res.stdout.splitlines() if '"node:waiting"' in line)
    for typed in ("NaN", "Infinity", "1e999"):
        refused = fk("reply", run_id, "--to", waiting["runId"], typed, "--db", "runs.db", cwd=tmp_path, env=clean_env)
        assert refused.returncode == 2, refused.stderr
        assert "does not match the schema of q" in refused.stderr and "Traceback" not in refused.stderr
    replied = fk("reply", run_id, "--to", waiting["runId"], "2.5", "--db", "runs.db", "--json", cwd=tmp_path,
                 env=clean_env)
    assert replied.returncode == 0, replied.stderr
    shown = json.loads(fk("show", run_id, "--db", "runs.db", "--json", cwd=tmp_path, env=clean_env).stdout)
    assert shown["snapshot"]["outputs"]["q"] == 2.5


def test_http_refuses_nan_in_run_input_and_in_a_reply_as_422(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    with serving(db) as live, live.client() as http:
        body = '{"flowDocument": ' + json.dumps(STATE) + ', "input": {"v": [1, NaN]}}'
        problem = assert_problem(http.post("/api/v1/runs", content=body,
                                           headers={"content-type": "application/json"}), 422)
        assert "input.v[1] is NaN" in problem["detail"], problem
        assert http.get("/api/v1/runs").json()["items"] == []
        run_id = live.kernel.create_run(live.kernel.compile(ASK_NUMBER))
        snap = anyio.run(live.kernel.execute, run_id)  # here, as `flowkernel run` would: the run then waits
        node_run = snap.waiting["q"].runId
        problem = assert_problem(http.post(f"/api/v1/runs/{run_id}/reply",
                                           content='{"to": "' + node_run + '", "content": Infinity}',
                                           headers={"content-type": "application/json"}), 422)
        assert "is Infinity" in problem["detail"], problem
        assert live.kernel.snapshot(run_id).status == "waiting"
