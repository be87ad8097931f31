"""What a command does before its first line and after its last: loading a stored run builds its
objects with the cycle collector held off, and the process exits without collecting what it holds.
(How long any of it takes is measured by the benchmark, scripts/bench, never here.)"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import flowkernel.run.flow_cache
import flowkernel.run.reads
import pytest
from flowkernel.core.compiler import compile_flow
from flowkernel.plugins.registry import default_registry
from flowkernel.run.gc_pause import collector_paused
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore

CHAIN = {"name": "chain", "nodes": [{"id": f"n{i}", "type": "noop", "input": {"i": i}} for i in range(3)],
         "edges": [{"from": "n0", "to": "n1"}, {"from": "n1", "to": "n2"}]}


def test_the_collector_is_off_inside_and_back_on_after_even_when_the_block_raises() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_a_collector_turned_off_by_its_owner_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_pauses_in_two_threads_turn_it_back_on_only_when_the_last_ends() -> None:
    entered, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def other() -> None:
        with collector_paused():
            entered.set()
            release.wait(10)
            seen.append(gc.isenabled())

    thread = threading.Thread(target=other)
    with collector_paused():
        thread.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    thread.join(10)
    assert seen == [False] and gc.isenabled()


def test_loading_a_stored_run_compiles_its_flow_and_reads_its_checkpoint_with_the_collector_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    try:
        kernel = Kernel(store)
        snap = anyio.run(kernel.run, kernel.compile(CHAIN), {})
        assert snap.status == "completed"
    finally:
        store.close()
    enabled: dict[str, list[bool]] = {"compile": [], "checkpoint": []}
    compile_flow, decode_checkpoint = flowkernel.run.flow_cache.compile_flow, flowkernel.run.reads.decode_checkpoint

    def compiling(*args: Any, **kwargs: Any) -> Any:
        enabled["compile"].append(gc.isenabled())
        return compile_flow(*args, **kwargs)

    def loading(*args: Any, **kwargs: Any) -> Any:
        enabled["checkpoint"].append(gc.isenabled())
        return decode_checkpoint(*args, **kwargs)

    monkeypatch.setattr(flowkernel.run.flow_cache, "compile_flow", compiling)
    monkeypatch.setattr(flowkernel.run.reads, "decode_checkpoint", loading)
    store = SqliteStore(db)
    try:
        fresh = Kernel(store)  # nothing compiled yet in this kernel: the stored flow is
        again = fresh.snapshot(snap.runId)
    finally:
        store.close()
    assert again == snap
    assert enabled == {"compile": [False], "checkpoint": [False]}
    assert gc.isenabled()


PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("FROZEN", gc.get_freeze_count() > 0, file=sys.stderr))  # runs last
from flowkernel.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_command_exits_without_collecting_what_the_process_holds(tmp_path: Path,
                                                                   clean_env: dict[str, str]) -> None:
    flow = tmp_path / "chain.json"
    flow.write_text(json.dumps(CHAIN))
    done = subprocess.run([sys.executable, "-c", PROBE, "run", str(flow), "--db", str(tmp_path / "runs.db")],
                          cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "■ completed" in done.stdout
    assert done.stderr.strip().endswith("FROZEN True")
    # The store was closed by the command, not left to the exit: its write-ahead log is folded back.
    assert not (tmp_path / "runs.db-wal").exists()


def test_event_and_snapshot_field_types_are_types_not_strings_for_msgspec_to_read() -> None:
    # Strings would be evaluated when msgspec first encodes or decodes the struct, on every start-up.
    import flowkernel.core.events
    import flowkernel.core.snapshot
    import msgspec

    structs = [obj for module in (flowkernel.core.events, flowkernel.core.snapshot) for obj in vars(module).values()
               if isinstance(obj, type) and issubclass(obj, msgspec.Struct) and obj.__module__ == module.__name__]
    assert len(structs) > 20
    for struct in structs:
        for name, hint in getattr(struct, "__annotations__", {}).items():
            assert not isinstance(hint, str), f"{struct.__name__}.{name}: {hint!r}"


DATACLASSES = """
import dataclasses, sys
made = []
process = dataclasses._process_class
def recording(cls, *args, **kwargs):
    if cls.__module__.startswith("flowkernel"):
        made.append(f"{cls.__module__}.{cls.__qualname__}")
    return process(cls, *args, **kwargs)
