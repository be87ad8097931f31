"""``mcpServers`` at the command line: ``validate`` names the JSON path of each problem (and the extra to
install without the ``mcp`` package); ``flowkernel mcp list FLOW NODE`` shows what the servers offer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.mcp_support import alive, server_pids, stdio_server

ROOT = Path(__file__).resolve().parent.parent
FLOWKERNEL = str(Path(sys.executable).parent / "flowkernel")


def _flow(tmp_path: Path, servers: Any, **extra: Any) -> Path:
    path = tmp_path / "mcp-flow.json"
    path.write_text(json.dumps({"name": "mcp-flow", "nodes": [
        {"id": "agent", "type": "claude.agent", "input": {"prompt": "x", "mcpServers": servers, **extra}},
        {"id": "plain", "type": "noop", "input": {}}], "edges": []}), encoding="utf-8")
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLOWKERNEL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_validate_names_the_json_path_of_each_bad_server(tmp_path: Path) -> None:
    flow = _flow(tmp_path, {"files": {"command": "python", "args": "-m srv", "port": 3},
                            "a__b": {"url": "ftp://example"},
                            "both": {"command": "x", "url": "http://127.0.0.1:1/mcp"},
                            "slow": {"url": "http://127.0.0.1:1/mcp", "callTimeout": 0}})
    done = _cli("validate", str(flow), cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    at = "$.nodes[0].input.mcpServers"
    for path, words in [(f"{at}.files.port", "unknown key"), (f"{at}.files.args", "list of strings"),
                        (f"{at}.a__b", "single '_'"), (f"{at}.a__b.url", "http:// or https://"),
                        (f"{at}.both", "stdio"), (f"{at}.slow.callTimeout", "positive number of seconds")]:
        assert any(line.strip().startswith(f"{path}:") and words in line for line in lines), (path, done.stderr)
    assert "Traceback" not in done.stderr


def test_validate_without_the_mcp_package_says_which_extra_to_install(tmp_path: Path) -> None:
    flow = _flow(tmp_path, {"files": {"command": "python", "args": ["-m", "srv"]}})
    code = ("import sys; sys.modules['mcp'] = None  # as if the package were not installed\n"
            "from flowkernel.cli import main; sys.exit(main(['validate', sys.argv[1]]))")
    done = subprocess.run([sys.executable, "-c", code, str(flow)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)

    assert done.returncode == 2
    assert "$.nodes[0].input.mcpServers: MCP servers need the `mcp` package" in done.stderr
    assert "pip install 'flowkernel[mcp]'" in done.stderr


def test_a_tool_of_a_server_may_be_named_in_tools_and_tool_choice(tmp_path: Path) -> None:
    flow = _flow(tmp_path, {"files": {"command": "python"}}, tools=["mcp__files__read"],
                 toolChoice={"tool": "mcp__files__read"})
    done = _cli("validate", str(flow), cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_mcp_list_shows_each_tool_with_its_description_and_schema(tmp_path: Path) -> None:
    folder = tmp_path / "server"
    folder.mkdir()
    flow = _flow(tmp_path, {"files": stdio_server(folder)})

    done = _cli("mcp", "list", str(flow), "agent", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    tools = {t["name"]: t for t in map(json.loads, done.stdout.splitlines())}
    assert set(tools) == {"mcp__files__read", "mcp__files__record", "mcp__files__refuse", "mcp__files__hang",
                          "mcp__files__crash"}
    assert tools["mcp__files__read"]["server"] == "files"
    assert tools["mcp__files__read"]["description"] == "Read a file of the test's fake file system."
    assert tools["mcp__files__read"]["inputSchema"]["required"] == ["path"]
    assert not any(alive(pid) for pid in server_pids(folder))

    text = _cli("mcp", "list", str(flow), "agent", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "mcp__files__read  (files)\n  Read a file of the test's fake file system.\n  input: {" in text.stdout


def test_mcp_list_of_a_node_without_servers_or_a_server_that_fails(tmp_path: Path) -> None:
    folder = tmp_path / "server"
    folder.mkdir()
    flow = _flow(tmp_path, {"files": stdio_server(folder, MCP_TEST_FAIL_AT_START="1")})

    none = _cli("mcp", "list", str(flow), "plain", cwd=tmp_path)
    assert none.returncode == 2 and none.stderr.strip() == f"flowkernel: {flow}: node 'plain' has no `mcpServers`"
    failed = _cli("mcp", "list", str(flow), "agent", cwd=tmp_path)
    assert failed.returncode == 1
    assert failed.stderr.startswith("flowkernel: MCP server 'files' could not start")
    assert "cannot open the database: permission denied" in failed.stderr and "Traceback" not in failed.stderr
