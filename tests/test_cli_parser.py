"""The command line builds only the parser of the command it runs, and that changes nothing a user
sees: the same help, the same errors, the same arguments as the parser with every command."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flowkernel.cli import command_named, command_parser, parser

COMMANDS = sorted(parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def outcome(p: argparse.ArgumentParser, argv: list[str]) -> tuple[Any, str, str]:
    """What parsing ``argv`` does: the arguments (or the exit code), and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result: Any = vars(p.parse_args(argv))
        except SystemExit as exc:
            result = ("exit", exc.code)
    return result, out.getvalue(), err.getvalue()


def lazily(argv: list[str]) -> argparse.ArgumentParser:
    """The parser ``main`` uses for ``argv``."""
    command = command_named(argv)
    return (command_parser(command) if command is not None else None) or parser()


def test_every_command_has_a_parser_of_its_own_with_the_same_help() -> None:
    assert {"validate", "run", "resume", "serve", "examples"} <= set(COMMANDS)
    for command in COMMANDS:
        own = command_parser(command)
        assert own is not None, command
        assert outcome(own, [command, "--help"]) == outcome(parser(), [command, "--help"])


@pytest.mark.parametrize("argv", [
    ["run", "--help"],
    ["run"],  # the flow is missing
    ["run", "flow.json", "--input", "a=1", "--json", "--db", "x.db"],
    ["run", "flow.json", "--no-such-option"],
    ["--plugin", "mod", "--allow-dir", "d", "run", "flow.json", "--plugin", "other"],
    ["--plugin=mod", "--allow-dir=d", "validate", "flow.json"],
    ["resume", "RUN", "--db", "x.db"],
    ["examples", "copy", "out"],
    ["examples", "nope"],
    ["worker", "--concurrency", "0"],
    ["nope"],  # not a command: the whole parser names them all
    ["--help"],
    ["--plugin", "mod", "--help"],
    ["--plug", "mod", "run", "flow.json"],  # an abbreviation: left to the whole parser
    ["--plugin"],
    ["--plugin", "-x", "run", "flow.json"],
    ["--allow-dir", "d"],
    ["--", "run", "flow.json"],
    [],
])
def test_the_parser_of_the_command_parses_as_the_whole_parser(argv: list[str]) -> None:
    assert outcome(lazily(argv), argv) == outcome(parser(), argv)


def test_only_plain_commands_build_a_parser_of_their_own() -> None:
    assert command_named(["run", "f.json", "--help"]) == "run"
    assert command_named(["--plugin", "m", "--allow-dir", "d", "resume", "R"]) == "resume"
    assert command_named(["--plugin=m", "validate", "f"]) == "validate"
    for argv in (["--help"], ["-h", "run"], ["--version"], ["--plug", "m", "run"], ["--plugin"], ["--", "run"], []):
        assert command_named(argv) is None, argv
    assert command_parser("nope") is None
    only_run = command_parser("run")
    assert only_run is not None
    assert outcome(only_run, ["validate", "f.json"])[0] == ("exit", 2)  # knows nothing else


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60)


def test_run_help_unknown_commands_and_global_options_behave_as_before(tmp_path: Path,
                                                                       clean_env: dict[str, str]) -> None:
    helped = fk("run", "--help", cwd=tmp_path, env=clean_env)
    assert helped.returncode == 0
    assert helped.stdout == outcome(parser(), ["run", "--help"])[1]
    assert helped.stdout.startswith("usage: flowkernel run [-h]")

    unknown = fk("nope", cwd=tmp_path, env=clean_env)
    assert unknown.returncode == 2
    assert "flowkernel: error: argument COMMAND: invalid choice: 'nope' (choose from" in unknown.stderr
    assert all(repr(command) in unknown.stderr for command in COMMANDS)

    (tmp_path / "shout_plugin.py").write_text(
        "from flowkernel.plugins.registry import register_function\n\n"
        "@register_function('shout')\ndef shout(text: str) -> str:\n    return text.upper()\n")
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "child.json").write_text(
        '{"name": "child", "nodes": [{"id": "c", "type": "noop", "input": {}}], "edges": []}')
    flow = tmp_path / "flows" / "parent.json"
    flow.parent.mkdir()
    flow.write_text('{"name": "parent", "nodes": ['
                    '{"id": "s", "type": "python", "input": {"function": "shout", "args": {"text": "hi"}}},'
                    '{"id": "c", "type": "flow.call", "input": {"flow": "../child/child.json"}}], "edges": []}')
    options = ["--plugin", "shout_plugin", f"--allow-dir={tmp_path / 'child'}"]
    checked = fk(*options, "validate", str(flow), cwd=tmp_path, env=clean_env)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == f"{flow}: ok — flow 'parent', 2 nodes, 0 edges\n"
    db = str(tmp_path / "runs.db")
    ran = fk(*options, "run", str(flow), "--db", db, "--json", cwd=tmp_path, env=clean_env)
    assert ran.returncode == 0, ran.stderr
    assert '"status":"completed"' in ran.stdout.splitlines()[-1] and '"HI"' in ran.stdout
    refused = fk("validate", str(flow), cwd=tmp_path, env=clean_env)  # no plugin: no function `shout`
    assert refused.returncode == 2 and "'shout'" in refused.stderr
    outside = fk("--plugin", "shout_plugin", "run", str(flow), "--db", db, cwd=tmp_path, env=clean_env)
    assert outside.returncode == 2 and "child.json" in outside.stderr  # a folder not allowed, found before running

    missing = fk("--plugin", cwd=tmp_path, env=clean_env)
    assert missing.returncode == 2 and "argument --plugin: expected one argument" in missing.stderr
