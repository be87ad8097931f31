"""A file nested too deeply for the JSON parser (valid JSON all the same) is refused with a plain reason
and where: the file, and the line and column where the nesting passes the bound; never a bare
``RecursionError``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flowkernel.core.nesting import DeepPoint, deep_point

SCRIPT = str(Path(sys.executable).with_name("flowkernel"))
# Valid JSON, deeper than Python's parser goes (its limit is the interpreter's recursion limit, which
# some libraries raise: what the file may nest cannot be left to it, so the messages name a bound).
DEEP = "[" * 100_000 + "]" * 100_000


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=60)


def test_a_deeply_nested_flow_is_refused_with_the_line_and_column_past_the_bound(tmp_path: Path,
                                                                                 clean_env: dict[str, str]) -> None:
    (tmp_path / "deep.json").write_text('{"name": "deep",\n "nodes": [{"id": "a", "type": "noop", "input": {"v": '
                                        + DEEP + "}}]}\n")
    # Levels 1-5 are the document, its nodes, the node, its input and the value's first array: the
    # 101st level opens with the 97th bracket of the value, whose first is at column 55 of line 2.
    for command in (["validate", "deep.json"], ["run", "deep.json", "--db", "runs.db"]):
        res = fk(*command, cwd=tmp_path, env=clean_env)
        assert res.returncode == 2
        assert res.stderr == ("flowkernel: deep.json:2:151: not a flow: arrays and objects nested more than 100 "
                              "levels deep (a flow may nest at most 100)\n")
    assert not (tmp_path / "runs.db").exists()


def test_a_deeply_nested_fixture_file_is_refused_with_the_file_line_and_column(tmp_path: Path,
                                                                               clean_env: dict[str, str]) -> None:
    (tmp_path / "ask.json").write_text(json.dumps({"name": "ask", "nodes": [
        {"id": "agent", "type": "claude.agent", "input": {"prompt": "Is it on?"}}]}))
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    (fixtures / "agent.json").write_text('{\n  "calls": [\n    {"input": {"x": ' + DEEP
                                         + '}, "output": {}, "events": []}\n  ]\n}\n')
    res = fk("run", "ask.json", "--fixtures", "fixtures", "--db", "runs.db", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2
    assert res.stderr == (f"flowkernel: {fixtures / 'agent.json'}: too deeply nested to read (line 3, column 117: "
                          "arrays and objects nested more than 100 levels deep)\n")


def test_the_point_is_found_past_strings_and_lines_and_falls_back_to_the_deepest() -> None:
    text = '{"a": "[[[[ not a bracket \\" [[[",\n  "b": [[\n[3]]]}'
    assert deep_point(text, 3) == DeepPoint(4, 3, 1, beyond=True)
    assert deep_point(text, 10) == DeepPoint(4, 3, 1, beyond=False)
    assert deep_point('"[[["', 1) is None
