"""No 500 from bad input: numbers past what the stores hold, a Last-Event-ID that is not ASCII digits,
and cursors nobody but the server could have made (they are signed with a secret each store keeps).
And the flows list is a page like every other list. A real uvicorn server on a loopback port."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from flowkernel.server import ServerConfig
from flowkernel.server.pagination import SECRET_NAME, Cursors
from flowkernel.store.memory import MemoryStore
from flowkernel.store.open import open_store

from tests.server_support import Live, serving
from tests.test_postgres import needs_pg, pg_url  # noqa: F401  (the fixture)
from tests.test_server import HELLO, PROBLEM, hello

BIG = 2**63 - 1


def assert_400(response: httpx.Response, parameter: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert parameter in [e["path"] for e in body["errors"]], body
    return body


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with serving(str(tmp_path / "runs.db")) as server:
        yield server


def test_numbers_past_what_a_store_holds_are_400_naming_the_parameter(live: Live) -> None:
    run_id = hello(live)
    with live.client() as http:
        for after in (BIG, BIG + 1, 2**53):
            assert_400(http.get(f"/api/v1/runs/{run_id}/events", params={"after": after}), "after")
            assert_400(http.get(f"/api/v1/runs/{run_id}/stream", params={"after": after}), "after")
        assert_400(http.get(f"/api/v1/runs/{run_id}", params={"at": BIG}), "at")
        assert_400(http.get(f"/api/v1/runs/{run_id}/flow", params={"at": BIG}), "at")
        assert_400(http.get(f"/api/v1/agent-runs/nr_x/messages/{BIG + 1}"), "messageId")
        assert_400(http.get(f"/api/v1/agent-runs/nr_x/tool-calls/{BIG}"), "toolCallId")
        # The largest number the API reads is still an answer: past the end of the log, an empty page.
        page = http.get(f"/api/v1/runs/{run_id}/events", params={"after": 2**53 - 1})
        assert page.status_code == 200 and page.json() == {"items": [], "nextCursor": None}


# b"\xb2" is "²" as the server reads a header (Latin-1): a digit to str.isdigit(), not to int().
@pytest.mark.parametrize("value", [b"\xb2", "١٢".encode(), b"1e3", b"-1", b"9" * 17, b"12a"])
def test_a_last_event_id_that_is_not_a_seq_is_400(live: Live, value: bytes) -> None:
    run_id = hello(live)
    with live.client() as http:
        got = http.get(f"/api/v1/runs/{run_id}/stream", headers={"Last-Event-ID": value})
    assert_400(got, "Last-Event-ID")


def _minted(payload: str, key: bytes) -> str:
    """A cursor made the way they were before each store had its secret: with a key anyone could read."""
    check = hashlib.blake2b(payload.encode(), key=key, digest_size=6).hexdigest()
    return base64.urlsafe_b64encode(f"{payload}:{check}".encode()).decode().rstrip("=")


def test_cursors_made_without_the_stores_secret_are_400_whatever_their_key(live: Live) -> None:
    run_id = hello(live)
    with live.client() as http:
        for kind, path in (("runs", "/api/v1/runs"), ("events", f"/api/v1/runs/{run_id}/events"),
                           ("agent-runs", "/api/v1/agent-runs"), ("messages", f"/api/v1/runs/{run_id}/messages"),
                           ("tool-calls", f"/api/v1/runs/{run_id}/tool-calls"), ("flows", "/api/v1/flows")):
            for key in (1, BIG, 10**40):
                forged = _minted(f"{kind}:{key}", b"flowkernel cursor v1")
                assert_400(http.get(path, params={"cursor": forged}), "cursor")
            assert_400(http.get(path, params={"cursor": Cursors(b"another store").encode(kind, 1)}), "cursor")
        # Signed with the store's own secret but past any key: refused all the same, never a 500.
        secret = live.kernel.store.secret(SECRET_NAME)
        assert_400(http.get("/api/v1/runs", params={"cursor": Cursors(secret).encode("runs", 10**40)}), "cursor")
        good = Cursors(secret).encode("runs", 10**6)
        assert http.get("/api/v1/runs", params={"cursor": good}).json()["items"][0]["runId"] == run_id


def test_a_cursor_is_good_on_every_server_of_its_store_and_on_no_other(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    with serving(db) as first, serving(db) as second, serving(str(tmp_path / "other.db")) as other:
        for name in ("A", "B"):
            hello(first, name)
        with first.client() as a, second.client() as b, other.client() as c:
            page = a.get("/api/v1/runs", params={"limit": 1}).json()
            rest = b.get("/api/v1/runs", params={"limit": 1, "cursor": page["nextCursor"]})
            assert rest.status_code == 200 and len(rest.json()["items"]) == 1
            assert rest.json()["items"][0]["runId"] != page["items"][0]["runId"]
            assert_400(c.get("/api/v1/runs", params={"cursor": page["nextCursor"]}), "cursor")


def test_each_store_keeps_one_secret_per_name_made_on_first_use(tmp_path: Path) -> None:
    memory = MemoryStore()
    assert memory.secret("a") == memory.secret("a") != memory.secret("b")
    path = str(tmp_path / "runs.db")
    one, two = open_store(path), open_store(path)
    try:
        made = one.secret("cursors")
        assert len(made) == 32 and two.secret("cursors") == made
    finally:
        one.close()
        two.close()
    again, elsewhere = open_store(path), open_store(str(tmp_path / "b.db"))
    try:
        assert again.secret("cursors") == made and elsewhere.secret("cursors") != made
    finally:
        again.close()
        elsewhere.close()


@needs_pg
def test_a_postgresql_store_keeps_its_secret_for_every_connection(pg_url: str) -> None:  # noqa: F811
    one, two = open_store(pg_url), open_store(pg_url)
    try:
        made = one.secret("cursors")
        assert len(made) == 32 and two.secret("cursors") == made
    finally:
        one.close()
        two.close()


def test_the_flows_list_is_a_page_keyed_by_name(tmp_path: Path) -> None:
    folder = tmp_path / "flows"
    folder.mkdir()
    document = json.loads(HELLO.read_text())
    for name in ("beta", "delta", "gamma"):
        (folder / f"{name}.json").write_text(json.dumps({**document, "name": name}))
    with serving(str(tmp_path / "runs.db"), ServerConfig(flows=[folder])) as live, live.client() as http:
        first = http.get("/api/v1/flows", params={"limit": 2}).json()
        assert [f["name"] for f in first["items"]] == ["beta", "delta"] and first["nextCursor"]
        assert set(first["items"][0]) == {"name", "description", "inputs"}
        # A flow added before the cursor's name shifts nothing after it.
        (folder / "alpha.json").write_text(json.dumps({**document, "name": "alpha"}))
        rest = http.get("/api/v1/flows", params={"limit": 2, "cursor": first["nextCursor"]}).json()
        assert rest == {"items": [{"name": "gamma", "description": document.get("description"),
                                   "inputs": document["inputs"]}], "nextCursor": None}
        assert [f["name"] for f in http.get("/api/v1/flows").json()["items"]] == ["alpha", "beta", "delta", "gamma"]
        assert_400(http.get("/api/v1/flows", params={"limit": 0}), "limit")
        assert_400(http.get("/api/v1/flows", params={"cursor": first["nextCursor"] + "x"}), "cursor")


def test_a_restarted_server_reads_the_cursors_it_gave_before(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    with serving(db) as live:
        for name in ("A", "B", "C"):
            hello(live, name)
        with live.client() as http:
            cursor = http.get("/api/v1/runs", params={"limit": 1}).json()["nextCursor"]
    with serving(db) as live, live.client() as http:
        assert len(http.get("/api/v1/runs", params={"cursor": cursor}).json()["items"]) == 2
