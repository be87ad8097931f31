"""Files a flow names are read only when they are regular files inside the allowed folders, within a size
limit; JSON Schemas in a flow never fetch a URL or read a file. Real files, FIFOs, symlinks, a real HTTP
server on 127.0.0.1 counting the requests the kernel makes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.compiler import compile_flow
from flowkernel.errors import FlowFileError, FlowValidationError, RunInputError
from flowkernel.fixtures import FixtureError, MockQuery
from flowkernel.flowfiles.load import load_flow
from flowkernel.flowfiles.localfiles import ALLOW_DIRS_ENV
from flowkernel.plugins.registry import default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parent.parent
TYPES = default_registry().node_types
CHILD = {"name": "child", "nodes": [{"id": "two", "type": "transform", "input": {"expr": "2"}}]}


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("FLOWKERNEL_PLUGINS", ALLOW_DIRS_ENV)}
    full.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], text=True, capture_output=True,
                          env=full, cwd=cwd, timeout=timeout)


def parent(folder: Path, target: str, name: str = "parent.json") -> Path:
    path = folder / name
    path.write_text(json.dumps({"name": "parent", "inputs": {"type": "object"}, "nodes": [
        {"id": "call", "type": "flow.call", "input": {"flow": target}}]}))
    return path


def run_parent(path: Path, input: Any = None) -> Any:
    kernel = Kernel(SqliteStore(path.parent / "runs.db"), registry=default_registry())
    try:
        return anyio.run(kernel.run, kernel.load_flow(path), input or {})
    finally:
        kernel.close()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "child.json").write_text(json.dumps(CHILD))
    (folder / "sub").mkdir()
    (folder / "sub" / "child.json").write_text(json.dumps(CHILD))
    (tmp_path / "outside.json").write_text(json.dumps(CHILD))
    return folder


# --- flow.call reads child flows only inside its flow's folder --------------------------------------


def test_a_child_flow_inside_the_flows_folder_runs(project: Path) -> None:
    snap = run_parent(parent(project, "sub/child.json"))
    assert snap.status == "completed" and snap.outputs["call"] == {"two": 2}


@pytest.mark.parametrize("target", ["../outside.json", "{outside}", "/etc/passwd", "/dev/zero", "sub/../../outside.json"])
def test_a_child_flow_outside_the_flows_folder_is_refused(project: Path, target: str) -> None:
    target = target.format(outside=project.parent / "outside.json")
    snap = run_parent(parent(project, target))
    assert snap.status == "failed" and snap.faults["call"].errorType == "invalid_flow"
    assert "is outside" in snap.faults["call"].message and "--allow-dir" in snap.faults["call"].message


def test_a_child_flow_path_from_the_run_input_is_held_to_the_same_rule(project: Path) -> None:
    path = project / "from_input.json"
    path.write_text(json.dumps({"name": "p", "nodes": [
        {"id": "call", "type": "flow.call", "input": {"flow": "{{ flow.input.path }}"}}]}))
    assert run_parent(path, {"path": "child.json"}).status == "completed"
    snap = run_parent(path, {"path": "../outside.json"})
    assert snap.status == "failed" and "is outside" in snap.faults["call"].message


def test_a_symlink_inside_the_folder_that_points_outside_it_is_refused(project: Path) -> None:
    (project / "link.json").symlink_to(project.parent / "outside.json")
    snap = run_parent(parent(project, "link.json"))
    assert snap.status == "failed" and "is outside" in snap.faults["call"].message


def test_an_allowed_folder_lets_a_child_flow_live_elsewhere(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_DIRS_ENV, str(project.parent))
    snap = run_parent(parent(project, "../outside.json"))
    assert snap.status == "completed" and snap.outputs["call"] == {"two": 2}


def test_the_cli_allow_dir_option_allows_a_folder(project: Path) -> None:
    path = parent(project, "../outside.json")
    db = str(project / "runs.db")
    res = cli(project, "run", str(path), "--db", db)
    assert res.returncode == 2 and "is outside" in res.stderr  # found by validation, before the run
    res = cli(project, "--allow-dir", str(project.parent), "run", str(path), "--db", db)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("kind", ["fifo", "devzero-link", "directory"])
def test_a_child_flow_that_is_not_a_regular_file_is_refused_without_hanging(project: Path, kind: str) -> None:
    target = project / "special.json"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "devzero-link":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()
    path = parent(project, "special.json")
    # /dev is not the flow's folder: allow it, so that the file-type rule is what refuses the link.
    env = {ALLOW_DIRS_ENV: "/dev"} if kind == "devzero-link" else {}
    # A subprocess with a deadline: a hang fails the test instead of stalling the suite.
    res = cli(project, "run", str(path), "--db", str(project / "runs.db"), env=env, timeout=30)
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out  # found by validation, before the run
    assert ("not a regular file" in out) if kind != "directory" else ("is a directory" in out), out


def test_a_malformed_yaml_child_leaves_its_text_out_of_the_event_log(project: Path) -> None:
    (project / "child.yaml").write_text("name: child\ntoken: 'sk-live-SECRET\nnodes: [\n")
    path = parent(project, "child.yaml")
    snap = run_parent(path)
    message = snap.faults["call"].message
    assert snap.status == "failed" and "not valid YAML" in message and "child.yaml:" in message
    stored = (project / "runs.db").read_bytes()
    assert b"SECRET" not in stored and b"sk-live" not in stored


# --- the flow file itself ------------------------------------------------------------------------------


def test_validate_refuses_a_fifo_a_device_and_a_file_over_the_limit(tmp_path: Path) -> None:
    fifo = tmp_path / "flow.json"
    os.mkfifo(fifo)
    res = cli(tmp_path, "validate", str(fifo), timeout=30)
    assert res.returncode == 2 and "not a regular file (a FIFO)" in res.stderr, res.stderr
    res = cli(tmp_path, "validate", "/dev/zero", timeout=30)
    assert res.returncode == 2 and "not a regular file (a character device)" in res.stderr, res.stderr
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**CHILD, "description": "x" * 2000}))
    res = cli(tmp_path, "validate", str(big), env={"FLOWKERNEL_MAX_FLOW_BYTES": "1000"})
    assert res.returncode == 2 and "more than the 1000 a flow file may have" in res.stderr, res.stderr
    assert cli(tmp_path, "validate", str(big)).returncode == 0


def test_load_flow_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(FlowFileError, match="not a regular file"):
        load_flow(link, TYPES)


# --- fixture files ----------------------------------------------------------------------------------


def _fixtures(tmp_path: Path) -> Path:
    folder = tmp_path / "fixtures"
    shutil.copytree(ROOT / "fixtures" / "review-loop", folder)
    return folder


@pytest.mark.parametrize("kind", ["fifo", "devzero-link", "outside-link"])
def test_a_fixture_that_is_not_a_regular_file_inside_the_directory_is_refused(tmp_path: Path, kind: str) -> None:
    folder = _fixtures(tmp_path)
    odd = folder / "extra.json"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "devzero-link":
        odd.symlink_to("/dev/zero")
    else:
        (tmp_path / "elsewhere.json").write_text('{"calls": []}')
        odd.symlink_to(tmp_path / "elsewhere.json")
    expected = "is outside" if kind != "fifo" else "not a regular file (a FIFO)"
    with pytest.raises(FixtureError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        MockQuery(folder)
    res = cli(tmp_path, "run", str(ROOT / "flows" / "review-loop.json"), "--input", "feature=x",
              "--fixtures", str(folder), "--db", str(tmp_path / "runs.db"), timeout=60)
    assert res.returncode == 2 and expected in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_a_fixture_file_over_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _fixtures(tmp_path)
    monkeypatch.setenv("FLOWKERNEL_MAX_FIXTURE_BYTES", "100")
    with pytest.raises(FixtureError, match="more than the 100 a fixture file may have"):
        MockQuery(folder)


# --- JSON Schemas never fetch ------------------------------------------------------------------------


class _Counting(BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self) -> None:
        _Counting.requests.append(self.path)
        body = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def schema_server() -> Iterator[str]:
    _Counting.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/schema.json"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_remote_ref_in_inputs_is_a_validation_error_and_nothing_is_fetched(tmp_path: Path, schema_server: str) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"type": "string"}')
    path = tmp_path / "flow.json"
    path.write_text(json.dumps({"name": "refs", "inputs": {"type": "object", "properties": {
        "a": {"$ref": schema_server}, "b": {"$ref": secret.as_uri()}, "c": {"$ref": "#/$defs/nope"},
        "d": {"$ref": "#/$defs/text"}}, "$defs": {"text": {"type": "string"}}},
        "nodes": [{"id": "ask", "type": "human.input",
                   "input": {"prompt": "?", "schema": {"$ref": schema_server + "#/x"}}}]}))
    for command in ("validate", "run"):
        res = cli(tmp_path, command, str(path), "--db", str(tmp_path / "r.db")) if command == "run" else \
            cli(tmp_path, command, str(path))
        assert res.returncode == 2, res.stderr
        for where in ("$.inputs.properties.a.$ref", "$.inputs.properties.b.$ref", "$.inputs.properties.c.$ref",
                      "$.nodes[0].input.schema.$ref"):
            assert f"{where}: " in res.stderr and "does not resolve within this schema" in res.stderr, res.stderr
        assert "properties.d" not in res.stderr  # a reference inside the schema resolves
    assert _Counting.requests == []


def test_a_stored_flow_with_a_remote_ref_still_fetches_nothing(tmp_path: Path, schema_server: str) -> None:
    # A flow stored before references were checked is compiled trusted: applying it must not fetch either.
    doc = {"name": "old", "inputs": {"type": "object", "properties": {"a": {"$ref": schema_server}}},
           "nodes": [{"id": "a", "type": "noop"}]}
    with pytest.raises(FlowValidationError):
        compile_flow(doc, TYPES)
    flow = compile_flow(doc, TYPES, trusted=True)
    with pytest.raises(RunInputError, match="does not resolve within the schema"):
        Kernel.check_input(flow, {"a": 1})
    assert _Counting.requests == []


def test_a_local_ref_validates_the_run_input(tmp_path: Path) -> None:
    doc = {"name": "ok", "inputs": {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}},
                                    "$defs": {"n": {"type": "integer"}}}, "nodes": [{"id": "a", "type": "noop"}]}
    flow = compile_flow(doc, TYPES)
    Kernel.check_input(flow, {"a": 1})
    with pytest.raises(RunInputError, match=r"input\.a: 'x' is not of type 'integer'"):
        Kernel.check_input(flow, {"a": "x"})