dataclasses._process_class = recording
from flowkernel.cli import main
code = main(sys.argv[1:])
print("MADE=" + ",".join(made), file=sys.stderr)
sys.exit(code)
"""


def test_running_a_flow_builds_no_dataclass_of_the_run_shell(tmp_path: Path, clean_env: dict[str, str]) -> None:
    # Each costs a process half a millisecond to build; the run shell's records are msgspec structs.
    flow = tmp_path / "chain.json"
    flow.write_text(json.dumps(CHAIN))
    argv = [sys.executable, "-c", DATACLASSES, "run", str(flow), "--db", str(tmp_path / "runs.db")]
    done = subprocess.run(argv, cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    made = done.stderr.rsplit("MADE=", 1)[-1].strip().split(",")
    # (flowkernel.core.node's stay dataclasses: `validate` of a flow known to be valid imports it, and not msgspec.)
    shell = ("flowkernel.run.loop.", "flowkernel.run.append.", "flowkernel.run.commit_policy.",
             "flowkernel.run.node_runs.", "flowkernel.run.decisions.", "flowkernel.run.budget_watch.",
             "flowkernel.run.mailbox.", "flowkernel.core.causes.", "flowkernel.core.scheduling.", "flowkernel.core.compiler.", "flowkernel.core.commands.",
             "flowkernel.run.", "flowkernel.core.expression_scope.")
    assert [m for m in made if m.startswith(shell)] == []


@pytest.mark.parametrize("trusted", [False, True])
def test_bare_nodes_and_edges_compile_to_the_graph_the_same_flow_spelled_out_in_full_gives(
        tmp_path: Path, trusted: bool) -> None:
    # Bare ones take a shorter way through the compiler; what it builds must not differ.
    bare = {"name": "chain", "nodes": [{"id": "a", "type": "noop", "input": {"x": "{{ flow.input.x }}"}},
                                       {"id": "b", "type": "noop", "input": {"y": 2}}],
            "edges": [{"from": "a", "to": "b"}]}
    full = {"name": "chain", "nodes": [{**n, "ui": {}} for n in bare["nodes"]],
            "edges": [{"id": "a->b", "from": "a", "to": "b", "gate": "all"}]}
    types = default_registry().node_types
    flows = [compile_flow(json.loads(json.dumps(d)), types, source=str(tmp_path / "chain.json"), base_dir=tmp_path,
                          trusted=trusted) for d in (bare, full)]
    for flow in flows:
        assert (flow.source, flow.base_dir, flow.name) == (str(tmp_path / "chain.json"), tmp_path, "chain")
    shown = [{n: (c.id, c.index, c.type, c.raw_input, c.when, c.policy, c.input.render({"flow": {"input": {"x": 1}}}))
              for n, c in f.nodes.items()} for f in flows]
    assert shown[0] == shown[1]
    assert shown[0]["a"][-1] == {"x": 1}
    assert flows[0].edges == flows[1].edges
    assert (flows[0].outgoing, flows[0].incoming, flows[0].gates) == (flows[1].outgoing, flows[1].incoming, flows[1].gates)


def test_a_resumed_run_reads_its_checkpoint_and_looks_over_its_whole_flow_once_before_it_goes_on(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import flowkernel.run.decisions
    from flowkernel.core.commands import Command
    from flowkernel.plugins.registry import default_registry

    registry = default_registry().copy()
    document = {"name": "steps", "nodes": [{"id": f"n{i}", "type": "python", "input": {"function": "step",
                                                                                       "args": {"i": i}}}
                                           for i in range(4)],
                "edges": [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(3)]}
    store = SqliteStore(tmp_path / "runs.db")
    try:
        kernel = Kernel(store, registry=registry)

        def step(i: int) -> int:
            if i == 1:
                kernel.executing(run_id).deliver(  # type: ignore[union-attr]
                    Command(kind="pause", reason="test"))
            return i

        registry.add_function("step", step)
        run_id = kernel.create_run(kernel.compile(document), {})
        assert anyio.run(kernel.execute, run_id).status == "paused"
        looked: list[int] = []
        awake = flowkernel.run.decisions.awake

        def counted(flow: Any, snap: Any) -> set[str]:
            looked.append(snap.seq)
            return awake(flow, snap)

        monkeypatch.setattr(flowkernel.run.decisions, "awake", counted)
        reads: list[str] = []
        read_checkpoint = store.read_checkpoint

        def reading(run: str, *args: Any, **kwargs: Any) -> Any:
            reads.append(run)
            return read_checkpoint(run, *args, **kwargs)

        monkeypatch.setattr(store, "read_checkpoint", reading)
        done = anyio.run(kernel.resume, run_id)
    finally:
        store.close()
    assert done.status == "completed" and done.outputs["n3"] == 3
    assert len(looked) == 1  # after command:received and flow:resumed, not after each
    assert reads == [run_id]  # the snapshot is rebuilt from it, and its size known from that read


# A plugin module the command imports first: it notes, for every line the command prints, whether the
# anthropic SDK was imported by then.
WATCHER = '''
import sys

class _Watch:
    def __init__(self, real):
        self.real, self.pending = real, ""

    def write(self, text):
        self.pending += text
        while "\\n" in self.pending:
            line, self.pending = self.pending.split("\\n", 1)
            print("SDK" if "anthropic" in sys.modules else "---", line, file=sys.stderr)
        return self.real.write(text)

    def __getattr__(self, name):
        return getattr(self.real, name)

sys.stdout = _Watch(sys.stdout)
'''


def test_an_agent_run_prints_its_first_events_before_the_sdk_is_imported(tmp_path: Path,
                                                                          clean_env: dict[str, str]) -> None:
    from flowkernel.testing.fake_api import FakeAnthropic, Text, reply

    (tmp_path / "sdk_watch.py").write_text(WATCHER)
    flow = tmp_path / "ask.json"
    flow.write_text(json.dumps({"name": "ask", "nodes": [{"id": "agent", "type": "claude.agent",
                                                          "input": {"prompt": "Is it on?"}}], "edges": []}))
    with FakeAnthropic() as fake:
        fake.script(reply(Text("Yes.")))
        env = {**clean_env, "ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "test",
               "PYTHONPATH": f"{tmp_path}{os.pathsep}{clean_env['PYTHONPATH']}"}
        done = subprocess.run([sys.executable, "-m", "flowkernel.cli", "--plugin", "sdk_watch", "run", str(flow),
                               "--db", str(tmp_path / "runs.db")], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = [line.split(" ", 1) for line in done.stderr.splitlines() if line.startswith(("SDK ", "--- "))]
    started = next(i for i, (_, line) in enumerate(seen) if "agent" in line and "started" in line)
    assert [mark for mark, _ in seen[:started + 1]] == ["---"] * (started + 1)  # the run and the node shown
    assert seen[-1][0] == "SDK" and "completed" in seen[-1][1]  # then the model was called through it
