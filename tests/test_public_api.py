"""The public API: the module paths the docs named before the package had its folders keep importing
(the module at its new home, under the old name, with a warning that names where it lives now)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from collections.abc import Iterator

import flowkernel
import pytest


@pytest.fixture
def planted_move() -> Iterator[str]:
    """An old path for a module that exists (``flowkernel.ids``), as a move would leave it."""
    old = "flowkernel.planted_old_path"
    flowkernel._MOVED[old] = "flowkernel.ids"
    try:
        yield old
    finally:
        del flowkernel._MOVED[old]
        sys.modules.pop(old, None)


def _import_fresh(old: str) -> tuple[object, list[warnings.WarningMessage]]:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    return module, list(caught)


def test_a_moved_path_imports_the_module_at_its_new_home_and_warns_with_it(planted_move: str) -> None:
    module, caught = _import_fresh(planted_move)
    assert module is importlib.import_module("flowkernel.ids")
    assert module.__spec__ is not None and module.__spec__.name == "flowkernel.ids"  # its own, not the alias's
    [warning] = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert str(warning.message) == f"{planted_move} is now flowkernel.ids; import from `flowkernel` instead"


@pytest.mark.parametrize("old", sorted(flowkernel._MOVED))
def test_every_documented_path_that_moved_still_imports_and_warns(old: str) -> None:
    module, caught = _import_fresh(old)
    assert module is importlib.import_module(flowkernel._MOVED[old])
    assert any(issubclass(w.category, DeprecationWarning) and flowkernel._MOVED[old] in str(w.message)
               for w in caught)


def test_a_path_that_never_existed_is_still_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("flowkernel.no_such_module_here")


def test_importing_flowkernel_imports_no_module_of_its_own() -> None:
    probe = ("import sys, flowkernel; print(sorted(m for m in sys.modules if m.startswith('flowkernel.')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
