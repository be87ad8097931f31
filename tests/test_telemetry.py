"""OpenTelemetry: a run is one trace of workflow, node run, agent, model call and tool spans with the
GenAI attributes; content only when asked; a resumed run continues its trace; exporters that fail
change nothing; off, nothing of OpenTelemetry is imported.

Spans are captured with the SDK's in-memory exporter, and through the real OTLP/HTTP exporter of a
``flowkernel run`` process to a loopback receiver this test starts.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.agents.tools import tool
from flowkernel.telemetry.traces import CAPTURE_CONTENT_ENV
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.claude_support import make_kernel
from tests.test_postgres import pg_url  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parent.parent
CONTENT_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
                "gen_ai.tool.call.arguments", "gen_ai.tool.call.result")

FLOW = {"name": "traced", "nodes": [
    {"id": "agent", "type": "claude.agent", "input": {"prompt": "Look up a.", "system": "Be brief.",
                                                     "tools": ["lookup"]}},
    {"id": "after", "type": "transform", "input": {"expr": "agent.text"}},
], "edges": [{"from": "agent", "to": "after"}]}


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


@pytest.fixture(autouse=True)
def no_content_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CAPTURE_CONTENT_ENV, raising=False)


def in_memory() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def script_lookup(fake: FakeAnthropic) -> None:
    fake.script(reply(Text("Looking."), ToolUse("lookup", {"key": "a"}, id="toolu_a"), input_tokens=100,
                      cache_read_input_tokens=50, cache_creation_input_tokens=20, output_tokens=7, id="msg_1"),
                reply(Text("a is 1"), input_tokens=30, output_tokens=4, id="msg_2"))


async def traced_run(tmp_path: Path, fake: FakeAnthropic, provider: Any) -> Any:
    script_lookup(fake)
    kernel = make_kernel(tmp_path, fake, tracer_provider=provider)
    kernel.registry.add_tool("lookup", tool(lambda key: f"{key} is 1"))
    snap = await kernel.run(kernel.compile(FLOW), {})
    assert snap.status == "completed"
    return snap


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    [found] = [s for s in spans if s.name == name]
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_run_is_one_trace_of_workflow_node_agent_chat_and_tool_spans(tmp_path: Path,
                                                                             fake: FakeAnthropic) -> None:
    provider, exporter = in_memory()
    snap = await traced_run(tmp_path, fake, provider)
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == sorted([
        "invoke_workflow traced", "run_node agent", "run_node after", "invoke_agent agent",
        "chat claude-sonnet-5-5", "chat claude-sonnet-5-5", "execute_tool lookup"])
    assert len({s.context.trace_id for s in spans}) == 1

    workflow, agent_node, after_node = (one(spans, n) for n in ("invoke_workflow traced", "run_node agent",
                                                                "run_node after"))
    agent, tool_span = one(spans, "invoke_agent agent"), one(spans, "execute_tool lookup")
    chats = sorted((s for s in spans if s.name.startswith("chat ")), key=lambda s: s.start_time or 0)
    assert parent_of(workflow) is None
    assert parent_of(agent_node) == parent_of(after_node) == workflow.context.span_id
    assert parent_of(agent) == agent_node.context.span_id
    assert all(parent_of(s) == agent.context.span_id for s in [*chats, tool_span])

    attrs = dict(workflow.attributes or {})
    assert attrs["gen_ai.operation.name"] == "invoke_workflow" and attrs["flowkernel.run.id"] == snap.runId
    node_attrs = dict(agent_node.attributes or {})
    assert node_attrs["flowkernel.node.type"] == "claude.agent" and node_attrs["flowkernel.node_run.id"] == \
        snap.nodeRuns["agent"]
    session = snap.agentSessions["agent"]
    agent_attrs = dict(agent.attributes or {})
    assert agent_attrs["gen_ai.operation.name"] == "invoke_agent" and agent_attrs["gen_ai.provider.name"] == "anthropic"
    assert agent_attrs["gen_ai.conversation.id"] == session and agent_attrs["gen_ai.usage.output_tokens"] == 11
    first = dict(chats[0].attributes or {})
    assert first["gen_ai.operation.name"] == "chat" and first["gen_ai.provider.name"] == "anthropic"
    assert first["gen_ai.request.model"] == "claude-sonnet-5-5" and first["gen_ai.conversation.id"] == session
    assert first["gen_ai.response.finish_reasons"] == ("tool_use",) and first["gen_ai.response.id"] == "msg_1"
    # Anthropic's input_tokens leaves cache reads and writes out; the convention counts them in
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (170, 7)
    assert (first["gen_ai.usage.cache_read.input_tokens"], first["gen_ai.usage.cache_creation.input_tokens"]) == \
        (50, 20)
    assert dict(chats[1].attributes or {})["gen_ai.response.finish_reasons"] == ("end_turn",)
    tool_attrs = dict(tool_span.attributes or {})
    assert (tool_attrs["gen_ai.tool.name"], tool_attrs["gen_ai.tool.call.id"]) == ("lookup", "toolu_a")
    # no message or tool content unless asked for
    assert not [k for s in spans for k in (s.attributes or {}) if k in CONTENT_KEYS]


async def test_content_goes_on_spans_only_when_capture_is_on(tmp_path: Path, fake: FakeAnthropic,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    provider, exporter = in_memory()
    await traced_run(tmp_path, fake, provider)
    spans = exporter.get_finished_spans()
    chat = min((s for s in spans if s.name.startswith("chat ")), key=lambda s: s.start_time or 0)
    attrs = dict(chat.attributes or {})
    assert json.loads(str(attrs["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "Look up a."}]}]
    assert json.loads(str(attrs["gen_ai.system_instructions"])) == [{"type": "text", "content": "Be brief."}]
    output = json.loads(str(attrs["gen_ai.output.messages"]))
    assert output[0]["parts"][1] == {"type": "tool_call", "id": "toolu_a", "name": "lookup", "arguments": {"key": "a"}}
    tool_attrs = dict(one(spans, "execute_tool lookup").attributes or {})
    assert json.loads(str(tool_attrs["gen_ai.tool.call.arguments"])) == {"key": "a"}
    assert tool_attrs["gen_ai.tool.call.result"] == "a is 1"


async def test_a_resumed_run_continues_its_trace_from_the_stored_context(tmp_path: Path,
                                                                       fake: FakeAnthropic) -> None:
    doc = {"name": "asks", "nodes": [{"id": "ask", "type": "human.input", "input": {"prompt": "Go on?"}},
                                     {"id": "done", "type": "noop", "input": {"answer": "{{ ask }}"}}],
           "edges": [{"from": "ask", "to": "done"}]}
    provider, exporter = in_memory()
    kernel = make_kernel(tmp_path, fake, tracer_provider=provider)
    waiting = await kernel.run(kernel.compile(doc), {})
    assert waiting.status == "waiting"
    # another kernel on the same file, as another process would be: only the store carries the context
    other = make_kernel(tmp_path, fake, tracer_provider=provider)
    done = await other.reply(waiting.runId, waiting.waiting["ask"].runId, "yes")
    assert done.status == "completed"
    first, second = sorted((s for s in exporter.get_finished_spans() if s.name == "invoke_workflow asks"),
                           key=lambda s: s.start_time or 0)
    assert first.context.trace_id == second.context.trace_id
    assert parent_of(second) == first.context.span_id
    assert dict(second.attributes or {})["flowkernel.run.resumed"] is True
    done_node = one(exporter.get_finished_spans(), "run_node done")
    assert parent_of(done_node) == second.context.span_id


class Failing(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        raise ConnectionError("collector unreachable")


async def test_failing_or_slow_exporters_never_fail_or_slow_a_run(tmp_path: Path, fake: FakeAnthropic) -> None:
    failing = TracerProvider()
    failing.add_span_processor(SimpleSpanProcessor(Failing()))
    snap = await traced_run(tmp_path / "a", fake, failing)
    assert snap.outputs["after"] == "a is 1"

    # An exporter that never answers until the test lets it: the run finishes anyway (were it to
    # wait on the exporter, it would never finish, and the deadline would say so).
    release, entered = threading.Event(), threading.Event()

    class Stuck(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            entered.set()
            release.wait()
            raise ConnectionError("collector unreachable")

    slow = TracerProvider()
    slow.add_span_processor(BatchSpanProcessor(Stuck(), schedule_delay_millis=1))
    try:
        with anyio.fail_after(60):
            snap = await traced_run(tmp_path / "b", fake, slow)
        assert snap.outputs["after"] == "a is 1"
        assert entered.wait(60) and not release.is_set(), "the exporter was stuck while the run ran"
    finally:
        release.set()

    class Broken:
        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("no tracer today")

    snap = await traced_run(tmp_path / "c", fake, Broken())
    assert snap.outputs["after"] == "a is 1"


# --- processes: the global provider, OTLP/HTTP, and nothing imported when off ------------------

def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_off_by_default_nothing_of_opentelemetry_is_imported(clean_env: dict[str, str]) -> None:
    env = {k: v for k, v in clean_env.items() if not k.startswith("OTEL_")}
    done = _python(
        "import sys, anyio\n"
        "from flowkernel.run.kernel import Kernel\n"
        "from flowkernel.store.memory import MemoryStore\n"
        "k = Kernel(MemoryStore())\n"
        "snap = anyio.run(k.run, k.load_flow('flows/hello.json'), {'name': 'Ada'})\n"
        "print(snap.status, sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n", env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "completed []"


def test_the_tracer_provider_an_embedding_program_set_gets_the_spans(clean_env: dict[str, str]) -> None:
    env = {k: v for k, v in clean_env.items() if not k.startswith("OTEL_")}
    done = _python(
        "import anyio\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "exporter = InMemorySpanExporter(); provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter)); trace.set_tracer_provider(provider)\n"
        "from flowkernel.run.kernel import Kernel\n"
        "from flowkernel.store.memory import MemoryStore\n"
        "k = Kernel(MemoryStore())\n"
        "tracer = trace.get_tracer('app')\n"
        "with tracer.start_as_current_span('request') as outer:\n"
        "    anyio.run(k.run, k.load_flow('flows/hello.json'), {'name': 'Ada'})\n"
        "spans = exporter.get_finished_spans()\n"
        "workflow = next(s for s in spans if s.name == 'invoke_workflow hello')\n"
        "print(workflow.parent.span_id == outer.get_span_context().span_id, len({s.context.trace_id for s in spans}))\n",
        env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True 1"  # the run's trace is the caller's


class _Receiver(BaseHTTPRequestHandler):
    spans: list[tuple[str, dict[str, Any]]]

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.server.spans.append((span.name, resource))  # type: ignore[attr-defined]
        payload = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.spans = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def _run_review_loop(env: dict[str, str], db: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "flowkernel.cli", "run", "flows/review-loop.json", "--input",
                           "feature=CSV export", "--fixtures", "fixtures/review-loop", "--db", str(db)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    return done


def test_otlp_endpoint_exports_the_trace_over_http(receiver: ThreadingHTTPServer, clean_env: dict[str, str],
                                                   tmp_path: Path) -> None:
    env = {**{k: v for k, v in clean_env.items() if not k.startswith("OTEL_")},
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_address[1]}"}
    done = _run_review_loop(env, tmp_path / "runs.db")
    assert done.returncode == 0, done.stderr
    names = [name for name, _ in receiver.spans]  # type: ignore[attr-defined]
    assert "invoke_workflow review-loop" in names and names.count("invoke_agent coder") == 2
    assert names.count("chat claude-sonnet-5-5") == 5 and "run_node reviewer" in names
    assert {resource.get("service.name") for _, resource in receiver.spans} == {"flowkernel"}  # type: ignore[attr-defined]


def test_an_unreachable_otlp_endpoint_changes_nothing_about_the_run(clean_env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    env = {k: v for k, v in clean_env.items() if not k.startswith("OTEL_")}
    quiet = _run_review_loop(env, tmp_path / "a.db")
    assert quiet.returncode == 0, quiet.stderr
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there
    done = _run_review_loop(env, tmp_path / "b.db")
    assert done.returncode == 0, done.stderr
    assert "completed" in done.stdout and "Traceback" not in done.stderr
    assert _outcome(tmp_path / "b.db") == _outcome(tmp_path / "a.db")


def _outcome(db: Path) -> tuple[Any, list[tuple[str, str | None]]]:
    """What a user gets from the only run in ``db``: its outputs and the events' types and nodes."""
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.open import open_store

    kernel = Kernel(open_store(str(db)))
    try:
        (run,) = kernel.store.list_runs(limit=2)
        events = [(e.type, getattr(e, "nodeId", None)) for e in kernel.events(run.runId)
                  if not e.type.endswith(":delta")]
        outputs = {node: {k: v for k, v in out.items() if k != "sessionId"} if isinstance(out, dict) else out
                   for node, out in kernel.snapshot(run.runId).outputs.items()}  # session ids are per run
        return outputs, events
    finally:
        kernel.close()


