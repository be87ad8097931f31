"""``validate`` (and ``run``) warn, in one line on stderr and without refusing the flow, when an agent node's
model is in the installed ``anthropic`` SDK's deprecation table, with its end-of-life date.

The tests never depend on what today's table holds: they add a model of their own to it (in process,
or in the command's process through a ``--plugin`` module that edits the SDK's table), or replace it."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import anthropic._data.deprecated_models as sdk_table
import pytest
from flowkernel.flowfiles.tree import node_warnings
from flowkernel.nodes.claude import models
from flowkernel.plugins.registry import default_registry

SCRIPT = str(Path(sys.executable).with_name("flowkernel"))
RETIRED = "claude-test-retired-1"
END = "January 1st, 2031"
# A plugin module that adds a model to the SDK's table in the process it is imported in.
RETIRING = ("from anthropic._data.deprecated_models import DEPRECATED_MODELS\n"
            f"DEPRECATED_MODELS[{RETIRED!r}] = {END!r}\n")


def agent(node_id: str, **input: str) -> dict[str, object]:
    return {"id": node_id, "type": "claude.agent", "input": {"prompt": "Hello", **input}}


def test_the_table_is_read_from_the_installed_sdk_without_importing_it() -> None:
    from_file = models._table_file()
    assert from_file is not None and from_file is not sdk_table
    assert from_file.DEPRECATED_MODELS == sdk_table.DEPRECATED_MODELS


def test_a_model_in_the_sdks_table_is_advised_with_its_end_of_life(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sdk_table.DEPRECATED_MODELS, RETIRED, END)
    document = {"name": "f", "nodes": [agent("old", model=RETIRED), agent("current", model="claude-test-current"),
                                       agent("bound", model="{{ flow.input.model }}")]}
    notes = node_warnings(document, default_registry().node_types)
    assert [(n.path, n.message) for n in notes] == [
        ("$.nodes[0].input.model", f"model {RETIRED!r} is deprecated (the installed anthropic SDK says it reaches "
                                   f"end of life on {END}); move the node to a current model")]


def test_no_table_where_the_sdk_kept_it_means_no_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, models.SDK_DEPRECATIONS, types.ModuleType(models.SDK_DEPRECATIONS))
    assert models.deprecated_models() == {}
    document = {"name": "f", "nodes": [agent("old", model=RETIRED)]}
    assert node_warnings(document, default_registry().node_types) == []


def test_validate_and_run_warn_in_one_line_and_accept_the_flow(tmp_path: Path, clean_env: dict[str, str]) -> None:
    (tmp_path / "retiring.py").write_text(RETIRING)
    (tmp_path / "child.json").write_text(json.dumps({"name": "child", "nodes": [agent("inner", model=RETIRED)]}))
    (tmp_path / "flow.json").write_text(json.dumps({"name": "flow", "nodes": [
        agent("old", model=RETIRED), agent("current", model="claude-test-current"),
        {"id": "sub", "type": "flow.call", "input": {"flow": "child.json"}}]}))
    warning = (f"model {RETIRED!r} is deprecated (the installed anthropic SDK says it reaches end of life on {END}); "
               "move the node to a current model")

    checked = subprocess.run([SCRIPT, "validate", "flow.json", "--plugin", "retiring"], cwd=tmp_path, env=clean_env,
                             text=True, capture_output=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == "flow.json: ok — flow 'flow', 3 nodes, 0 edges\n"
    assert checked.stderr.splitlines() == [
        f"flowkernel: warning: flow.json: $.nodes[0].input.model: {warning}",
        f"flowkernel: warning: flow.json: $.nodes[2].input.flow: child flow child.json: $.nodes[0].input.model: "
        f"{warning}"]

    queued = subprocess.run([SCRIPT, "run", "flow.json", "--queue", "--db", "runs.db", "--plugin", "retiring"],
                            cwd=tmp_path, env=clean_env, text=True, capture_output=True, timeout=60)
    assert queued.returncode == 0, queued.stderr
    assert queued.stderr.splitlines() == checked.stderr.splitlines()

    plain = subprocess.run([SCRIPT, "validate", "flow.json"], cwd=tmp_path, env=clean_env, text=True,
                           capture_output=True, timeout=60)
    assert plain.returncode == 0 and plain.stderr == ""  # the model is not in the SDK's own table
