"""A flow file validated once starts without validating again, until something validation reads changes:
the document, the files it names, the node types, functions and tools registered, the installed
packages or flowkernel's own sources. A flow validation refuses is never remembered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flowkernel.core.validation
import pytest
from flowkernel.errors import FlowValidationError
from flowkernel.flowfiles import validated
from flowkernel.flowfiles.validated import load_valid_flow
from flowkernel.plugins.registry import Registry, default_registry

PROBE = """
import sys
from flowkernel.cli import main
code = main(sys.argv[1:])
heavy = [m for m in %r if m in sys.modules]
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""
HEAVY = ("pydantic", "networkx", "jsonschema", "anthropic", "jsonata", "regex")
# What running a flow needs and checking a flow known to be valid does not: the compiler and the
# expression engine, the node context (msgspec, the events), the event loop.
RUNTIME = ("flowkernel.core.compiler", "flowkernel.core.expressions", "flowkernel.run.node_context", "flowkernel.core.events",
           "flowkernel.run.offload", "msgspec", "anyio", "asyncio")


def probe(*args: str, cwd: Path, env: dict[str, str],
          modules: tuple[str, ...] = HEAVY) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE % (modules,), *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60)
    heavy = done.stderr.rsplit("HEAVY=", 1)[-1].strip()
    return done, [m for m in heavy.split(",") if m]


def write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path


ONE = {"name": "one", "nodes": [{"id": "a", "type": "noop", "input": {"x": 1}}], "edges": []}