def test_the_flush_at_exit_leaves_when_its_bound_is_up_though_the_exporter_never_answers() -> None:
    # An exporter stuck in its retries must not hold the process at exit past FLUSH_AT_EXIT_MS.
    from flowkernel.telemetry import traces as telemetry

    never = threading.Event()

    class Stuck:
        def force_flush(self, timeout_millis: int) -> bool:
            never.wait()
            return True

    flushing = threading.Thread(target=telemetry._flush, args=(Stuck(),), daemon=True)
    flushing.start()
    flushing.join(telemetry.FLUSH_AT_EXIT_MS / 1000 + 60)  # a deadline for the test, not a measurement
    try:
        assert not flushing.is_alive(), "the flush at exit waited on a stuck exporter"
    finally:
        never.set()


def test_every_store_keeps_the_first_trace_context_of_a_run(tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    from flowkernel.store.memory import MemoryStore
    from flowkernel.store.sql.postgres import PostgresStore
    from flowkernel.store.sql.sqlite import SqliteStore

    first = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for store in (MemoryStore(), SqliteStore(tmp_path / "runs.db"), PostgresStore(pg_url)):
        assert store.get_trace_context("run_x") is None
        store.set_trace_context("run_x", first)
        store.set_trace_context("run_x", "00-" + "1" * 32 + "-" + "2" * 16 + "-01")  # a later one is ignored
        assert store.get_trace_context("run_x") == first
        store.close()


def _exit_delay(env: dict[str, str], tmp_path: Path, db: str) -> tuple[float, str]:
    """Run a one-node flow through the console script: seconds from its closing line to the process's
    exit, and its stderr."""
    flow = tmp_path / "one.json"
    flow.write_text(json.dumps({"name": "one", "nodes": [{"id": "a", "type": "noop", "input": {"v": 1}}]}))
    proc = subprocess.Popen([sys.executable, "-m", "flowkernel", "run", str(flow), "--db", str(tmp_path / db)],
                            cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    ended = None
    for line in proc.stdout:
        if "■ completed" in line:
            ended = time.monotonic()
    proc.wait(timeout=60)
    exited = time.monotonic()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.returncode == 0 and ended is not None, err
    return exited - ended, err


def test_an_unreachable_endpoint_costs_one_line_and_at_most_a_second_at_exit(clean_env: dict[str, str],
                                                                             tmp_path: Path) -> None:
    env = {k: v for k, v in clean_env.items() if not k.startswith("OTEL_")}
    with socket.socket() as s:  # a loopback port nothing listens on: connections are refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plain, quiet = _exit_delay(env, tmp_path, "plain.db")
    assert quiet == ""
    delay, err = _exit_delay({**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}, tmp_path,
                             "traced.db")
    lines = err.splitlines()
    assert len(lines) == 1, err  # no retry messages of the exporter's, no traceback
    # The run's own spans (workflow, node) are what could not be sent.
    assert re.search(rf"WARNING flowkernel\.telemetry: 2 spans not sent to http://127\.0\.0\.1:{port}/v1/traces "
                     r"\(Connection refused\) in the 0\.6 s allowed at exit: dropped$", lines[0]), err
    # A generous bound (the machine may be busy); the exporter's own retries would take seconds.
    assert delay < plain + 1.0, (delay, plain)


def test_exports_failing_while_a_process_works_are_logged_once_until_one_succeeds(
        caplog: pytest.LogCaptureFixture) -> None:
    from flowkernel.telemetry.traces import _Tally

    tally = _Tally("http://collector/v1/traces")
    with caplog.at_level("INFO", logger="flowkernel.telemetry"):
        for _ in range(3):
            tally.exported(5, False, ConnectionError("[Errno 111] Connection refused"))
        tally.exported(5, True)
        tally.exported(5, False, TimeoutError("read timed out"))
        tally.exiting = True
        tally.exported(5, False, TimeoutError("read timed out"))  # part of the line at exit instead
    assert [r.getMessage() for r in caplog.records] == [
        "cannot export spans to http://collector/v1/traces (Connection refused); retrying in the background, "
        "and spans still not sent at exit are dropped",
        "exporting spans to http://collector/v1/traces again",
        "cannot export spans to http://collector/v1/traces (TimeoutError: read timed out); retrying in the "
        "background, and spans still not sent at exit are dropped"]
    assert tally.sent == 5
