"""The wheel, as a user installs it: built from the sources, installed (not editable) with its
dependencies into a fresh virtualenv outside the repository, and used from a folder of its own.

One build and one install per test session (dependencies come from the machine's package index,
through pip's cache); the tests below share them. Marked slow: about a minute, most of it pip.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PYPROJECT["project"]["version"]

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    home: Path  # a folder outside the repository to work in

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return Path(self.run_python("import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "FLOWKERNEL_", "ANTHROPIC_")) and k != "VIRTUAL_ENV"}
        env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens: a real model call would fail
        env["FLOWKERNEL_DB"] = str(self.home / "runs.db")
        env["NO_COLOR"] = "1"
        return {**env, **extra}

    def run_python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), "-c", code], cwd=self.home, env=self.env(), capture_output=True,
                              text=True, timeout=120)

    def flowkernel(self, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / "flowkernel"), *args], cwd=cwd or self.home,
                              env=self.env(**env), capture_output=True, text=True, timeout=120)


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    assert ROOT not in base.parents
    # Build from a copy, so the build leaves nothing (build/, *.egg-info) in the working tree.
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.pyc", ".flowkernel", "*.egg-info", "build", "dist", ".*_cache",
        ".hypothesis"))
    _pip("wheel", "--no-deps", "--quiet", "--wheel-dir", str(base / "dist"), str(source))
    (wheel,) = (base / "dist").glob("flowkernel-*.whl")
    venv = base / "venv"
    # No pip of its own: this session's pip installs into it (--python), which saves creating one.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    _pip("--python", str(venv / "bin" / "python"), "install", "--quiet", str(wheel))
    home = base / "home"
    home.mkdir()
    return Installed(wheel=wheel, venv=venv, home=home)


def _expected_files() -> set[str]:
    """Every file the wheel should hold, by its installed path: each module of the mapped package
    folders, py.typed, the example flows and fixtures, and the web UI's assets."""
    mapping: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
    expected: set[str] = set()
    for package, folder in mapping.items():
        prefix = package.replace(".", "/")
        for path in (ROOT / folder).rglob("*"):
            relative = path.relative_to(ROOT / folder)
            inner = next((p for p, f in mapping.items() if p != package and p.startswith(package + ".")
                          and (ROOT / f) in path.parents), None)
            if inner is not None or "__pycache__" in relative.parts or not path.is_file():
                continue
            web_ui = package == "flowkernel" and relative.parts[:2] in (("server", "static"), ("server", "apidocs"))
            if path.suffix == ".py" or path.name == "py.typed" or web_ui or (
                    package.startswith("flowkernel.examples.") and path.suffix == ".json"):
                expected.add(f"{prefix}/{relative.as_posix()}")
    return expected


def test_the_wheel_holds_one_import_package_with_every_module(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"flowkernel", f"flowkernel-{VERSION}.dist-info"}
    files = {n for n in names if n.startswith("flowkernel/")}
    assert _expected_files() <= files, f"missing from the wheel: {sorted(_expected_files() - files)}"
    assert "flowkernel/py.typed" in files
    assert "flowkernel/examples/flows/review-loop.json" in files
    assert "flowkernel/examples/fixtures/review-loop/planner.json" in files
    assert {"flowkernel/server/static/index.html", "flowkernel/server/static/app.js"} <= files
    assert {"flowkernel/server/static/vendor/marked.esm.js", "flowkernel/server/static/vendor/purify.es.js",
            "flowkernel/server/static/vendor/marked.LICENSE", "flowkernel/server/static/vendor/dompurify.LICENSE"} <= files
    assert {"flowkernel/server/apidocs/swagger-ui-bundle.js", "flowkernel/server/apidocs/LICENSE"} <= files
    assert not [n for n in files if "/tests/" in n or n.endswith(".pyc")]


def test_the_install_adds_exactly_one_top_level_package(installed: Installed) -> None:
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps(sorted({f.parts[0] for f in m.files('flowkernel') if f.parts[0] != '..'})))")
    done = installed.run_python(code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["flowkernel", f"flowkernel-{VERSION}.dist-info"]
    present = {p.name for p in installed.site_packages.iterdir()}
    assert {"flowkernel", f"flowkernel-{VERSION}.dist-info"} <= present
    assert not present & {"kernel", "nodes", "flows", "fixtures", "examples"}, sorted(present)


def test_only_flowkernel_imports_and_it_comes_from_the_install(installed: Installed) -> None:
    done = installed.run_python("import flowkernel, flowkernel.nodes.claude, flowkernel.examples.research_tools; "
                                "print(flowkernel.__file__)")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(installed.site_packages)
    for name in ("kernel", "nodes", "flows"):
        failed = installed.run_python(f"import {name}")
        assert failed.returncode == 1 and f"No module named '{name}'" in failed.stderr, (name, failed.stderr)


def test_version_comes_from_the_package_metadata(installed: Installed) -> None:
    done = installed.flowkernel("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"flowkernel {VERSION}\n"


def test_the_examples_run_from_a_copied_folder_without_warnings(installed: Installed) -> None:
    where = installed.home / "examples"
    copied = installed.flowkernel("examples", "copy", str(where))
    assert copied.returncode == 0, copied.stderr
    listed = {e["name"]: e for e in map(json.loads, installed.flowkernel("examples", "--json").stdout.splitlines())}

    def run(command: str, **env: str) -> subprocess.CompletedProcess[str]:
        words = shlex.split(command)
        assert words[0] == "flowkernel"
        return installed.flowkernel(*words[1:], "--json", cwd=where, **env)

    # The README's example, as `flowkernel examples` lists it, with every deprecation warning shown.
    review = run(listed["review-loop"]["command"], PYTHONWARNINGS="always::DeprecationWarning")
    assert review.returncode == 0, review.stderr
    events = [json.loads(line) for line in review.stdout.splitlines()]
    assert events[-1]["type"] == "flow:complete" and events[-1]["status"] == "completed"
    assert "Warning" not in review.stderr, review.stderr

    # The research example needs its plugin, which is importable from the installed package.
    research = run(listed["research"]["command"])
    assert research.returncode == 3, research.stderr
    waiting = [e for e in map(json.loads, research.stdout.splitlines()) if e["type"] == "node:waiting"][-1]
    replied = installed.flowkernel("--plugin", "flowkernel.examples.research_tools", "reply", waiting["flowRunId"],
                                   "--to", waiting["runId"], "Mostly record transactions.", "--fixtures",
                                   "fixtures/research", cwd=where)
    assert replied.returncode == 0, replied.stderr