@pytest.fixture
def cache_env(tmp_path: Path, clean_env: dict[str, str]) -> dict[str, str]:
    return {**clean_env, "FLOWKERNEL_CACHE_DIR": str(tmp_path / "cache"),
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{clean_env.get('PYTHONPATH', '')}"}


@pytest.fixture
def validations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """In-process: a cache of this test's own, and the sources of every full validation made."""
    monkeypatch.setenv(validated.CACHE_ENV, str(tmp_path / "cache"))
    seen: list[str] = []
    check = flowkernel.core.validation.check_document

    def counted(document: Any, node_types: Any, source: str, known: Any = None) -> None:
        seen.append(source)
        check(document, node_types, source, known)

    monkeypatch.setattr(flowkernel.core.validation, "check_document", counted)
    yield seen


def test_a_flow_validated_before_runs_without_pydantic_networkx_jsonschema_or_jsonata(tmp_path: Path,
                                                                               cache_env: dict[str, str]) -> None:
    flow = write(tmp_path / "one.json", ONE)
    first, heavy = probe("run", str(flow), "--db", str(tmp_path / "runs.db"), cwd=tmp_path, env=cache_env)
    assert first.returncode == 0, first.stderr
    assert "pydantic" in heavy  # validated the first time
    again, heavy = probe("run", str(flow), "--db", str(tmp_path / "runs.db"), cwd=tmp_path, env=cache_env)
    assert again.returncode == 0, again.stderr
    assert "■ completed" in again.stdout
    assert heavy == []
    checked, heavy = probe("validate", str(flow), cwd=tmp_path, env=cache_env)
    assert checked.returncode == 0 and "ok — flow 'one', 1 node, 0 edges" in checked.stdout
    assert heavy == []


def test_validate_of_a_flow_validated_before_only_reads_it_and_says_the_same(tmp_path: Path,
                                                                             cache_env: dict[str, str]) -> None:
    # Edges named and unnamed, a loop edge, several node types: counted as the compiled flow counts them.
    flow = write(tmp_path / "flow.json", {"name": "several", "nodes": [
        {"id": "a", "type": "noop", "input": {"x": 1}},
        {"id": "b", "type": "transform", "input": {"expr": "a.x + 1"}},
        {"id": "c", "type": "state.set", "input": {"path": "n", "value": 1}}], "edges": [
        {"from": "a", "to": "b"}, {"id": "second", "from": "b", "to": "c"},
        {"from": "c", "to": "b", "maxIterations": 2, "when": "{{ false }}"}]})
    first, heavy = probe("validate", str(flow), cwd=tmp_path, env=cache_env, modules=HEAVY + RUNTIME)
    assert first.returncode == 0, first.stderr
    assert "pydantic" in heavy and "flowkernel.core.compiler" in heavy  # validated the first time
    again, heavy = probe("validate", str(flow), cwd=tmp_path, env=cache_env, modules=HEAVY + RUNTIME)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout == f"{flow}: ok — flow 'several', 3 nodes, 3 edges\n"
    assert heavy == []


def test_a_changed_flow_is_validated_again_and_its_problems_reported(tmp_path: Path,
                                                                     cache_env: dict[str, str]) -> None:
    flow = write(tmp_path / "one.json", ONE)
    assert probe("validate", str(flow), cwd=tmp_path, env=cache_env)[0].returncode == 0
    write(flow, {**ONE, "edges": [{"from": "a", "to": "nowhere"}]})
    bad, _ = probe("validate", str(flow), cwd=tmp_path, env=cache_env)
    assert bad.returncode == 2 and "$.edges[0].to" in bad.stderr
    bad, _ = probe("validate", str(flow), cwd=tmp_path, env=cache_env)  # an invalid flow is never remembered
    assert bad.returncode == 2 and "$.edges[0].to" in bad.stderr


def test_a_flow_valid_only_with_a_plugin_node_type_is_refused_without_it(tmp_path: Path,
                                                                         cache_env: dict[str, str]) -> None:
    (tmp_path / "extra_nodes.py").write_text(
        "from flowkernel.plugins.registry import register_node_type\n\n"
        "@register_node_type\nclass Echo:\n    name = 'echo'\n\n"
        "    async def run(self, ctx):\n        return ctx.input\n")
    flow = write(tmp_path / "echo.json", {"name": "e", "nodes": [{"id": "a", "type": "echo", "input": {}}], "edges": []})
    for _ in range(2):
        assert probe("--plugin", "extra_nodes", "validate", str(flow), cwd=tmp_path, env=cache_env)[0].returncode == 0
    without, _ = probe("validate", str(flow), cwd=tmp_path, env=cache_env)
    assert without.returncode == 2 and "unknown node type 'echo'" in without.stderr


def test_a_plugin_node_type_whose_check_now_refuses_the_flow_is_validated_again(tmp_path: Path,
                                                                               cache_env: dict[str, str]) -> None:
    plugin = tmp_path / "extra_nodes.py"
    source = ("from flowkernel.plugins.registry import register_node_type\nfrom flowkernel.errors import Problem\n\n"
              "@register_node_type\nclass Echo:\n    name = 'echo'\n\n"
              "    def check(self, raw, path, problems):\n        CHECK\n\n"
              "    async def run(self, ctx):\n        return ctx.input\n")
    plugin.write_text(source.replace("CHECK", "pass"))
    flow = write(tmp_path / "echo.json", {"name": "e", "nodes": [{"id": "a", "type": "echo", "input": {}}], "edges": []})
    ok, heavy = probe("--plugin", "extra_nodes", "validate", str(flow), cwd=tmp_path, env=cache_env)
    assert ok.returncode == 0, ok.stderr
    ok, heavy = probe("--plugin", "extra_nodes", "validate", str(flow), cwd=tmp_path, env=cache_env)
    assert ok.returncode == 0 and "pydantic" not in heavy  # remembered
    plugin.write_text(source.replace("CHECK", "problems.append(Problem(path, 'echo wants a greeting now'))"))
    bad, _ = probe("--plugin", "extra_nodes", "validate", str(flow), cwd=tmp_path, env=cache_env)
    assert bad.returncode == 2 and "echo wants a greeting now" in bad.stderr


def test_a_flow_whose_function_is_no_longer_registered_is_refused(tmp_path: Path, cache_env: dict[str, str]) -> None:
    (tmp_path / "extra_functions.py").write_text(
        "from flowkernel.plugins.registry import register_function\n\n"
        "@register_function\ndef greet(name='x'):\n    return 'hi ' + name\n")
    flow = write(tmp_path / "py.json", {"name": "p", "nodes": [
        {"id": "a", "type": "python", "input": {"function": "greet"}}], "edges": []})
    for _ in range(2):
        done, _ = probe("--plugin", "extra_functions", "run", str(flow), "--db", str(tmp_path / "runs.db"),
                        cwd=tmp_path, env=cache_env)
        assert done.returncode == 0, done.stderr
    without, _ = probe("validate", str(flow), cwd=tmp_path, env=cache_env)
    assert without.returncode == 2 and "unknown python function 'greet'" in without.stderr


def test_a_flow_checked_without_function_names_is_not_taken_as_checked_with_them(
        tmp_path: Path, validations: list[str]) -> None:
    flow = write(tmp_path / "py.json", {"name": "p", "nodes": [
        {"id": "a", "type": "python", "input": {"function": "not_registered_anywhere"}}], "edges": []})
    load_valid_flow(flow, default_registry(), check_names=False)  # as `run --queue`: the worker knows them
    load_valid_flow(flow, default_registry(), check_names=False)
    assert len(validations) == 1
    with pytest.raises(FlowValidationError, match="unknown python function 'not_registered_anywhere'"):
        load_valid_flow(flow, default_registry())


def test_a_tool_registered_since_is_asked_about_again(tmp_path: Path, validations: list[str]) -> None:
    flow = write(tmp_path / "agent.json", {"name": "t", "nodes": [
        {"id": "a", "type": "claude.agent", "input": {"prompt": "hi", "tools": ["lookup"]}}], "edges": []})
    registry = default_registry().copy()
    with pytest.raises(FlowValidationError, match="unknown tool 'lookup'"):
        load_valid_flow(flow, registry)

    def lookup(q: str) -> str:
        """Look something up."""
        return q

    registry.add_tool("lookup", lookup)
    load_valid_flow(flow, registry)
    load_valid_flow(flow, registry)
    assert len(validations) == 2  # the refusal, then the first success; the second came from the cache
    with pytest.raises(FlowValidationError, match="unknown tool 'lookup'"):
        load_valid_flow(flow, default_registry().copy())


def test_a_changed_child_flow_validates_its_parent_again(tmp_path: Path, validations: list[str]) -> None:
    child = write(tmp_path / "child.json", ONE)
    parent = write(tmp_path / "parent.json", {"name": "p", "nodes": [
        {"id": "c", "type": "flow.call", "input": {"flow": "child.json"}}], "edges": []})
    load_valid_flow(parent, default_registry())
    load_valid_flow(parent, default_registry())
    assert validations == [str(parent), str(child)]  # the child is validated with its parent
    write(child, {**ONE, "name": "changed"})
    load_valid_flow(parent, default_registry())
    assert validations[2:] == [str(parent), str(child)]
    child.unlink()
    with pytest.raises(FlowValidationError, match=r"\$\.nodes\[0\]\.input\.flow: child flow .*child.json: no such"):
        load_valid_flow(parent, default_registry())
    assert validations[4:] == [str(parent)]


def test_an_edited_flowkernel_source_validates_again(tmp_path: Path, validations: list[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sources = tmp_path / "src"
    (sources / "sub").mkdir(parents=True)
    module = sources / "sub" / "checks.py"
    module.write_text("RULE = 1\n")
    real = validated._source_folders()
    monkeypatch.setattr(validated, "_source_folders", lambda: [*real, str(sources)])
    flow = write(tmp_path / "one.json", ONE)
    load_valid_flow(flow, default_registry())
    load_valid_flow(flow, default_registry())
    assert len(validations) == 1
    module.write_text("RULE = 22\n")
    load_valid_flow(flow, default_registry())
    assert len(validations) == 2


def test_every_flowkernel_source_file_is_part_of_the_key() -> None:
    import flowkernel
    import flowkernel.nodes

    stamped = set(validated.source_files())
    for package in (flowkernel, flowkernel.nodes):
        root = Path(package.__file__ or "").parent
        for file in root.rglob("*.py"):
            if "__pycache__" not in file.parts:
                assert str(file) in stamped, file
    assert any(f.endswith(os.path.join("claude", "config.py")) for f in stamped)  # nested packages too
    assert any(f.endswith("validation.py") for f in stamped)


def test_an_upgraded_package_validates_again(tmp_path: Path, validations: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "jsonschema-4.0.0.dist-info").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    flow = write(tmp_path / "one.json", ONE)
    load_valid_flow(flow, default_registry())
    load_valid_flow(flow, default_registry())
    assert len(validations) == 1
    (site / "jsonschema-4.0.0.dist-info").rename(site / "jsonschema-4.1.0.dist-info")
    load_valid_flow(flow, default_registry())
    assert len(validations) == 2


def test_a_node_type_registered_under_a_builtin_name_validates_again(tmp_path: Path,
                                                                      validations: list[str]) -> None:
    flow = write(tmp_path / "one.json", ONE)
    load_valid_flow(flow, default_registry())
    assert len(validations) == 1

    class StrictNoop:
        name = "noop"

        def check(self, raw: dict[str, Any], path: str, problems: list[Any]) -> None:
            from flowkernel.errors import Problem

            problems.append(Problem(path, "this noop takes no input"))

        async def run(self, ctx: Any) -> Any:
            return None

    registry: Registry = default_registry().copy()
    registry.add_node_type(StrictNoop)
    with pytest.raises(FlowValidationError, match="this noop takes no input"):
        load_valid_flow(flow, registry)


def test_a_node_type_check_that_reads_its_settings_runs_every_time(tmp_path: Path, validations: list[str]) -> None:
    from flowkernel.errors import Problem

    class Greeting:
        name = "greeting"

        def __init__(self) -> None:
            self.strict = False

        def check(self, raw: dict[str, Any], path: str, problems: list[Problem]) -> None:
            if self.strict and "text" not in raw:
                problems.append(Problem(f"{path}.text", "a strict greeting needs a text"))

        async def run(self, ctx: Any) -> Any:
            return None

    greeting = Greeting()
    registry = default_registry().copy()
    registry.add_node_type(greeting)
    flow = write(tmp_path / "g.json", {"name": "g", "nodes": [{"id": "a", "type": "greeting", "input": {}}],
                                       "edges": []})
    load_valid_flow(flow, registry)
    load_valid_flow(flow, registry)
    assert len(validations) == 1
    greeting.strict = True  # the same code, other settings: what the check says now is what counts
    with pytest.raises(FlowValidationError, match="a strict greeting needs a text"):
        load_valid_flow(flow, registry)


def test_a_node_type_that_now_reads_an_expression_in_its_input_validates_again(tmp_path: Path,
                                                                              validations: list[str]) -> None:
    class Formula:
        name = "formula"
        expression_keys: tuple[str, ...] = ()

        async def run(self, ctx: Any) -> Any:
            return None

    formula = Formula()
    registry = default_registry().copy()
    registry.add_node_type(formula)
    flow = write(tmp_path / "f.json", {"name": "f", "nodes": [{"id": "a", "type": "formula",
                                                               "input": {"expr": "nobody.here"}}], "edges": []})
    load_valid_flow(flow, registry)
    load_valid_flow(flow, registry)
    assert len(validations) == 1
    formula.expression_keys = ("expr",)  # `expr` is an expression now: the name it reads must exist
    with pytest.raises(FlowValidationError, match="unknown name 'nobody'"):
        load_valid_flow(flow, registry)


def test_a_child_flow_that_is_a_fifo_is_keyed_without_reading_it(tmp_path: Path, validations: list[str]) -> None:
    os.mkfifo(tmp_path / "child.json")
    parent = write(tmp_path / "parent.json", {"name": "p", "nodes": [
        {"id": "c", "type": "flow.call", "input": {"flow": "child.json"}}], "edges": []})
    for _ in range(2):  # refused at once: reading a child never waits on a FIFO
        with pytest.raises(FlowValidationError, match=r"child flow .*child.json: not a regular file \(a FIFO\)"):
            load_valid_flow(parent, default_registry())
    assert validations == [str(parent)]  # the parent itself is valid, and remembered as such


def test_a_cache_that_cannot_be_written_stops_nothing(tmp_path: Path, clean_env: dict[str, str]) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would go")
    env = {**clean_env, "FLOWKERNEL_CACHE_DIR": str(blocked)}
    flow = write(tmp_path / "one.json", ONE)
    for _ in range(2):
        done, _ = probe("run", str(flow), "--db", str(tmp_path / "runs.db"), cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr


def test_the_cache_keeps_a_bounded_number_of_records_and_forgets_the_least_used_first(
        tmp_path: Path, validations: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validated, "MAX_RECORDS", 10)
    registry = default_registry()
    flows = [write(tmp_path / f"f{i}.json", {**ONE, "name": f"f{i}"}) for i in range(10)]
    for f in flows:
        load_valid_flow(f, registry)
    folder = validated.cache_dir()
    assert folder is not None and len(list(folder.iterdir())) == 10
    for i, record in enumerate(sorted(folder.iterdir())):  # all of them used long ago, in some order
        os.utime(record, (1_000_000 + i, 1_000_000 + i))
    record = validated._look_up(flows[3], registry, True).record
    assert record is not None
    os.utime(record, (1, 1))  # the oldest of all
    load_valid_flow(flows[3], registry)  # used now: it stays
    assert validations.count(str(flows[3])) == 1
    fresh = write(tmp_path / "new.json", {**ONE, "name": "new"})
    load_valid_flow(fresh, registry)  # the eleventh record: the least used go
    assert len(list(folder.iterdir())) == 9
    validations.clear()
    load_valid_flow(flows[3], registry)
    load_valid_flow(fresh, registry)
    assert validations == []  # both still known
