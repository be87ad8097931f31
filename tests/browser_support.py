"""The web UI's test kit: a real ``flowkernel serve`` process, a headless Chromium from the system's
packages driven by Playwright, and runs executed the way a worker process would execute them.

Chromium is the one Debian ships (``/usr/bin/chromium``; ``.ci/run`` installs it when missing), never
a browser Playwright downloads. Without it, or without Playwright, the browser tests skip and say why.
Every page records its console messages and every request it makes, so a test can assert that the
page talked to nobody but the server and logged no error.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from flowkernel.errors import RunBusyError
from flowkernel.ids import new_run_id
from flowkernel.run.kernel import Kernel
from flowkernel.store.open import open_store

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"  # screenshots; git-ignored
# Without these Chromium reaches out to Google's hosts (updates, sync, field trials) on its own.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-default-apps", "--disable-extensions",
                 "--disable-features=Translate,OptimizationHints,MediaRouter", "--metrics-recording-only",
                 "--no-default-browser-check", "--password-store=basic"]
WAIT_MS = 20_000  # how long an expectation may take to come true in the page


def chromium_path() -> str | None:
    """The system's Chromium (FLOWKERNEL_CHROMIUM overrides), or None."""
    for candidate in (os.environ.get("FLOWKERNEL_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def why_no_browser() -> str | None:
    """Why the browser tests cannot run here, or None if they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -e '.[test]')"
    if chromium_path() is None:
        return ("no Chromium: install Debian's `chromium` package (.ci/run does when it can) or set "
                "FLOWKERNEL_CHROMIUM to a Chromium binary")
    return None


@dataclass
class Server:
    """A ``flowkernel serve`` process on a loopback port."""

    url: str
    db: str
    process: subprocess.Popen[str]
    token: str | None = None

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        with self.client() as http:
            return http.request(method, f"/api/v1{path}", **kw)


SERVING = re.compile(r"serving http://127\.0\.0\.1:(\d+)/")


@contextmanager
def serve(db: str, *args: str, token: str | None = None, env: dict[str, str] | None = None,
          port: int | None = None) -> Iterator[Server]:
    """``flowkernel serve --db DB ARGS`` until the block ends (then SIGTERM, as a user stops it).
    It listens on a port the OS picks (``--port 0``; it prints which), or on ``port``: where a
    restarted server comes back. Its stderr goes to a file, so a chatty server never fills a pipe."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", **(env or {})}
    environment.pop("FLOWKERNEL_API_TOKEN", None)
    if token:
        environment["FLOWKERNEL_API_TOKEN"] = token
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "flowkernel", "serve", "--port", str(port or 0), "--db", db, *args],
            stdout=subprocess.DEVNULL, stderr=log, text=True, env=environment, cwd=str(ROOT))

        def printed() -> str:
            log.seek(0)
            return log.read()

        try:
            deadline = time.monotonic() + 30
            while not (found := SERVING.search(printed())):
                if process.poll() is not None:
                    raise RuntimeError(f"flowkernel serve exited: {printed()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"flowkernel serve did not say where it listens within 30 s: {printed()}")
                time.sleep(0.05)
            url = f"http://127.0.0.1:{found.group(1)}"
            assert httpx.get(f"{url}/api/v1/health", timeout=10).status_code == 200
            yield Server(url=url, db=db, process=process, token=token)
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class Executor:
    """Executes runs in threads of the test process, each with its own kernel on the server's store:
    to the server this is another process executing runs, as a worker is. ``services`` are the
    kernel's (e.g. ``{"query_fn": MockQuery(fixtures)}`` for model calls from fixtures)."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def _in_thread(self, work: Callable[[Kernel], Any], services: dict[str, Any] | None) -> threading.Thread:
        def target() -> None:
            kernel = Kernel(open_store(self.db), services=dict(services or {}))
            try:
                anyio.run(work, kernel)
            except BaseException as exc:
                self.errors.append(exc)
            finally:
                kernel.close()

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def start(self, flow: Path, input: Any = None, *, services: dict[str, Any] | None = None) -> str:
        """Create a run of ``flow`` and execute it in the background; returns its id once it is stored."""
        return self._start(flow, input, services)[0]

    def run(self, flow: Path, input: Any = None, *, services: dict[str, Any] | None = None) -> str:
        """Create a run of ``flow`` and execute it until it stops (completed, waiting, failed...)."""
        run_id, thread = self._start(flow, input, services)
        thread.join(60)
        assert not thread.is_alive(), f"run {run_id} did not stop within 60 s"
        if self.errors:
            raise self.errors[0]
        return run_id

    def _start(self, flow: Path, input: Any, services: dict[str, Any] | None) -> tuple[str, threading.Thread]:
        run_id = new_run_id()

        async def work(kernel: Kernel) -> None:
            await kernel.run(kernel.load_flow(flow), input, run_id=run_id)

        thread = self._in_thread(work, services)
        with _Probe(self.db) as probe:
            probe.wait_for_run(run_id)
        return run_id, thread

    def continue_run(self, run_id: str, *, services: dict[str, Any] | None = None) -> None:
        """Go on with a run a reply was delivered to, in the background (what a worker does)."""

        async def work(kernel: Kernel) -> None:
            try:
                await kernel.continue_run(run_id)
            except RunBusyError:
                pass  # a worker of the server took it first: it goes on all the same

        self._in_thread(work, services)

    def retry(self, run_id: str, *, flow: Path | None = None) -> None:
        """Re-run the failed nodes of a failed run in the background, as ``flowkernel retry [--flow FILE]`` does."""

        async def work(kernel: Kernel) -> None:
            await kernel.retry(run_id, flow=kernel.load_flow(flow) if flow is not None else None)

        self._in_thread(work, None)

    def join(self, timeout: float = 30) -> None:
        for thread in self.threads:
            thread.join(timeout)
        assert not [t for t in self.threads if t.is_alive()], "a run executed by the test did not stop"
        if self.errors:
            raise self.errors[0]


@dataclass
class Watched:
    """A page and what it did: console messages, uncaught errors, every URL it requested."""

    page: Any
    server: str
    console: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def goto(self, fragment: str = "") -> None:
        self.page.goto(f"{self.server}/{fragment}")

    def foreign_requests(self) -> list[str]:
        origin = urlsplit(self.server)
        return [u for u in self.requests if not u.startswith(("data:", "blob:"))
                and (urlsplit(u).scheme, urlsplit(u).netloc) != (origin.scheme, origin.netloc)]

    def console_errors(self, *, allowed: tuple[str, ...] = ()) -> list[str]:
        found = [text for kind, text in self.console if kind in ("error", "assert")]
        return [t for t in [*found, *self.errors] if not any(a in t for a in allowed)]

    def assert_clean(self, *, allowed: tuple[str, ...] = ()) -> None:
        """No request to any host but the server, no console error (``allowed``: expected ones)."""
        assert self.foreign_requests() == [], self.foreign_requests()
        assert self.console_errors(allowed=allowed) == [], self.console_errors(allowed=allowed)

    def screenshot(self, name: str, *, full_page: bool = False) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path


def watch(page: Any, server: str) -> Watched:
    watched = Watched(page=page, server=server)
    page.on("console", lambda m: watched.console.append((m.type, m.text)))
    page.on("pageerror", lambda e: watched.errors.append(f"uncaught: {e}"))
    page.on("request", lambda r: watched.requests.append(r.url))
    page.set_default_timeout(WAIT_MS)
    return watched


class _Probe:
    """A short-lived store connection to wait for a run to be stored."""

    def __init__(self, db: str) -> None:
        self.store = open_store(db)

    def __enter__(self) -> _Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()

    def wait_for_run(self, run_id: str, timeout: float = 20) -> None:
        from flowkernel.errors import UnknownRunError

        deadline = time.monotonic() + timeout
        while True:
            try:
                self.store.get_run(run_id)
                return
            except UnknownRunError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"run {run_id} was not stored within {timeout} s") from None
                time.sleep(0.02)
