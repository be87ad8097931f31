"""``validate`` (and ``run``, which validates first) catches what a run would fail on in the child flows a
flow calls by a path written in the file: a missing file, a child's own problems, and theirs, each at
the calling node's ``input.flow`` with the child's path; every problem of the tree at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = str(Path(sys.executable).with_name("flowkernel"))


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=60)


def write(path: Path, nodes: list[dict[str, Any]], **extra: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": path.stem, "nodes": nodes, **extra}))
    return path


def call(node_id: str, target: str) -> dict[str, Any]:
    return {"id": node_id, "type": "flow.call", "input": {"flow": target}}


def noop(node_id: str) -> dict[str, Any]:
    return {"id": node_id, "type": "noop", "input": {}}


def test_a_flow_call_of_a_missing_file_fails_validation_at_its_input_flow(tmp_path: Path,
                                                                          clean_env: dict[str, str]) -> None:
    write(tmp_path / "parent.json", [noop("first"), call("child", "missing.json")])
    res = fk("validate", "parent.json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr == ("flowkernel: parent.json: 1 problem\n"
                          "  $.nodes[1].input.flow: child flow missing.json: no such flow file\n")


def test_child_flows_are_validated_recursively_with_the_childs_path_in_each_problem(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    write(tmp_path / "parent.json", [call("c", "sub/child.json")])
    write(tmp_path / "sub" / "child.json", [{"id": "x", "type": "nosuch", "input": {}}, call("g", "grand.json")])
    write(tmp_path / "sub" / "grand.json", [noop("a"), {"id": "b", "type": "transform", "input": {"expr": "1 +"}}])
    res = fk("validate", "parent.json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert lines[0] == "flowkernel: parent.json: 2 problems"
    assert lines[1].startswith("  $.nodes[0].input.flow: child flow sub/child.json: $.nodes[0].type: unknown node "
                               "type 'nosuch'")
    assert lines[2].startswith("  $.nodes[0].input.flow: child flow sub/child.json: $.nodes[1].input.flow: child "
                               "flow sub/grand.json: $.nodes[1].input.expr: JSONata does not parse")
    assert len(lines) == 3


def test_flows_that_call_each_other_validate_once_each(tmp_path: Path, clean_env: dict[str, str]) -> None:
    done = {"when": "$exists(flow.input.stop)"}
    write(tmp_path / "ping.json", [{**call("pong", "pong.json"), **done}])
    write(tmp_path / "pong.json", [{**call("ping", "ping.json"), **done}, call("me", "pong.json")])
    res = fk("validate", "ping.json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ping.json: ok — flow 'ping', 1 node, 0 edges\n"

    write(tmp_path / "pong.json", [call("ping", "ping.json"), {"id": "bad", "type": "noop", "input": {},
                                                               "policy": {"retry": {"maxAttempts": 0}}}])
    res = fk("validate", "ping.json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2
    assert res.stderr == ("flowkernel: ping.json: 1 problem\n"
                          "  $.nodes[0].input.flow: child flow pong.json: $.nodes[1].policy.retry.maxAttempts: "
                          "Input should be greater than or equal to 1\n")


def test_every_problem_is_reported_at_once_with_a_duplicate_node_id(tmp_path: Path,
                                                                    clean_env: dict[str, str]) -> None:
    write(tmp_path / "flow.json", [noop("a"), noop("a"), call("c", "missing.json"),
                                   {"id": "t", "type": "transfrom", "input": {}}],
          edges=[{"from": "a", "to": "nowhere"}])
    res = fk("validate", "flow.json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        "flowkernel: flow.json: 4 problems",
        "  $.nodes[1].id: duplicate node id 'a' (first at $.nodes[0])",
        "  $.nodes[3].type: unknown node type 'transfrom'; did you mean 'transform'? (known types: claude.agent, "
        "claude.code, flow.call, human.input, noop, python, state.set, transform)",
        "  $.edges[0].to: no node with id 'nowhere'",
        "  $.nodes[2].input.flow: child flow missing.json: no such flow file",
    ]


def test_run_refuses_a_flow_whose_child_is_missing_before_anything_is_stored(tmp_path: Path,
                                                                             clean_env: dict[str, str]) -> None:
    write(tmp_path / "parent.json", [noop("first"), call("child", "missing.json")])
    res = fk("run", "parent.json", "--db", "runs.db", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.splitlines()[1:] == ["  $.nodes[1].input.flow: child flow missing.json: no such flow file"]
    listed = fk("runs", "--db", "runs.db", "--json", cwd=tmp_path, env=clean_env)
    assert listed.stdout == ""


def test_a_grandchild_broken_after_its_tree_was_validated_is_found(tmp_path: Path,
                                                                   clean_env: dict[str, str]) -> None:
    env = {**clean_env, "FLOWKERNEL_CACHE_DIR": str(tmp_path / "cache")}
    write(tmp_path / "parent.json", [call("c", "child.json")])
    write(tmp_path / "child.json", [call("g", "grand.json")])
    grand = write(tmp_path / "grand.json", [noop("a")])
    assert fk("validate", "parent.json", cwd=tmp_path, env=env).returncode == 0
    grand.unlink()
    res = fk("validate", "parent.json", cwd=tmp_path, env=env)
    assert res.returncode == 2
    assert res.stderr.splitlines()[1] == ("  $.nodes[0].input.flow: child flow child.json: $.nodes[0].input.flow: "
                                          "child flow grand.json: no such flow file")
