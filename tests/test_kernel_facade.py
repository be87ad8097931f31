"""``Kernel`` delegates every method to the module named for its job, and still says what each does
(``help(Kernel.run)``) and takes the calls the docs show."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from flowkernel.run.kernel import Kernel

PUBLIC = sorted(name for name, value in vars(Kernel).items()
                if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)))


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_method_of_the_kernel_says_what_it_does(name: str) -> None:
    doc = inspect.getdoc(getattr(Kernel, name))
    assert doc and doc.strip(), f"Kernel.{name} has no docstring"


DOCUMENTED: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("__init__", ("runs.db",), {"registry": None, "services": {}}),
    ("load_flow", ("flows/hello.json",), {}),
    ("run", ("flow", {"name": "Ada"}), {}),
    ("events", ("run_1",), {}),
    ("snapshot", ("run_1",), {"at": 3}),
    ("resume", ("run_1", "go on"), {"budget": 5.0, "flow": None}),
    ("retry", ("run_1",), {"flow": None}),
    ("flow_for_run", ("run_1", "flows/hello.json"), {}),
    ("command", ("run_1", "cmd"), {}),
    ("follow", ("run_1",), {}),
    ("enqueue", ("flow", {}), {"idempotency_key": "k"}),
]


@pytest.mark.parametrize(("name", "args", "kwargs"), DOCUMENTED, ids=[d[0] for d in DOCUMENTED])
def test_every_documented_call_still_binds(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    inspect.signature(getattr(Kernel, name)).bind(None, *args, **kwargs)
