"""The fake Messages API's HTTP side: a threaded loopback server whose handler asks the fake for each
request's response and writes it as the real API would (JSON, an SSE stream in chunks, a stream cut
off with FIN or RST). A client that drops its connection (a killed process, a reset) is dropped
quietly: no traceback."""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Protocol, cast
from urllib.parse import urlsplit

from flowkernel.testing.fake_wire import (
    COUNT_TOKENS_PATH,
    ErrorReply,
    Held,
    JSONObject,
    RecordedRequest,
    Response,
    StreamReply,
    complaint,
    error_body,
    message_json,
    sse,
    stream_events,
)


class Fake(Protocol):
    """What the handler asks of the fake (``FakeAnthropic``) it serves."""

    _stopping: threading.Event

    @property
    def requests(self) -> list[RecordedRequest]: ...

    def _track(self, conn: socket.socket) -> None: ...

    def _untrack(self, conn: socket.socket) -> None: ...

    def _wait_gate(self, gate: threading.Event) -> None: ...

    def _take(self, method: str, path: str, headers: Mapping[str, str], body: Any,
              raw: bytes) -> tuple[int, Response]: ...

    def _count_tokens(self, method: str, path: str, headers: Mapping[str, str], body: Any,
                      raw: bytes) -> tuple[int, JSONObject]: ...


class FakeServer(ThreadingHTTPServer):
    # Handler threads are joined on close (after their sockets are shut), so no test leaks threads.
    daemon_threads = False
    block_on_close = True

    def __init__(self, fake: Fake) -> None:
        self.fake = fake
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client killed or reset while its keep-alive connection idles (the handler waits for its
        # next request line): nothing to report. Anything else is a bug of the fake's, shown as usual.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked bodies, as the SDK's pool expects

    @property
    def fake(self) -> Fake:
        return cast(FakeServer, self.server).fake

    def setup(self) -> None:
        super().setup()
        self.fake._track(self.connection)

    def finish(self) -> None:
        self.fake._untrack(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean; every request is in fake.requests instead

    def do_POST(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = urlsplit(self.path).path
        if self.command == "POST" and path == COUNT_TOKENS_PATH:
            status, payload = self.fake._count_tokens(self.command, path, headers, body, raw)
            self._send_json(status, payload, {})
            return
        index, response = self.fake._take(self.command, path, headers, body, raw)
        try:
            self._serve(index, response, body)
        except OSError:
            self.close_connection = True  # the client went away mid-response; nothing to tell it

    def _serve(self, index: int, response: Response, body: Any) -> None:
        request_id = f"req_fake_{index}"
        if isinstance(response, Held):
            if response.delay > 0:
                self.fake._stopping.wait(response.delay)
            if response.release is not None:
                self.fake._wait_gate(response.release)
            if self.fake._stopping.is_set():
                self.close_connection = True
                return
            self._serve(index, response.response, body)
            return
        if isinstance(response, ErrorReply):
            self._send_error(response, index)
            return
        wants_stream = isinstance(body, dict) and body.get("stream") is True
        reply = response.reply if isinstance(response, StreamReply) else response
        model = reply.model or (body.get("model") if isinstance(body, dict) else None) or "claude-fake"
        message_id = reply.id or f"msg_fake_{index}"
        if not wants_stream:
            if isinstance(response, StreamReply):
                problem = (
                    f"fake: scripted a {response.ending} stream but request {index} did not ask to stream"
                )
                self._send_error(complaint(problem), index)
                return
            message = message_json(reply, model=model, message_id=message_id, request_index=index)
            self._send_json(200, message, {"request-id": request_id})
            return
        events = stream_events(reply, model=model, message_id=message_id, request_index=index)
        ending: Literal["error", "clean", "fin", "reset"] = "clean"
        if isinstance(response, StreamReply):
            events, ending = events[: response.stop], response.ending
            if ending == "error":
                error = error_body(response.error_type, response.error_message, request_id)
                del error["request_id"]  # in-stream errors carry no request_id in their data
                events.append(("error", error))
        self._send_stream(events, ending, request_id)

    def _send_json(self, status: int, payload: JSONObject, headers: Mapping[str, str]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status, "Overloaded" if status == 529 else None)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, error: ErrorReply, index: int) -> None:
        request_id = f"req_fake_{index}"
        message = error.message
        if error.echo_headers:
            headers = dict(self.fake.requests[index].headers)
            message = f"{message} (request headers: {json.dumps(headers)})"
        body = error_body(error.error_type, message, request_id, error.error_code)
        self._send_json(error.status, body, {"request-id": request_id, **error.headers})

    def _send_stream(
        self,
        events: Sequence[tuple[str, JSONObject]],
        ending: Literal["error", "clean", "fin", "reset"],
        request_id: str,
    ) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", request_id)
        self.end_headers()
        for name, data in events:
            # One event per chunk, written at once, so the client sees them arrive one by one.
            payload = sse(name, data)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        if ending == "fin":
            # Drop the connection without the terminating zero-length chunk.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif ending == "reset":
            self.close_connection = True
            # Linger 0 makes close() send RST, as a crashed proxy would.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        else:
            self.wfile.write(b"0\r\n\r\n")


def shut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its handler
