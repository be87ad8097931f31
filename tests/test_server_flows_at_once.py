"""A fresh `flowkernel serve` asked for its flows by several clients at once lists every flow to each
(the first asks import the node types' modules: a node type must not look unknown meanwhile)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.browser_support import ROOT, serve

CLIENTS = 8
DOCUMENTS = {doc["name"]: doc for doc in (json.loads(path.read_text()) for path in (ROOT / "flows").glob("*.json"))}
FLOWS = set(DOCUMENTS)


def items_of(body: Any) -> list[Any]:
    """A list answer, bare or paged (``{items, nextCursor}``)."""
    return list(body["items"] if isinstance(body, dict) else body)


def an_input(name: str) -> dict[str, str]:
    """An input the flow accepts: its required properties (strings, in the example flows) filled in."""
    return {key: "dark mode" for key in DOCUMENTS[name].get("inputs", {}).get("required", [])}


def test_eight_clients_asking_a_fresh_server_for_its_flows_at_once_all_get_every_flow(tmp_path: Path) -> None:
    assert {"review-loop", "approval", "hello"} <= FLOWS  # agent flows among them
    with serve(str(tmp_path / "runs.db"), "--flows", "flows", "--workers", "0") as server:
        barrier = threading.Barrier(CLIENTS)
        names: list[set[str] | BaseException] = [set() for _ in range(CLIENTS)]

        def ask(i: int) -> None:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                barrier.wait()
                try:
                    answer = http.get("/api/v1/flows")
                    answer.raise_for_status()
                    names[i] = {flow["name"] for flow in items_of(answer.json())}
                except BaseException as exc:
                    names[i] = exc

        clients = [threading.Thread(target=ask, args=(i,)) for i in range(CLIENTS)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(90)
        assert not [got for got in names if isinstance(got, BaseException)], names
        assert all(got == FLOWS for got in names), names
        # and the server still knows every flow afterwards: it starts a run of each by name
        with server.client() as http:
            for name in sorted(FLOWS):
                created = http.post("/api/v1/runs", json={"flow": name, "input": an_input(name)})
                assert created.status_code == 201, (name, created.text)
