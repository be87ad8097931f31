"""No cross-site commands: every request that changes state is JSON and comes from the server's own
pages or an origin given with `--cors-origin`. Against a real `flowkernel serve` process; the same
requests from a page in Chromium are in tests/test_webui_crosssite.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from flowkernel.run.kernel import Kernel
from flowkernel.server.crosssite import cors_origin
from flowkernel.store.open import open_store

from tests.browser_support import serve

PROBLEM = "application/problem+json"
ASK = {"name": "ask", "nodes": [{"id": "q", "type": "human.input", "input": {"prompt": "Proceed?"}}], "edges": []}
OTHER_PORT = "http://127.0.0.1:1"  # a page of another loopback port: same site, another origin


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    k = Kernel(open_store(str(tmp_path / "runs.db"), create=True))
    yield k
    k.close()


def waiting_run(kernel: Kernel) -> str:
    """A run waiting at ``q``, executed here as `flowkernel run` would (the server only answers)."""
    snap = anyio.run(kernel.run, kernel.compile(ASK), {})
    assert snap.status == "waiting"
    return snap.runId


def assert_refused(answer: httpx.Response, status: int, says: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = answer.json()
    assert body["status"] == status and says in body["detail"], body
    return body


def unchanged(kernel: Kernel, run_id: str, seq: int) -> None:
    """Still waiting, and nothing recorded: the refusal happened before any command was judged."""
    record = kernel.store.get_run(run_id)
    assert (record.status, record.seq) == ("waiting", seq)


def test_a_command_that_is_not_json_is_refused_with_415_and_changes_nothing(kernel: Kernel) -> None:
    run_id = waiting_run(kernel)
    seq = kernel.store.get_run(run_id).seq
    with serve(kernel.store.location, "--workers", "0") as server, server.client() as http:
        for kind in ("abort", "pause", "resume", "retry"):
            url = f"/api/v1/runs/{run_id}/{kind}"
            # what a page of any origin can send without asking first: text/plain, a form, no type at all
            assert_refused(http.post(url, content=b"", headers={"Content-Type": "text/plain"}), 415,
                           "Content-Type: application/json")
            assert_refused(http.post(url, data={"reason": "x"}), 415, "application/json")
            assert_refused(http.post(url, files={"f": b"x"}), 415, "application/json")
            assert_refused(http.post(url), 415, "an empty body as `{}`")
            unchanged(kernel, run_id, seq)
        body = json.dumps({"flowDocument": ASK, "input": {}})
        assert_refused(http.post("/api/v1/runs", content=body, headers={"Content-Type": "text/plain"}), 415, "JSON")
        assert [r["runId"] for r in http.get("/api/v1/runs").json()["items"]] == [run_id]  # no run made
        # JSON, an empty object included, is a command like any other
        aborted = http.post(f"/api/v1/runs/{run_id}/abort", content=b"{}",
                            headers={"Content-Type": "application/json; charset=utf-8"})
        assert aborted.status_code == 202, aborted.text
    assert kernel.store.get_run(run_id).status == "aborted"


def test_a_command_from_another_origin_is_refused_with_403_and_changes_nothing(kernel: Kernel) -> None:
    run_id = waiting_run(kernel)
    seq = kernel.store.get_run(run_id).seq
    with serve(kernel.store.location, "--workers", "0") as server, server.client() as http:
        url = f"/api/v1/runs/{run_id}/abort"
        port = server.url.rsplit(":", 1)[1]
        for headers in ({"Origin": OTHER_PORT}, {"Origin": f"http://localhost:{port}"}, {"Origin": "null"},
                        {"Origin": "https://attacker.example"}, {"Origin": f"https://127.0.0.1:{port}.example"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                        {"Origin": OTHER_PORT, "Sec-Fetch-Site": "same-origin"}):
            assert_refused(http.post(url, json={}, headers=headers), 403, "--cors-origin")
            unchanged(kernel, run_id, seq)
        assert_refused(http.post("/api/v1/runs", json={"flowDocument": ASK, "input": {}},
                                 headers={"Origin": OTHER_PORT}), 403, "another origin")
        assert [r["runId"] for r in http.get("/api/v1/runs").json()["items"]] == [run_id]  # no run made
        # reads stay as they were (the browser keeps their answers from other origins)
        assert http.get(f"/api/v1/runs/{run_id}", headers={"Origin": OTHER_PORT}).status_code == 200
        # the server's own pages, as a browser sends them
        own = http.post(url, json={"reason": "from the web UI"},
                        headers={"Origin": server.url, "Sec-Fetch-Site": "same-origin"})
        assert own.status_code == 202, own.text
    assert kernel.store.get_run(run_id).status == "aborted"


def test_an_origin_given_with_cors_origin_may_send_commands_and_gets_cors_answers(kernel: Kernel) -> None:
    run_id = waiting_run(kernel)
    listed = "http://localhost:5173"
    with serve(kernel.store.location, "--workers", "0", "--cors-origin", listed + "/") as server, \
            server.client() as http:
        url = f"/api/v1/runs/{run_id}/abort"
        preflight = http.options(url, headers={"Origin": listed, "Access-Control-Request-Method": "POST",
                                               "Access-Control-Request-Headers": "content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == listed
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "content-type" in preflight.headers["access-control-allow-headers"].lower()
        # a listed origin still sends JSON: its refusal is readable there
        plain = http.post(url, content=b"", headers={"Origin": listed, "Content-Type": "text/plain",
                                                     "Sec-Fetch-Site": "cross-site"})
        assert_refused(plain, 415, "application/json")
        assert plain.headers["access-control-allow-origin"] == listed
        assert_refused(http.post(url, json={}, headers={"Origin": "http://localhost:5174"}), 403, "another origin")
        done = http.post(url, json={}, headers={"Origin": listed, "Sec-Fetch-Site": "cross-site"})
        assert done.status_code == 202, done.text
        assert done.headers["access-control-allow-origin"] == listed
    assert kernel.store.get_run(run_id).status == "aborted"


@pytest.mark.parametrize("value", ["*", "localhost:5173", "http://localhost:5173/app", "ftp://example.com"])
def test_a_cors_origin_must_be_an_origin(value: str) -> None:
    with pytest.raises(ValueError, match="scheme://host"):
        cors_origin(value)
