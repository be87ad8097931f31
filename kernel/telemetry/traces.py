"""OpenTelemetry traces of runs (DESIGN §12): one trace per run, a span per execution, node run,
agent, model call and tool call, with the GenAI semantic-convention attributes.

On when a tracer provider is given (``RunServices.tracer_provider``), when the embedding program set a tracer provider
(``opentelemetry.trace.set_tracer_provider``), or when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set: then flowkernel exports over OTLP/HTTP itself (the
``otel`` extra). ``OTEL_SDK_DISABLED=true`` turns it off. Off, it costs a context-variable lookup per
span site: this module imports ``opentelemetry`` only once one of the above holds, and checks for an
embedding program's provider only if that program imported ``opentelemetry.trace`` already.

A run's trace context (W3C ``traceparent`` of its first execution's span) is stored with the run, so
an execution after a pause, a human wait, a crash or in another process continues the same trace.
Telemetry never affects a run: every failure in it is swallowed (logged once on ``flowkernel.telemetry``),
and spans are handed to the provider's processors, which export in the background.

The OTLP exporter flowkernel makes for itself is kept quiet and bounded: its own retry messages are
not logged; an export that fails while the process works is logged once (until one succeeds again);
and at exit what is left is sent for at most ``FLUSH_AT_EXIT_MS``, after which the spans not sent are
dropped, with one line saying how many.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowkernel.store.base import Store

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SCOPE = "flowkernel"
FLUSH_AT_EXIT_MS = 600  # the most exporting may hold up the exit of a process once its work is done

log = logging.getLogger("flowkernel.telemetry")


class _NullSpan:
    """What a span site gets while telemetry is off: every method does nothing."""

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, key: str, value: Any) -> None:
        return None

    def update(self, attributes: Mapping[str, Any]) -> None:
        return None

    def fail(self, error_type: str, message: str = "") -> None:
        return None


NULL_SPAN = _NullSpan()


class _Tracing:
    """The tracer of one run execution, and whether message content goes on spans."""

    def __init__(self, tracer: Any, capture: bool) -> None:
        self.tracer = tracer
        self.capture = capture


_ACTIVE: ContextVar[_Tracing | None] = ContextVar("flowkernel_tracing", default=None)
_warned: set[str] = set()
_own_provider: list[Any] = []  # the OTLP provider flowkernel made for this process, once


def _warn(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def capture_content() -> bool:
    """Message and tool content go on spans (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``)."""
    tracing = _ACTIVE.get()
    return tracing is not None and tracing.capture


def enabled() -> bool:
    """This run execution is traced."""
    return _ACTIVE.get() is not None


def tracer_provider(given: Any = None) -> Any | None:
    """The provider spans go to (``given``: the run's ``RunServices.tracer_provider``), or None when
    telemetry is off (see the module docstring)."""
    if given is not None:
        return given
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if "opentelemetry.trace" in sys.modules:
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        if not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return provider
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return _otlp_provider()
    return None


def _otlp_provider() -> Any | None:
    if _own_provider:
        return _own_provider[0]
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        _warn("extra", "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed; "
                       "pip install 'flowkernel[otel]' to export traces")
        return None
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "flowkernel"}
    # Not shut down at exit by the SDK (that waits on the exporter); flushed for a bounded time instead.
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    exporter = OTLPSpanExporter()
    tally = _Tally(_endpoint_shown())
    # The exporter logs each retry (a multi-line message each): what went wrong goes into our one line.
    logging.getLogger(type(exporter).__module__).addFilter(tally.note)
    counting, ended = _counted(exporter, tally)
    provider.add_span_processor(ended)
    provider.add_span_processor(BatchSpanProcessor(counting))
    atexit.register(_flush, provider, tally)
    _own_provider.append(provider)
    return provider


def _endpoint_shown() -> str:
    """Where spans go, as a line may show it: no user name, password or query."""
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    url = traces or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").rstrip("/") + "/v1/traces"
    return re.sub(r"(://)[^/@]*@", r"\1", url).split("?", 1)[0]


class _Tally:
    """What the process's own exporter did: spans ended and sent, and why an export failed. Updated by
    the exporter's thread, read at exit."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.ended = 0
        self.sent = 0
        self.reason = ""
        self.exiting = False
        self.failing = False  # said so since the last export that worked
        self.lock = threading.Lock()

    def note(self, record: logging.LogRecord) -> bool:
        """A logging filter on the exporter's logger: keeps what went wrong, lets nothing through."""
        with self.lock:
            self.reason = _reason(record)
        return False

    def exported(self, count: int, ok: bool, error: BaseException | None = None) -> None:
        with self.lock:
            if ok:
                self.sent += count
                back, self.failing = self.failing, False
                if back and not self.exiting:
                    log.info("exporting spans to %s again", self.endpoint)
                return
            if error is not None:
                self.reason = _short(f"{type(error).__name__}: {error}")
            if self.failing or self.exiting:
                return
            self.failing = True
        log.warning("cannot export spans to %s (%s); retrying in the background, and spans still not sent "
                    "at exit are dropped", self.endpoint, self.reason or "no reason given")

    def dropped(self) -> int:
        with self.lock:
            return max(0, self.ended - self.sent)


def _counted(exporter: Any, tally: _Tally) -> tuple[Any, Any]:
    """``exporter`` telling ``tally`` what it sent (and never raising), and a span processor that
    counts the spans that end (each one the exporter is handed, or drops)."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Counting(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            try:
                result = exporter.export(spans)
            except Exception as exc:
                tally.exported(len(spans), False, exc)
                return SpanExportResult.FAILURE
            tally.exported(len(spans), result == SpanExportResult.SUCCESS)
            return result  # type: ignore[no-any-return]

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    class Ended(SpanProcessor):
        def on_end(self, span: Any) -> None:
            with tally.lock:
                tally.ended += 1

    return Counting(), Ended()


def _reason(record: logging.LogRecord) -> str:
    """The failure a record of the exporter is about, short: ``Connection refused``, ``code 404``."""
    args = record.args if isinstance(record.args, tuple) else ()
    for arg in args:
        if isinstance(arg, BaseException):
            return _short(str(arg))
    return _short(record.getMessage())


def _short(text: str) -> str:
    errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if errno:
        return errno.group(1).strip()
    text = " ".join(text.split())
    return text if len(text) <= 120 else text[:119] + "…"


def _flush(provider: Any, tally: _Tally | None = None) -> None:
    """At exit: send what is left, for ``FLUSH_AT_EXIT_MS`` at most, then say what was dropped."""
    if tally is not None:
        tally.exiting = True  # a failure now is part of the line below, not a line of its own

    # force_flush exports in the calling thread and waits out the exporter's retries whatever timeout
    # it is given: flush in a daemon thread, and leave when FLUSH_AT_EXIT_MS is up.
    def flush() -> None:
        try:
            provider.force_flush(timeout_millis=FLUSH_AT_EXIT_MS)
        except Exception:
            pass  # counted below as spans not sent

    worker = threading.Thread(target=flush, name="flowkernel-otel-flush", daemon=True)
    worker.start()
    worker.join(FLUSH_AT_EXIT_MS / 1000)
    dropped = tally.dropped() if tally is not None else 0
    if tally is not None and dropped:
        with tally.lock:
            why = tally.reason or "no answer in time"
        log.warning("%d span%s not sent to %s (%s) in the %g s allowed at exit: dropped", dropped,
                    "" if dropped == 1 else "s", tally.endpoint, why, FLUSH_AT_EXIT_MS / 1000)


@contextmanager
def run_execution(given: Any, store: Store, flow_name: str, run_id: str) -> Iterator[Any]:
    """Trace one execution of a run: ``invoke_workflow {flow}``, in the run's stored trace (``given``: the
    run's tracer provider, if any). Yields the span (``NULL_SPAN`` when off), current for everything the
    execution starts."""
    provider = tracer_provider(given)
    if provider is None:
        yield NULL_SPAN
        return
    try:
        span, active = _open_run(provider, store, flow_name, run_id)
    except Exception as exc:
        _warn("start", f"tracing is off for this run: {type(exc).__name__}: {exc}")
        yield NULL_SPAN
        return
    try:
        yield span
    finally:
        span.close(None)
        _ACTIVE.reset(active)


def _open_run(provider: Any, store: Store, flow_name: str, run_id: str) -> tuple[_Span, Any]:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tracer = provider.get_tracer(SCOPE)
    stored = _stored_context(store, run_id)
    # The first execution starts in the caller's trace (or a new one); the others continue it.
    parent = TraceContextTextMapPropagator().extract({"traceparent": stored}) if stored else None
    raw = tracer.start_span(f"invoke_workflow {flow_name}", context=parent, kind=trace.SpanKind.INTERNAL,
                            attributes={"gen_ai.operation.name": "invoke_workflow",
                                        "gen_ai.workflow.name": flow_name, "flowkernel.run.id": run_id,
                                        "flowkernel.run.resumed": stored is not None})
    if stored is None:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(raw))
        try:
            store.set_trace_context(run_id, carrier["traceparent"])
        except Exception as exc:
            _warn("store", f"could not store the run's trace context: {exc}")
    capture = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    active = _ACTIVE.set(_Tracing(tracer, capture))
    return _Span(raw, otel_context.attach(trace.set_span_in_context(raw))), active


def _stored_context(store: Store, run_id: str) -> str | None:
    try:
        return store.get_trace_context(run_id)
    except Exception as exc:
        _warn("read", f"could not read the run's trace context: {exc}")
        return None


class _Span:
    """A live span: attributes, a failure, and its end (with the error an exception names)."""

    def __init__(self, raw: Any, token: Any = None) -> None:
        self.raw = raw
        self.token = token

    def __enter__(self) -> _Span:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(exc)

    def set(self, key: str, value: Any) -> None:
        if value is None:
            return
        try:
            self.raw.set_attribute(key, value)
        except Exception:
            pass

    def update(self, attributes: Mapping[str, Any]) -> None:
        for key, value in attributes.items():
            self.set(key, value)

    def fail(self, error_type: str, message: str = "") -> None:
        try:
            from opentelemetry.trace import Status, StatusCode

            self.raw.set_attribute("error.type", error_type)
            from flowkernel.redaction import redact_text

            self.raw.set_status(Status(StatusCode.ERROR, redact_text(message)[:500] or None))  # exported: no secret
        except Exception:
            pass

    def close(self, exc: BaseException | None) -> None:
        try:
            if isinstance(exc, Exception):
                self.fail(str(getattr(exc, "error_type", None) or type(exc).__name__), str(exc))
            elif exc is not None:
                self.set("flowkernel.cancelled", True)  # a pause, a timeout or a stop: not an error here
            if self.token is not None:
                from opentelemetry import context as otel_context

                otel_context.detach(self.token)
                self.token = None
            self.raw.end()
        except Exception:
            pass


def span(name: str, attributes: Mapping[str, Any] | None = None, *, client: bool = False) -> Any:
    """A child of the current span for this execution, current while it is open (a context manager:
    the span ends, with ``error.type`` if an exception leaves it). ``NULL_SPAN`` when off."""
    tracing = _ACTIVE.get()
    if tracing is None:
        return NULL_SPAN
    try:
        from opentelemetry import context as otel_context
        from opentelemetry import trace

        kind = trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL
        raw = tracing.tracer.start_span(name, kind=kind,
                                        attributes={k: v for k, v in (attributes or {}).items() if v is not None})
        return _Span(raw, otel_context.attach(trace.set_span_in_context(raw)))
    except Exception as exc:
        _warn("span", f"a span could not start: {type(exc).__name__}: {exc}")
        return NULL_SPAN


def node_span(node_id: str, node_type: str, node_run_id: str, attempt: int, item: int | None) -> Any:
    """The span of one node run (``run_node {nodeId}``); built only when telemetry is on."""
    if _ACTIVE.get() is None:
        return NULL_SPAN
    return span(f"run_node {node_id}", {"flowkernel.node.id": node_id, "flowkernel.node.type": node_type,
                                        "flowkernel.node_run.id": node_run_id, "flowkernel.node.attempt": attempt,
                                        "flowkernel.node.item": item})


def content(value: Any) -> str:
    """Content for a span attribute: JSON text (a string stays as it is)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
