"""The public API is what ``flowkernel`` itself offers (``from flowkernel import Kernel, register_tool``):
each name is the object its module defines, imported only when asked for, and the docs name these
rather than the modules inside the package."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import flowkernel
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("name", flowkernel.__all__)
def test_every_public_name_is_the_object_its_module_defines(name: str) -> None:
    if name in flowkernel._MODULES:
        assert getattr(flowkernel, name) is importlib.import_module(flowkernel._MODULES[name])
    else:
        assert getattr(flowkernel, name) is getattr(importlib.import_module(flowkernel._PUBLIC[name]), name)


def test_a_name_that_is_not_public_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = flowkernel.no_such_name  # type: ignore[attr-defined]


def test_asking_for_one_name_imports_its_module_and_not_the_rest() -> None:
    probe = ("import sys; from flowkernel import register_tool; "
             "print(sorted(m for m in ('flowkernel.plugins.registry', 'flowkernel.run.kernel', "
             "'flowkernel.store.sql.postgres', 'flowkernel.workers.worker') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['flowkernel.plugins.registry']"


def _doc_references() -> list[tuple[str, str, str]]:
    """(doc, module path, name) for every ``from flowkernel.x import name`` and every ``flowkernel.x.name``."""
    found: list[tuple[str, str, str]] = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for module, names in re.findall(r"from (flowkernel\.[\w.]+) import \(?([\w, \n]+)\)?", text):
            found += [(doc.name, module, n.strip()) for n in names.split(",") if n.strip()]
        for module, name in re.findall(r"\b(flowkernel(?:\.[a-z_]+)+)\.(\w+)", text):
            found.append((doc.name, module, name))
    return found


def test_the_docs_name_public_names_from_flowkernel_not_from_inside_the_package() -> None:
    references = _doc_references()
    assert any(module == "flowkernel.testing.harness" for _, module, _ in references)  # the reader sees them
    inside = sorted({f"{doc}: {module}.{name}" for doc, module, name in references if name in flowkernel.__all__})
    assert inside == [], "use `from flowkernel import …` for these:\n" + "\n".join(inside)
