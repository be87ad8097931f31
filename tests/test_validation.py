"""Flow files are validated before anything runs; every problem is reported with its JSON path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flowkernel.compiler import compile_flow, load_flow
from flowkernel.errors import FlowFileError, FlowValidationError
from flowkernel.flow import json_schema
from flowkernel.registry import default_registry

ROOT = Path(__file__).resolve().parent.parent
TYPES = default_registry().node_types


def problems(doc: object) -> list[str]:
    with pytest.raises(FlowValidationError) as info:
        compile_flow(doc, TYPES, source="f.json")
    return [str(p) for p in info.value.problems]


def test_every_problem_is_reported_at_once_with_its_json_path() -> None:
    doc = {
        "name": "bad", "colour": "blue",
        "nodes": [
            {"id": "a", "type": "transform", "input": {"expr": "1 +"}},
            {"id": "a", "type": "transform", "input": {"expr": "1"}},
            {"id": "state", "type": "noop"},
            {"id": "$x", "type": "noop"},
            {"id": "b", "type": "no.such.type"},
            {"id": "c", "type": "noop", "inptu": {}},
            {"id": "d", "type": "noop", "when": "a ="},
        ],
        "edges": [
            {"from": "a", "to": "ghost"},
            {"from": "a", "to": "b", "gate": "all"},
            {"from": "c", "to": "b", "gate": "any"},
            {"from": "b", "to": "c"},
            {"from": "c", "to": "b", "id": "dup"},
            {"from": "a", "to": "d", "id": "dup", "when": {"equals": {"var": "x"}}},
        ],
    }
    found = problems(doc)
    expected_fragments = [
        "$.colour: unknown key",
        "$.nodes[5].inptu: unknown key",
        "$.nodes[0].input.expr: JSONata does not parse",
        "$.nodes[1].id: duplicate node id 'a' (first at $.nodes[0])",
        "$.nodes[2].id: 'state' is reserved",
        "$.nodes[3].id: '$x' is reserved",
        "$.nodes[4].type: unknown node type 'no.such.type'",
        "$.nodes[6].when: JSONata does not parse",
        "$.edges[0].to: no node with id 'ghost'",
        "$.edges[2].gate: gate 'any' into 'b' conflicts with 'all' at $.edges[1].gate",
        "$.edges[5].id: duplicate edge id 'dup' (first at $.edges[4])",
        "cycle b -> c -> b does not pass through a loop edge",
    ]
    for fragment in expected_fragments:
        assert any(fragment in p for p in found), f"missing {fragment!r} in {found}"


def test_cycle_through_a_loop_edge_is_allowed() -> None:
    doc = {"name": "ok", "nodes": [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop"}],
           "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a", "maxIterations": 2}]}
    flow = compile_flow(doc, TYPES)
    assert flow.reset_sets["b->a"] == ("a", "b")


def test_structured_when_with_a_wrong_shape_names_its_path() -> None:
    doc = {"name": "w", "nodes": [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop"}],
           "edges": [{"from": "a", "to": "b", "when": {"and": [{"equals": {"var": "a"}}, {"maybe": 1}]}}]}
    found = problems(doc)
    assert any(p.startswith("$.edges[0].when.and[0].equals:") for p in found)
    assert any(p.startswith("$.edges[0].when.and[1]:") for p in found)


def test_node_type_checks_its_input_at_load() -> None:
    doc = {"name": "n", "nodes": [{"id": "t", "type": "transform", "input": {}},
                                   {"id": "s", "type": "state.set", "input": {"path": "x", "op": "pop", "value": 1}},
                                   {"id": "p", "type": "python", "input": {}}]}
    found = problems(doc)
    assert any(p.startswith("$.nodes[0].input.expr: transform needs") for p in found)
    assert any(p.startswith("$.nodes[1].input.op: unknown op 'pop'") for p in found)
    assert any(p.startswith("$.nodes[2].input.function:") for p in found)


def test_a_flow_that_is_not_an_object_is_refused() -> None:
    assert problems([1, 2]) == ["$: a flow must be a JSON object"]


def test_missing_directory_and_non_json_files_get_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(FlowFileError, match="no such flow file"):
        load_flow(tmp_path / "nope.json", TYPES)
    with pytest.raises(FlowFileError, match="is a directory"):
        load_flow(tmp_path, TYPES)
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",\n  nodes: []}')
    with pytest.raises(FlowFileError, match=r"bad.json:2:3: not valid JSON"):
        load_flow(bad, TYPES)


def test_schema_is_generated_from_the_models_and_validates_the_examples() -> None:
    import jsonschema

    schema = json_schema()
    assert schema["additionalProperties"] is False
    for path in sorted((ROOT / "flows").glob("*.json")):
        jsonschema.validate(json.loads(path.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x", "nodes": [], "bogus": 1}, schema)


def test_example_flows_validate() -> None:
    for path in sorted((ROOT / "flows").glob("*.json")):
        load_flow(path, TYPES)


def test_a_yaml_flow_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "hi.yaml"
    path.write_text("name: hi\nnodes:\n  - id: a\n    type: transform\n    input: {expr: \"1 + 1\"}\n")
    flow = load_flow(path, TYPES)
    assert flow.name == "hi" and list(flow.nodes) == ["a"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(FlowFileError, match="not valid YAML"):
        load_flow(bad, TYPES)
