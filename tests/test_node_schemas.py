"""Each node type's input has a JSON Schema: `flowkernel schema` gives it to editors (a oneOf keyed by
`type`), and `flowkernel validate` applies the same schema to every node of the type."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from flowkernel.core.compiler import compile_flow
from flowkernel.errors import FlowValidationError
from flowkernel.nodes.claude.config import INPUT_SCHEMA, KEYS
from flowkernel.plugins.builtins import BUILTIN_NODE_TYPES
from flowkernel.plugins.registry import default_registry

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted([*(ROOT / "flows").glob("*.json"), *(ROOT / "tests" / "flows").glob("*.json")])


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60)


def one_node(node: dict[str, Any]) -> dict[str, Any]:
    return {"name": "broken", "inputs": {"type": "object"}, "nodes": [node]}


def agent(**input: Any) -> dict[str, Any]:
    return {"id": "a", "type": "claude.agent", "input": input}


# (flow, the JSON path `validate` names): each must also fail the schema `flowkernel schema` prints.
BROKEN: dict[str, tuple[dict[str, Any], str]] = {
    "misspelled type": (one_node({"id": "s", "type": "state.sett", "input": {"path": "x", "value": 1}}),
                        "$.nodes[0].type"),
    "agent without prompt": (one_node(agent(model="claude-sonnet-4-5")), "$.nodes[0].input"),
    "agent without input": (one_node({"id": "a", "type": "claude.agent"}), "$.nodes[0].input"),
    "maxTurns as a string": (one_node(agent(prompt="hi", maxTurns="3")), "$.nodes[0].input.maxTurns"),
    "unknown agent key": (one_node(agent(prompt="hi", maxTurn=3)), "$.nodes[0].input.maxTurn"),
    "thinking budget as a string": (one_node(agent(prompt="hi", model="claude-sonnet-4-5",
                                                   thinking={"budgetTokens": "2000"})),
                                    "$.nodes[0].input.thinking.budgetTokens"),
    "session misspelled": (one_node(agent(prompt="hi", session="fresch")), "$.nodes[0].input.session"),
    "state.set key misspelled": (one_node({"id": "s", "type": "state.set",
                                           "input": {"path": "x", "vlaue": 1}}), "$.nodes[0].input.vlaue"),
    "state.set op": (one_node({"id": "s", "type": "state.set", "input": {"path": "x", "value": 1, "op": "pop"}}),
                     "$.nodes[0].input.op"),
    "transform without expr": (one_node({"id": "t", "type": "transform", "input": {"exp": "1"}}),
                               "$.nodes[0].input.expr"),
    "python args not an object": (one_node({"id": "p", "type": "python",
                                            "input": {"function": "f", "args": "x=1"}}), "$.nodes[0].input.args"),
    "human schema not an object": (one_node({"id": "h", "type": "human.input",
                                             "input": {"prompt": "?", "schema": ["string"]}}),
                                   "$.nodes[0].input.schema"),
    "flow.call without flow": (one_node({"id": "c", "type": "flow.call", "input": {"input": {}}}),
                               "$.nodes[0].input.flow"),
}


@pytest.fixture(scope="module")
def printed_schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLOWKERNEL_PLUGINS", None)
    res = fk("schema", cwd=tmp_path_factory.mktemp("schema"), env=env)
    assert res.returncode == 0, res.stderr
    schema: dict[str, Any] = json.loads(res.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def test_the_printed_schema_has_one_branch_per_node_type_keyed_by_type(printed_schema: dict[str, Any]) -> None:
    node = printed_schema["$defs"]["Node"]
    builtin = {"claude.agent", "claude.code", "flow.call", "human.input", "noop", "python", "state.set", "transform"}
    assert set(node["properties"]["type"]["enum"]) == builtin
    keyed = {b["properties"]["type"]["const"]: b for b in node["oneOf"]}
    assert set(keyed) == builtin
    for name in builtin:
        assert keyed[name]["properties"]["input"] == {"$ref": f"#/$defs/input:{name}"}
    assert keyed["claude.agent"]["required"] == ["input"] and "required" not in keyed["noop"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_example_flows_pass_the_printed_schema(printed_schema: dict[str, Any], path: Path) -> None:
    jsonschema.validate(json.loads(path.read_text()), printed_schema)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_flow_fails_the_printed_schema_and_validate_names_its_path(
        case: str, printed_schema: dict[str, Any], tmp_path: Path, clean_env: dict[str, str]) -> None:
    document, where = BROKEN[case]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, printed_schema)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(document))
    res = fk("validate", str(path), cwd=tmp_path, env=clean_env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{where}: " in res.stderr, res.stderr


def test_bindings_pass_where_a_value_may_come_from_one(printed_schema: dict[str, Any]) -> None:
    document = {"name": "bound", "inputs": {"type": "object"}, "nodes": [
        agent(prompt="{{ flow.input.q }}", maxTurns="{{ flow.input.turns }}", tools="{{ flow.input.tools }}",
              thinking={"type": "adaptive", "effort": "{{ flow.input.effort }}"}, cache="{{ flow.input.cache }}"),
        {"id": "p", "type": "python", "input": {"function": "{{ flow.input.fn }}", "args": "{{ flow.input.args }}"}},
    ]}
    jsonschema.validate(document, printed_schema)
    compile_flow(document, default_registry().node_types)


def test_every_agent_input_key_is_in_its_schema() -> None:
    assert set(INPUT_SCHEMA["properties"]) == KEYS
    # The built-in types (other tests register plugin types in this process's registry too).
    for name in BUILTIN_NODE_TYPES:
        node_type = default_registry().node_types[name]
        assert isinstance(getattr(node_type, "input_schema", None), dict), name
        jsonschema.Draft202012Validator.check_schema(node_type.input_schema)


def test_a_plugin_node_types_input_schema_is_printed_and_applied_by_validate(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    res = fk("--plugin", "tests.plugins.schemas", "schema", cwd=tmp_path, env=clean_env)
    schema = json.loads(res.stdout)
    assert schema["$defs"]["input:text.pad"]["required"] == ["text"]
    good = {"name": "pad", "nodes": [{"id": "p", "type": "text.pad", "input": {"text": "a", "width": 3}}]}
    bad = {"name": "pad", "nodes": [{"id": "p", "type": "text.pad", "input": {"width": "3", "colour": 1}}]}
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    for name, document in (("good", good), ("bad", bad)):
        (tmp_path / f"{name}.json").write_text(json.dumps(document))
    ok = fk("--plugin", "tests.plugins.schemas", "validate", "good.json", cwd=tmp_path, env=clean_env)
    assert ok.returncode == 0, ok.stderr
    res = fk("--plugin", "tests.plugins.schemas", "validate", "bad.json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    for line in ("$.nodes[0].input.text: is required",
                 "$.nodes[0].input.width: '3' is not of type 'integer' (or a {{ }} binding)",
                 "$.nodes[0].input.colour: unknown key; known keys: text, width"):
        assert line in res.stderr, res.stderr


def test_a_node_types_own_check_is_shown_where_it_and_the_schema_both_speak() -> None:
    with pytest.raises(FlowValidationError) as info:
        compile_flow(one_node(agent(prompt="hi", maxTurns="3")), default_registry().node_types)
    assert [str(p) for p in info.value.problems] == ["$.nodes[0].input.maxTurns: must be a positive integer"]
