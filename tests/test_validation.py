"""Flow files are validated before anything runs; every problem is reported with its JSON path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flowkernel.core.compiler import compile_flow
from flowkernel.core.flow import json_schema
from flowkernel.errors import FlowFileError, FlowValidationError
from flowkernel.flowfiles.load import load_flow
from flowkernel.plugins.registry import default_registry

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


# --- types where the contract says integer or boolean (strict: no "3", no "false") -----------------


def _two(**edge: object) -> dict[str, object]:
    return {"name": "x", "nodes": [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop"}],
            "edges": [{"from": "a", "to": "b", **edge}]}


@pytest.mark.parametrize(("where", "doc", "path"), [
    ("maxIterations string", _two(maxIterations="3"), "$.edges[0].maxIterations"),
    ("maxIterations boolean", _two(maxIterations=True), "$.edges[0].maxIterations"),
    ("timeoutMs string", {"name": "x", "nodes": [{"id": "a", "type": "noop", "policy": {"timeoutMs": "5"}}]},
     "$.nodes[0].policy.timeoutMs"),
    ("continueOnError string", {"name": "x", "nodes": [{"id": "a", "type": "noop",
                                                        "policy": {"continueOnError": "false"}}]},
     "$.nodes[0].policy.continueOnError"),
    ("maxAttempts string", {"name": "x", "nodes": [{"id": "a", "type": "noop",
                                                    "policy": {"retry": {"maxAttempts": "3"}}}]},
     "$.nodes[0].policy.retry.maxAttempts"),
    ("maxConcurrency boolean", {"name": "x", "maxConcurrency": True, "nodes": [{"id": "a", "type": "noop"}]},
     "$.maxConcurrency"),
    ("version boolean", {"name": "x", "version": True, "nodes": [{"id": "a", "type": "noop"}]}, "$.version"),
])
def test_a_string_or_boolean_where_the_contract_says_integer_or_boolean_is_an_error(
        where: str, doc: dict[str, object], path: str) -> None:
    found = problems(doc)
    assert len(found) == 1 and found[0].startswith(f"{path}: "), (where, found)


@pytest.mark.parametrize(("binding", "path"), [
    ({"nodes": [{"id": "a", "type": "noop", "input": {"v": "{{ $sum }}"}}]}, "$.nodes[0].input.v"),
    ({"nodes": [{"id": "a", "type": "noop", "input": {"v": "total: {{ $sum }}"}}]}, "$.nodes[0].input.v"),
    ({"nodes": [{"id": "a", "type": "noop", "input": {"v": "{{ function($x) { $x } }}"}}]}, "$.nodes[0].input.v"),
    ({"nodes": [{"id": "a", "type": "noop", "input": {"v": "{{ $substring(?, 1) }}"}}]}, "$.nodes[0].input.v"),
    ({"nodes": [{"id": "a", "type": "noop", "input": {"v": "{{ [1, $count] }}"}}]}, "$.nodes[0].input.v"),
    ({"nodes": [{"id": "a", "type": "transform", "input": {"expr": "$uppercase"}}]}, "$.nodes[0].input.expr"),
    ({"nodes": [{"id": "a", "type": "noop", "when": "$not"}]}, "$.nodes[0].when"),
    ({"nodes": [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop"}],
      "edges": [{"from": "a", "to": "b", "forEach": {"in": "{{ $keys }}"}}]}, "$.edges[0].forEach.in"),
])
def test_a_binding_that_yields_a_function_is_an_error(binding: dict[str, object], path: str) -> None:
    found = problems({"name": "x", **binding})
    assert any(p.startswith(f"{path}: ") and "is a function, not a value" in p for p in found), found


def test_bindings_that_call_functions_or_rebind_their_names_are_fine() -> None:
    doc = {"name": "x", "nodes": [
        {"id": "a", "type": "transform", "input": {"expr": "$sum([1, 2])"}},
        {"id": "b", "type": "noop", "input": {"v": "{{ ($sum := 3; $sum) }}",
                                              "w": "{{ $map([1, 2], function($x) { $x * a }) }}"}}]}
    compile_flow(doc, TYPES)


def test_a_function_value_at_run_time_fails_the_node_with_a_clear_error() -> None:
    # Statically unknowable (the expression is chosen at run time): the node fails, nothing crashes.
    from tests.helpers import run_flow

    doc = {"name": "x", "nodes": [{"id": "a", "type": "noop", "input": {"v": "{{ $eval('$sum') }}"}}]}
    _, snap, _ = run_flow(doc)
    assert snap.status == "failed" and "evaluates to a function, not a value" in snap.faults["a"].message


def test_inputs_and_state_schemas_must_be_valid_json_schemas() -> None:
    found = problems({"name": "x", "inputs": {"type": "objekt"}, "state": {"schema": {"required": "x"}},
                      "nodes": [{"id": "a", "type": "noop"}]})
    assert any(p.startswith("$.inputs.type: not a valid JSON Schema") for p in found), found
    assert any(p.startswith("$.state.schema.required: not a valid JSON Schema") for p in found), found
    assert problems({"name": "x", "inputs": [1], "nodes": [{"id": "a", "type": "noop"}]})[0].startswith("$.inputs")


def test_an_explicit_empty_edge_id_is_an_error_instead_of_dropping_an_edge() -> None:
    doc = {"name": "x", "nodes": [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop"}],
           "edges": [{"from": "a", "to": "b", "id": ""}, {"from": "a", "to": "b", "when": "false"}]}
    found = problems(doc)
    assert any(p.startswith("$.edges[0].id: ") for p in found), found


@pytest.mark.parametrize("key", ["forEach", "gate", "maxIterations"])
def test_an_edge_key_on_a_node_says_it_belongs_on_an_edge(key: str) -> None:
    value = {"forEach": {"in": "[1]"}, "gate": "any", "maxIterations": 2}[key]
    found = problems({"name": "x", "nodes": [{"id": "a", "type": "noop", key: value}]})
    assert found == [f"$.nodes[0].{key}: " + found[0].split(": ", 1)[1]]
    assert "belongs on an edge" in found[0] or "belongs on the edges" in found[0], found


def test_an_unknown_key_names_the_one_meant() -> None:
    found = problems({"name": "x", "nodes": [{"id": "a", "type": "noop"}], "edgse": []})
    assert found == ["$.edgse: unknown key; did you mean 'edges'?"]


def test_a_top_level_schema_key_is_allowed_and_ignored() -> None:
    doc = {"$schema": "./flowkernel.schema.json", "name": "x", "nodes": [{"id": "a", "type": "noop"}]}
    assert compile_flow(doc, TYPES).name == "x"


def test_a_thinking_budget_below_the_api_minimum_is_an_error() -> None:
    doc = {"name": "x", "nodes": [{"id": "a", "type": "claude.agent",
                                   "input": {"prompt": "p", "model": "claude-sonnet-4-6",
                                             "thinking": {"budgetTokens": 1023}}}]}
    found = problems(doc)
    assert len(found) == 1 and found[0].startswith("$.nodes[0].input.thinking.budgetTokens: "), found
    assert "at least 1024" in found[0]
    doc["nodes"][0]["input"]["thinking"] = {"budgetTokens": 1024}  # type: ignore[index]
    compile_flow(doc, TYPES)


# --- names a binding reads ----------------------------------------------------------------------


def _names(**inputs: object) -> list[str]:
    doc = {"name": "x", "inputs": {"type": "object"}, "nodes": [
        {"id": "join", "type": "noop", "input": {"items": [{"x": 1, "y": 2}], "text": "t"}},
        {"id": "each", "type": "noop", "input": inputs},
        {"id": "after", "type": "noop"}],
        "edges": [{"from": "join", "to": "each", "forEach": {"in": "join.items", "as": "task"}},
                  {"from": "each", "to": "after"}]}
    try:
        compile_flow(doc, TYPES)
    except FlowValidationError as exc:
        return [str(p) for p in exc.problems]
    return []


@pytest.mark.parametrize("binding", [
    "{{ join.text }}", "{{ flow.input.x }}", "{{ state.notes }}", "{{ task.title }}", "{{ $iteration }}",
    "{{ join.items[x = 1].y }}",                      # a predicate reads the item, not the context
    "{{ join.items.(x + y) }}",                        # so does a step in parentheses
    "{{ join.items{x: y} }}",                          # and group-by
    "{{ join.items^(x).y }}",                          # and sort terms
    "{{ $map(join.items, function($v) { $v.x & join.text }) }}",
    "{{ join.items.($$.join.text & x) }}",             # $$ is the context again
    "{{ ($p := join; $p.text) }}",                     # a name bound by :=
    "{{ $.join.text }}",
    "{{ `join`.text }}",
    "{{ $exists(flow.input) ? flow.input : {} }}",
])
def test_bindings_that_read_known_names_pass(binding: str) -> None:
    assert _names(v=binding) == []


@pytest.mark.parametrize(("binding", "name", "hint"), [
    ("{{ jion }}", "jion", "did you mean 'join'?"),
    ("Implement: {{ jion.text }}", "jion", "did you mean 'join'?"),
    ("{{ ghost.text }}", "ghost", "nodes: join, each, after"),
    ("{{ $map(join.items, function($v) { $v & jion }) }}", "jion", "did you mean"),  # a lambda sees the context
    ("{{ join.items.($$.jion) }}", "jion", "did you mean"),
    ("{{ ($p := jion; $p.text) }}", "jion", "did you mean"),
    ("{{ $count(stat.notes) }}", "stat", "did you mean 'state'?"),
    ("{{ tsak.title }}", "tsak", "did you mean 'task'?"),
])
def test_a_binding_that_reads_an_unknown_name_is_an_error(binding: str, name: str, hint: str) -> None:
    found = _names(v=binding)
    assert len(found) == 1 and found[0].startswith(f"$.nodes[1].input.v: unknown name {name!r}"), found
    assert hint in found[0]


def test_flow_has_only_input() -> None:
    found = _names(v="{{ flow.inputs.x }}")
    assert found == ["$.nodes[1].input.v: `flow.inputs` in 'flow.inputs.x': `flow` has only `input`; "
                     "did you mean `flow.input`?"]


def test_a_foreach_name_outside_its_target_node_is_an_error() -> None:
    doc = {"name": "x", "nodes": [
        {"id": "src", "type": "noop", "input": {"items": [1]}},
        {"id": "each", "type": "noop", "input": {"v": "{{ task }}"}, "when": "task != 0"},
        {"id": "after", "type": "transform", "input": {"expr": "task"}}],
        "edges": [{"from": "src", "to": "each", "forEach": {"in": "src.items", "as": "task"}},
                  {"from": "each", "to": "after", "when": "task"}]}
    found = problems(doc)
    assert sorted(p.split(":")[0] for p in found) == ["$.edges[1].when", "$.nodes[2].input.expr"], found
    assert all("the forEach item name of node 'each'" in p for p in found)


def test_when_forms_and_foreach_in_are_checked_too() -> None:
    doc = {"name": "x", "nodes": [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop"}],
           "edges": [{"from": "a", "to": "b", "when": {"and": [{"equals": {"var": "aa.ok", "value": 1}}]},
                      "forEach": {"in": "{{ bb }}"}}]}
    found = problems(doc)
    assert any(p.startswith("$.edges[0].when.and[0].equals.var: unknown name 'aa'") for p in found), found
    assert any(p.startswith("$.edges[0].forEach.in: unknown name 'bb'") for p in found), found


# --- odd documents: one-line errors, never a traceback ----------------------------------------------


def _cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "FLOWKERNEL_PLUGINS"}
    full.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], text=True, capture_output=True,
                          env=full, cwd=cwd, timeout=60)


def _validate_cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _cli(path.parent, *args, "validate", str(path))


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("type-list", '{"name": "x", "nodes": [{"id": "a", "type": []}]}', "$.nodes[0].type: "),
    ("type-object", '{"name": "x", "nodes": [{"id": {}, "type": {}}]}', "$.nodes[0].type: "),
    ("brackets", "[" * 100_000 + "]" * 100_000, "brackets.json:1:101: not a flow: arrays and objects nested more "
                                                 "than 100 levels deep"),
    ("deep-input", '{"name": "x", "nodes": [{"id": "a", "type": "noop", "input": {"v": '
     + "[" * 200 + "]" * 200 + "}}]}", "nested more than 100 levels deep"),
    ("surrogate-name", '{"name": "\\ud800", "nodes": [{"id": "a", "type": "noop"}]}',
     "$.name: contains a lone surrogate"),
    ("surrogate-input", '{"name": "x", "nodes": [{"id": "a", "type": "noop", "input": {"v": "\\udfff"}}]}',
     "$.nodes[0].input.v: contains a lone surrogate"),
    ("surrogate-key", '{"name": "x", "nodes": [{"id": "a", "type": "noop", "input": {"\\ud800": 1}}]}',
     "$.nodes[0].input: a key contains a lone surrogate"),
    ("nan", '{"name": "x", "nodes": [{"id": "a", "type": "noop", "input": {"v": NaN}}]}', "NaN is not a JSON number"),
    ("huge-int", '{"name": "x", "nodes": [{"id": "a", "type": "noop", "input": {"v": ' + "9" * 5000 + "}}]}",
     "not valid JSON"),
    ("not-utf8", b'{"name": "\xff"}'.decode("latin-1"), "not UTF-8"),
])
def test_odd_documents_get_a_short_error_and_exit_2_never_a_traceback(tmp_path: Path, name: str, text: str,
                                                                      expected: str) -> None:
    path = tmp_path / f"{name}.json"
    path.write_bytes(text.encode("latin-1") if name == "not-utf8" else text.encode())
    for command in (["validate", str(path)], ["run", str(path), "--db", str(tmp_path / "runs.db")]):
        res = _cli(tmp_path, *command)
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr and expected in res.stderr, res.stderr
        assert len(res.stderr.splitlines()) <= 3, res.stderr
    assert not (tmp_path / "runs.db").exists()  # refused before the store is touched


def test_a_yaml_flow_with_aliases_is_refused_before_it_can_expand(tmp_path: Path) -> None:
    lines = ['name: x', 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
              for i in range(1, 30)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nnodes: []\n")
    res = _validate_cli(path)
    assert res.returncode == 2 and "bomb.yaml:3:" in res.stderr and "aliases" in res.stderr, res.stderr


def test_a_malformed_yaml_file_never_shows_its_text(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\napi_key: 'sk-SECRET-123\nnodes: [\n")
    res = _validate_cli(path)
    assert res.returncode == 2 and "bad.yaml:" in res.stderr and "not valid YAML" in res.stderr, res.stderr
    assert "SECRET" not in res.stderr and "api_key" not in res.stderr


def test_validate_and_run_report_a_misspelt_name_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"name": "typo", "nodes": [
        {"id": "join", "type": "transform", "input": {"expr": "'a'"}},
        {"id": "say", "type": "noop", "input": {"text": "{{ jion }}"}}], "edges": [{"from": "join", "to": "say"}]}))
    for command in (["validate", str(path)], ["run", str(path), "--db", str(tmp_path / "runs.db")]):
        res = _cli(tmp_path, *command)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert "$.nodes[1].input.text: unknown name 'jion'" in res.stderr and "did you mean 'join'?" in res.stderr


# --- registered functions and tools ----------------------------------------------------------------


def _uses(function: str, tools: list[str]) -> dict[str, object]:
    return {"name": "uses", "nodes": [
        {"id": "calc", "type": "python", "input": {"function": function, "args": {"text": "a"}}},
        {"id": "agent", "type": "claude.agent", "input": {"prompt": "p", "tools": tools}}]}


def test_unknown_functions_and_tools_are_reported_with_the_known_names() -> None:
    reg = default_registry().copy()
    reg.add_function("shout", lambda text: text)
    reg.add_tool("lookup_fact", lambda q: q)
    with pytest.raises(FlowValidationError) as info:
        compile_flow(_uses("shuot", ["lookup_fakt", "ask_human", "{{ flow.input.tool }}"]), reg.node_types,
                     functions=reg.functions, tools=reg.tools)
    found = [str(p) for p in info.value.problems]
    assert len(found) == 2, found
    assert found[0].startswith("$.nodes[0].input.function: unknown python function 'shuot'; did you mean 'shout'?")
    assert found[1].startswith("$.nodes[1].input.tools[0]: unknown tool 'lookup_fakt'; did you mean 'lookup_fact'?")
    assert "ask_human" in found[1] and "lookup_fact" in found[1]
    # Without the registered names (a caller that does not know them) the names are not judged.
    compile_flow(_uses("shuot", ["lookup_fakt"]), reg.node_types)
    # A name given by a binding is only known when the node runs.
    compile_flow(_uses("{{ flow.input.fn }}", []), reg.node_types, functions=reg.functions, tools=reg.tools)


def test_validate_and_run_know_the_functions_plugins_register(tmp_path: Path) -> None:
    path = tmp_path / "uses.json"
    path.write_text(json.dumps(_uses("shout", [])))
    res = _cli(tmp_path, "validate", str(path))
    assert res.returncode == 2 and "$.nodes[0].input.function: unknown python function 'shout'" in res.stderr
    assert _cli(tmp_path, "--plugin", "tests.plugins.extras", "validate", str(path)).returncode == 0
    assert _cli(tmp_path, "validate", str(path), env={"FLOWKERNEL_PLUGINS": "tests.plugins.extras"}).returncode == 0
    path.write_text(json.dumps(_uses("shuot", [])))
    res = _cli(tmp_path, "--plugin", "tests.plugins.extras", "run", str(path), "--db", str(tmp_path / "r.db"))
    assert res.returncode == 2 and "unknown python function 'shuot'; did you mean 'shout'?" in res.stderr
    assert "fail_first_time" in res.stderr  # the known names are listed
    assert not (tmp_path / "r.db").exists()


# --- the same through the command line, where a user meets them --------------------------------------


@pytest.mark.parametrize(("case", "doc", "line"), [
    ("forEach on a node", {"name": "x", "nodes": [{"id": "a", "type": "noop", "forEach": {"in": "[1]"}}]},
     "$.nodes[0].forEach: forEach belongs on an edge"),
    ("gate on a node", {"name": "x", "nodes": [{"id": "a", "type": "noop", "gate": "any"}]},
     "$.nodes[0].gate: gate belongs on the edges into this node"),
    ("thinking below the minimum", {"name": "x", "nodes": [{"id": "a", "type": "claude.agent", "input": {
        "prompt": "p", "model": "claude-sonnet-4-6", "thinking": {"budgetTokens": 1023}}}]},
     "$.nodes[0].input.thinking.budgetTokens: must be an integer of at least 1024"),
    ("maxIterations as a string", _two(maxIterations="3"), "$.edges[0].maxIterations: "),
    ("continueOnError as a string", {"name": "x", "nodes": [{"id": "a", "type": "noop",
                                                             "policy": {"continueOnError": "false"}}]},
     "$.nodes[0].policy.continueOnError: "),
    ("a function as a value", {"name": "x", "nodes": [{"id": "a", "type": "noop", "input": {"v": "{{ $sum }}"}}]},
     "$.nodes[0].input.v: '$sum' is a function, not a value"),
    ("inputs not a JSON Schema", {"name": "x", "inputs": {"type": "objekt"}, "nodes": [{"id": "a", "type": "noop"}]},
     "$.inputs.type: not a valid JSON Schema"),
    ("an empty edge id", _two(id=""), "$.edges[0].id: "),
])
def test_validate_names_the_path_of_each_untruthful_flow(case: str, doc: dict[str, object], line: str,
                                                         tmp_path: Path) -> None:
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(doc))
    res = _validate_cli(path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, (case, res.stderr)
    assert f"  {line}" in res.stderr, (case, res.stderr)


def test_validate_knows_the_tools_a_plugin_registers(tmp_path: Path) -> None:
    research = ROOT / "flows" / "research.json"
    res = _cli(tmp_path, "validate", str(research))
    assert res.returncode == 2 and "$.nodes[0].input.tools[0]: unknown tool 'lookup_fact'" in res.stderr, res.stderr
    assert "known: ask_human" in res.stderr
    ok = _cli(tmp_path, "--plugin", "flowkernel.examples.research_tools", "validate", str(research))
    assert ok.returncode == 0, ok.stderr
