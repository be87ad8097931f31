"""`flowkernel serve` answers only for its own names: a request whose `Host` names another server
(what a page whose DNS name was pointed at 127.0.0.1 sends) is a 421, before anything is read or done.
Against a real `flowkernel serve` process on a loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from flowkernel.server import ServerConfig
from flowkernel.server.hosts import allowed_host, host_name

from tests.browser_support import ROOT, Server, serve
from tests.server_support import serving

PROBLEM = "application/problem+json"


def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def asked_as(server: Server, host: str, method: str = "GET", path: str = "/api/v1/runs",
             **kw: object) -> httpx.Response:
    """A request to the server's socket carrying ``Host: host``, as a rebound DNS name makes a browser send."""
    headers = {"Host": host, **dict(kw.pop("headers", {}) or {})}  # type: ignore[call-overload]
    with httpx.Client(base_url=server.url, timeout=30) as http:
        return http.request(method, path, headers=headers, **kw)  # type: ignore[arg-type]


def assert_misdirected(answer: httpx.Response) -> None:
    assert answer.status_code == 421, answer.text
    assert answer.headers["content-type"].startswith(PROBLEM)
    body = answer.json()
    assert body["status"] == 421 and body["title"] == "Misdirected Request"
    assert "--allowed-host" in body["detail"] and "Traceback" not in answer.text


def runs_of(server: Server) -> list[object]:
    items: list[object] = server.api("GET", "/runs").json()["items"]
    return items


HELLO = {"flowDocument": {"name": "hello", "nodes": [{"id": "a", "type": "noop", "input": {}}], "edges": []},
         "input": {}}


def test_without_a_token_a_foreign_host_is_refused_with_421_and_nothing_is_done(tmp_path: Path) -> None:
    with serve(str(tmp_path / "runs.db"), "--workers", "0") as server:
        port = port_of(server)
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example",
                     "localhost.attacker.example", f"[::2]:{port}", "", f"127.0.0.1:{port}:1"):
            assert_misdirected(asked_as(server, host))
        assert_misdirected(asked_as(server, "attacker.example", "POST", "/api/v1/runs", json=HELLO))
        assert_misdirected(asked_as(server, "attacker.example", path="/api/v1/health"))
        assert_misdirected(asked_as(server, "attacker.example", path="/"))  # the web UI too
        assert runs_of(server) == []
        # the server's own names, with and without the port
        for host in ("localhost", f"localhost:{port}", "LOCALHOST", "127.0.0.1", f"127.0.0.1:{port}",
                     f"127.1.2.3:{port}", "[::1]", f"[::1]:{port}"):
            assert asked_as(server, host).status_code == 200, host
        assert asked_as(server, f"localhost:{port}", "POST", "/api/v1/runs", json=HELLO).status_code == 201
        assert asked_as(server, f"localhost:{port}", path="/").status_code == 200


def test_allowed_host_adds_a_name_the_server_answers_for(tmp_path: Path) -> None:
    with serve(str(tmp_path / "runs.db"), "--workers", "0", "--allowed-host", "flowkernel.example.com",
               "--allowed-host", "[FD00::5]") as server:
        assert asked_as(server, "flowkernel.example.com").status_code == 200
        assert asked_as(server, "FlowKernel.Example.com:443").status_code == 200
        assert asked_as(server, "[fd00::5]:8765").status_code == 200
        assert asked_as(server, f"127.0.0.1:{port_of(server)}").status_code == 200  # loopback still
        refused = asked_as(server, "other.example.com")
        assert_misdirected(refused)
        assert "flowkernel.example.com" in refused.json()["detail"]


def test_with_a_token_any_host_is_served_to_its_holder_unless_allowed_hosts_are_named(tmp_path: Path) -> None:
    bearer = {"Authorization": "Bearer s3cret"}
    with serving(str(tmp_path / "a.db"), ServerConfig(token="s3cret")) as live, live.client() as http:
        assert http.get("/api/v1/runs", headers={"Host": "flowkernel.internal:8443", **bearer}).status_code == 200
        assert http.get("/api/v1/runs", headers={"Host": "attacker.example"}).status_code == 401  # the token protects
    config = ServerConfig(token="s3cret", allowed_hosts=["flowkernel.internal"])
    with serving(str(tmp_path / "b.db"), config) as live, live.client() as http:
        assert http.get("/api/v1/runs", headers={"Host": "flowkernel.internal:8443", **bearer}).status_code == 200
        assert_misdirected(http.get("/api/v1/runs", headers={"Host": "attacker.example", **bearer}))


def test_an_allowed_host_that_is_not_a_name_is_refused_at_start(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLOWKERNEL_API_TOKEN", None)
    done = subprocess.run([sys.executable, "-m", "flowkernel", "serve", "--port", "0", "--db",
                           str(tmp_path / "runs.db"), "--allowed-host", "https://flowkernel.example.com"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("flowkernel: serve --allowed-host https://flowkernel.example.com: ")
    assert "without a scheme" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize(("value", "says"), [("http://flowkernel.example.com", "without a scheme"),
                                             ("flowkernel.example.com:8443", "without a port"),
                                             ("flowkernel.example.com/api", "without a scheme or path"),
                                             ("[fd00::zz]", "not an IPv6 address"), ("", "give a host name")])
def test_an_allowed_host_must_be_a_bare_name_or_address(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        allowed_host(value)


def test_host_names_are_read_without_port_or_brackets() -> None:
    assert host_name("LocalHost:8765") == "localhost"
    assert host_name("[::1]:8765") == "::1" and host_name("[::1]") == "::1"
    assert host_name("example.com:") is None and host_name("example.com:x") is None
    assert host_name("[::1") is None and host_name("") is None and host_name("::1") is None
    assert allowed_host("[::1]") == "::1" and allowed_host(" Example.COM ") == "example.com"
