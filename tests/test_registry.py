"""Installed packages register through entry points; nothing is imported before it is needed."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from flowkernel.plugins.registry import Registry

ROOT = Path(__file__).resolve().parent.parent


def test_entry_points_register_functions_node_types_and_tools_on_first_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = {
        "flowkernel.functions": [EntryPoint("loud", "tests.plugins.extras:shout", "flowkernel.functions")],
        "flowkernel.nodes": [EntryPoint("text.reverse", "tests.plugins.extras:Reverse", "flowkernel.nodes")],
        "flowkernel.tools": [EntryPoint("loud_tool", "tests.plugins.extras:shout", "flowkernel.tools")],
    }
    asked: list[str] = []

    def fake_entry_points(group: str) -> list[EntryPoint]:
        asked.append(group)
        return groups.get(group, [])

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    reg = Registry()
    assert asked == []  # nothing scanned yet
    assert reg.functions.get("loud") is not None and reg.functions["loud"]("x") == "X!"
    assert "text.reverse" in reg.node_types and reg.node_types["text.reverse"].name == "text.reverse"
    assert "loud_tool" in reg.tools
    assert sorted(asked) == sorted(groups)  # scanned once, on the first miss


def test_a_broken_entry_point_is_skipped_with_a_message(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    def fake_entry_points(group: str) -> list[Any]:
        return [EntryPoint("bad", "no_such_module:thing", group)] if group == "flowkernel.functions" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    reg = Registry()
    assert reg.functions.get("bad") is None
    [record] = [r for r in caplog.records if r.name == "flowkernel.plugins" and r.levelname == "WARNING"]
    assert "skipping entry point flowkernel.functions:bad" in record.getMessage()


def test_importing_the_api_and_resuming_needs_neither_the_sdk_nor_validation_libraries() -> None:
    # importlib.metadata too: entry points are scanned only when a lookup misses the built-ins.
    code = ("import sys, flowkernel.run.kernel, flowkernel.store.sql.sqlite, flowkernel.cli\n"
            "heavy = [m for m in ('anthropic', 'networkx', 'pydantic', 'jsonschema', 'importlib.metadata')\n"
            "         if m in sys.modules]\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
