"""`flowkernel --version`, `flowkernel examples` and `flowkernel examples copy DIR`: the shipped examples
are listed from their flow files, copied out, and every listed command runs from the copy."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "flowkernel.cli"]


def flowkernel(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def env(clean_env: dict[str, str]) -> dict[str, str]:
    clean_env.pop("ANTHROPIC_API_KEY", None)
    clean_env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens: a real call would fail
    return clean_env


def test_version_is_pyprojects_version_from_the_package_metadata(env: dict[str, str], tmp_path: Path) -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert version("flowkernel") == declared
    done = flowkernel(env, tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"flowkernel {declared}\n"
    import flowkernel as package

    assert package.__version__ == declared


def test_examples_are_listed_from_the_flow_files(env: dict[str, str], tmp_path: Path) -> None:
    done = flowkernel(env, tmp_path, "examples", "--json")
    assert done.returncode == 0, done.stderr
    listed = {e["name"]: e for e in map(json.loads, done.stdout.splitlines())}
    # every flow is an example except the child flow another example calls
    assert set(listed) == {"approval", "fanout", "fix-test", "hello", "research", "review-loop", "subflow"}
    for name, entry in listed.items():
        document = json.loads((ROOT / "flows" / f"{name}.json").read_text(encoding="utf-8"))
        assert entry["description"] == document["description"]
        assert set(entry["inputs"]) == set(document.get("inputs", {}).get("required", []))
    assert listed["review-loop"]["command"] == ("flowkernel run flows/review-loop.json --input feature='CSV export' "
                                               "--fixtures fixtures/review-loop")
    assert listed["research"]["command"].startswith("flowkernel --plugin flowkernel.examples.research_tools run ")
    assert listed["hello"]["fixtures"] is None  # no model calls, no fixtures
    assert [e["name"] for e in listed.values() if e["waitsForReply"]] == ["approval", "research"]
    assert {n: e["extras"] for n, e in listed.items() if e["extras"]} == {"fix-test": ["claude-code"]}

    text = flowkernel(env, tmp_path, "examples")
    assert text.returncode == 0
    for entry in listed.values():
        assert entry["description"] in text.stdout and f"$ {entry['command']}" in text.stdout
    assert "(needs an extra: pip install 'flowkernel[claude-code]')" in text.stdout


def test_every_listed_command_runs_from_a_copy_outside_the_repository(env: dict[str, str], tmp_path: Path) -> None:
    where = tmp_path / "examples"
    copied = flowkernel(env, tmp_path, "examples", "copy", str(where))
    assert copied.returncode == 0, copied.stderr
    shipped = sorted(str(p.relative_to(ROOT)) for p in [*(ROOT / "flows").glob("*.json"),
                                                        *(ROOT / "fixtures").glob("*/*.json")])
    assert sorted(str(p.relative_to(where)) for p in where.rglob("*") if p.is_file()) == shipped
    assert all((where / rel).read_bytes() == (ROOT / rel).read_bytes() for rel in shipped)

    env["FLOWKERNEL_DB"] = str(tmp_path / "runs.db")
    for entry in map(json.loads, flowkernel(env, tmp_path, "examples", "--json").stdout.splitlines()):
        words = shlex.split(entry["command"])
        assert words[0] == "flowkernel"
        done = subprocess.run([*CLI, *words[1:]], cwd=where, env=env, capture_output=True, text=True, timeout=120)
        expected = 3 if entry["waitsForReply"] else 0  # 3: the run waits for the human's reply
        assert done.returncode == expected, f"{entry['command']}\n{done.stdout}\n{done.stderr}"
        if expected == 3:
            assert "flowkernel reply" in done.stderr


def test_copy_into_a_non_empty_directory_is_refused_naming_the_file_in_the_way(env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    where = tmp_path / "mine"
    (where / "flows").mkdir(parents=True)
    (where / "flows" / "review-loop.json").write_text("my own flow", encoding="utf-8")
    (where / "notes.txt").write_text("keep me", encoding="utf-8")

    refused = flowkernel(env, tmp_path, "examples", "copy", str(where))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert str(where / "flows" / "review-loop.json") in refused.stderr and "--force" in refused.stderr
    assert sorted(p.name for p in where.rglob("*")) == ["flows", "notes.txt", "review-loop.json"]

    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("x", encoding="utf-8")
    refused = flowkernel(env, tmp_path, "examples", "copy", str(other))
    assert refused.returncode == 2 and str(other / "a.txt") in refused.stderr

    forced = flowkernel(env, tmp_path, "examples", "copy", str(where), "--force")
    assert forced.returncode == 0, forced.stderr
    assert (where / "flows" / "review-loop.json").read_bytes() == (ROOT / "flows" / "review-loop.json").read_bytes()
    assert (where / "notes.txt").read_text(encoding="utf-8") == "keep me"


def test_copy_onto_a_file_is_invalid_input(env: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("x", encoding="utf-8")
    done = flowkernel(env, tmp_path, "examples", "copy", str(target))
    assert done.returncode == 2 and "not a directory" in done.stderr and "Traceback" not in done.stderr
