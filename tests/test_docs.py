"""The reference in docs/ cannot rot: its marked Python blocks run here, the node type it teaches is
exercised (reply, pause and resume, load-time check, the CLI commands it shows), every flow it shows
loads, and every link in it points at a file and heading that exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.agents.tools import as_tool
from flowkernel.core.commands import Command
from flowkernel.core.compiler import compile_flow
from flowkernel.core.events import BaseEvent
from flowkernel.errors import FlowValidationError
from flowkernel.plugins import registry as registry_module
from flowkernel.plugins.registry import Blocking, Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXTENDING = DOCS / "extending.md"
TALLY_FLOW = {"name": "tally-demo", "nodes": [{"id": "sum", "type": "tally", "input": {"numbers": [1, 2, "three", 4]}}]}


def blocks(path: Path, language: str) -> list[tuple[str, str]]:
    """``(comment line before the fence or "", code)`` for each fenced block in ``language``."""
    text = path.read_text(encoding="utf-8")
    found = []
    for m in re.finditer(rf"^(?:(<!--[^\n]*-->)\n)?```{language}\n(.*?)^```", text, re.S | re.M):
        found.append((m.group(1) or "", m.group(2)))
    return found


def python_blocks_marked_tested(path: Path) -> list[str]:
    return [code for comment, code in blocks(path, "python") if comment.startswith("<!-- tested")]


@pytest.fixture
def docs_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """Every tested block of extending.md run, in order, as one plugin module, on a fresh process-wide registry."""
    monkeypatch.setattr(registry_module, "_default", None)
    module = types.ModuleType("docs_extending")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for code in python_blocks_marked_tested(EXTENDING):
        exec(compile(code, str(EXTENDING), "exec"), module.__dict__)
    yield module


def test_the_marked_blocks_are_the_ones_the_reader_sees() -> None:
    assert len(python_blocks_marked_tested(EXTENDING)) == 6
    assert "class Tally" in python_blocks_marked_tested(EXTENDING)[-1]


def test_the_registration_examples_register_what_they_say(docs_module: types.ModuleType) -> None:
    reg = default_registry()
    assert {"slugify", "text.shout", "word_count", "text.length", "notes.add", "http.status"} <= set(reg.functions)
    assert isinstance(reg.functions["http.status"], Blocking)
    assert reg.functions["slugify"] is docs_module.slugify  # the decorator returned the function itself
    definitions = {name: as_tool(name, reg.tools[name]).definition()
                   for name in ("lookup_fact", "search_docs", "add_numbers")}
    assert definitions["lookup_fact"]["description"] == "Look up a short fact about a database."
    assert definitions["search_docs"]["description"] == "Search the product documentation."
    assert set(definitions["search_docs"]["input_schema"]["properties"]) == {"text", "limit"}
    assert definitions["add_numbers"]["input_schema"]["required"] == ["a"]
    assert "tally" in reg.node_types

    kernel = Kernel(MemoryStore(), registry=reg)
    flow = {"name": "fns", "nodes": [
        {"id": "slug", "type": "python", "input": {"function": "slugify", "args": {"text": "Hello Big World"}}},
        {"id": "note", "type": "python", "input": {"function": "notes.add", "args": {"text": "{{ slug }}"}}},
        {"id": "count", "type": "python", "input": {"function": "text.length", "args": {"text": "{{ slug }}"}}},
    ], "edges": [{"from": "slug", "to": "note"}, {"from": "slug", "to": "count"}]}
    snap = anyio.run(kernel.run, kernel.compile(flow), {})
    assert snap.status == "completed", snap.error
    assert snap.outputs == {"slug": "hello-big-world", "note": 1, "count": 15}
    assert snap.state == {"notes": ["hello-big-world"]}


def test_the_idempotent_tool_does_its_side_effect_once_per_key(docs_module: types.ModuleType) -> None:
    from flowkernel.agents.tools import ToolContext

    send = as_tool("send_invoice", default_registry().tools["send_invoice"])
    assert set(send.input_schema["properties"]) == {"customer", "amount"}, "ctx is not part of the input"
    first = ToolContext(idempotency_key="nr_1:toolu_1", tool_use_id="toolu_1", node_id="billing", run_id="run_1")
    again = anyio.run(send.call, {"customer": "ACME", "amount": 30}, first)
    assert again == anyio.run(send.call, {"customer": "ACME", "amount": 30}, first)
    assert docs_module.SENT == {"nr_1:toolu_1": "invoice of 30 sent to ACME"}
    other = ToolContext(idempotency_key="nr_1:toolu_2", tool_use_id="toolu_2", node_id="billing", run_id="run_1")
    anyio.run(send.call, {"customer": "ACME", "amount": 30}, other)
    assert len(docs_module.SENT) == 2


def test_tally_waits_for_a_person_then_continues_where_it_stopped(docs_module: types.ModuleType) -> None:
    kernel = Kernel(MemoryStore(), registry=default_registry())
    snap = anyio.run(kernel.run, kernel.compile(TALLY_FLOW), {})
    assert snap.status == "waiting"
    assert "'three'" in str(snap.waiting["sum"].prompt)
    assert snap.state == {"tally": {"sum": {"done": 2, "total": 3}}}
    with pytest.raises(Exception, match="does not match the schema"):
        anyio.run(kernel.reply, snap.runId, snap.waiting["sum"].runId, "three")
    snap = anyio.run(kernel.reply, snap.runId, snap.waiting["sum"].runId, 3)
    assert snap.status == "completed" and snap.outputs["sum"] == 10
    patches = [e for e in kernel.events(snap.runId) if e.type == "state:patch"]
    assert len(patches) == 4  # one per number: no step was done twice


def test_tally_pauses_at_a_step_boundary_and_resumes_without_redoing_a_step(docs_module: types.ModuleType) -> None:
    entered, release = anyio.Event(), anyio.Event()

    class Held(docs_module.Tally):  # type: ignore[name-defined,misc]
        """The second step holds until the test has asked the run to pause."""

        async def add(self, total: float, value: float) -> float:
            if value == 2:
                entered.set()
                await release.wait()
            return await super().add(total, value)

    reg = Registry()
    reg.register_node_type(Held)
    kernel = Kernel(MemoryStore(), registry=reg)
    flow = {"name": "tally-pause", "nodes": [{"id": "sum", "type": "tally", "input": {"numbers": [1, 2, 3, 4]}}]}
    started: list[str] = []

    def on_event(ev: BaseEvent) -> None:
        if ev.type == "flow:start":
            started.append(ev.flowRunId)

    async def scenario() -> Any:
        result: list[Any] = []
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                result.append(await kernel.run(kernel.compile(flow), {}, on_event=on_event))
            tg.start_soon(run)
            with anyio.fail_after(10):
                await entered.wait()
            await kernel.command(started[0], Command(kind="pause"))
            release.set()  # the step in flight finishes; the node sees the pause at the next boundary
        return result[0]

    snap = anyio.run(scenario)
    assert snap.status == "paused"
    assert snap.state == {"tally": {"sum": {"done": 2, "total": 3}}}
    resumed = anyio.run(kernel.resume, snap.runId, "go on")
    assert resumed.status == "completed" and resumed.outputs["sum"] == 10
    starts = [e for e in kernel.events(snap.runId) if e.type == "node:start"]
    assert len(starts) == 2 and starts[1].resumedFrom == starts[0].runId
    assert len([e for e in kernel.events(snap.runId) if e.type == "state:patch"]) == 4


def test_tally_checks_its_input_when_the_flow_is_loaded(docs_module: types.ModuleType) -> None:
    with pytest.raises(FlowValidationError, match=re.escape("$.nodes[0].input.numbers")):
        compile_flow({"name": "bad", "nodes": [{"id": "sum", "type": "tally", "input": {}}]},
                     node_types=default_registry().node_types)


def test_the_commands_the_example_shows_work(clean_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "tally_node.py").write_text(python_blocks_marked_tested(EXTENDING)[-1], encoding="utf-8")
    shown = [json.loads(code) for _, code in blocks(EXTENDING, "json") if '"tally-demo"' in code]
    assert shown == [TALLY_FLOW]
    (tmp_path / "tally-demo.json").write_text(json.dumps(TALLY_FLOW), encoding="utf-8")
    commands = [line.split("#")[0].split() for _, code in blocks(EXTENDING, "sh") if "tally_node" in code
                for line in code.splitlines()]
    assert commands[0] == ["flowkernel", "--plugin", "tally_node", "run", "tally-demo.json"]
    cli = [sys.executable, "-m", "flowkernel.cli"]
    env = {**clean_env, "FLOWKERNEL_DB": str(tmp_path / "runs.db")}
    first = subprocess.run([*cli, *commands[0][1:], "--json"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)
    assert first.returncode == 3, first.stderr
    waiting = [json.loads(line) for line in first.stdout.splitlines() if '"node:waiting"' in line][-1]
    reply = [waiting["flowRunId"] if w == "RUN" else waiting["runId"] if w == "NODE_RUN_ID" else w
             for w in commands[1][1:]]
    second = subprocess.run([*cli, *reply, "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 0, second.stderr
    done = [json.loads(line) for line in second.stdout.splitlines() if '"node:complete"' in line]
    assert done[-1]["output"] == 10


def _documents() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(DOCS.glob("*.md")):
        for _, code in blocks(path, "json"):
            value = json.loads(code)
            if isinstance(value, dict):
                found.append((path, value))
    return found


def test_every_flow_and_node_the_docs_show_loads(docs_module: types.ModuleType) -> None:
    node_types = default_registry().node_types
    flows = 0
    for path, value in _documents():
        if "nodes" in value:
            document = value
            flows += 1
        elif "type" in value and "id" in value:  # one node, shown alone: loads next to the nodes it binds
            bound = set(re.findall(r"\{\{\s*([A-Za-z_][\w]*)\.", json.dumps(value)))
            expr = value.get("input", {}).get("expr") if isinstance(value.get("input"), dict) else None
            if isinstance(expr, str):  # a transform's expression reads node outputs without {{ }}
                bound |= set(re.findall(r"(?<![\w.$'])([A-Za-z_]\w*)\.", expr))
            bound -= {"flow", "state", value["id"]}
            document = {"name": "snippet", "nodes": [value, *({"id": b, "type": "noop"} for b in bound)]}
        elif "from" in value and "to" in value:  # one edge: between two nodes of the names it uses
            document = {"name": "snippet", "nodes": [{"id": value["from"], "type": "noop"},
                                                     {"id": value["to"], "type": "noop"}], "edges": [value]}
        else:
            continue
        try:
            compile_flow(document, node_types=node_types, source=str(path))
        except FlowValidationError as exc:
            raise AssertionError(f"{path.name}: a flow shown there does not load:\n{exc}") from None
    assert flows >= 3


def test_links_in_the_docs_point_at_files_and_headings_that_exist() -> None:
    def anchors(path: Path) -> set[str]:
        heads = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
        return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in heads}

    for path in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", path.read_text(encoding="utf-8")):
            file, anchor = target
            if file.startswith(("http://", "https://")):
                continue
            linked = (path.parent / file) if file else path
            assert linked.exists(), f"{path.name} links to {file}, which does not exist"
            if anchor and linked.suffix == ".md":
                assert anchor in anchors(linked), f"{path.name} links to {file}#{anchor}: no such heading"
    assert "docs/README.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_built_in_node_type_and_agent_key_is_documented() -> None:
    from flowkernel.nodes.claude.config import DEFAULT_MODEL, KEYS
    from flowkernel.plugins.builtins import BUILTIN_NODE_TYPES

    text = (DOCS / "node-types.md").read_text(encoding="utf-8")
    for name in BUILTIN_NODE_TYPES:
        assert f"\n## {name}\n" in text, f"node type {name} has no section in docs/node-types.md"
    agent = text.split("\n## claude.agent\n")[1].split("\n## ")[0]
    for key in KEYS:
        assert f"| `{key}` |" in agent, f"claude.agent input key {key} is not documented"
    assert f"`{DEFAULT_MODEL}`" in agent  # the default model as the code has it
