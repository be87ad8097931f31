"""A plain function that blocks is marked ``blocking`` and runs in a worker thread: while it waits,
the run's other node runs, its commands and its lease go on. Unmarked plain functions run on the
event loop, as before."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from flowkernel.core.node_context import NodeContext
from flowkernel.errors import InvalidInputError
from flowkernel.plugins.registry import Blocking, Registry, blocking, default_registry
from flowkernel.testing.harness import run_flow

HOLD_S = 10.0  # how long the held function waits for its release before it gives up (and fails the run)


def parallel_wait_and_release() -> dict[str, Any]:
    """``wait`` holds until ``release``, a node run beside it, lets it go."""
    return {"name": "held", "nodes": [
        {"id": "start", "type": "noop", "input": {}},
        {"id": "wait", "type": "python", "input": {"function": "wait"}},
        {"id": "release", "type": "python", "input": {"function": "release"}},
        {"id": "end", "type": "noop", "input": {}}],
        "edges": [{"from": "start", "to": "wait"}, {"from": "start", "to": "release"},
                  {"from": "wait", "to": "end"}, {"from": "release", "to": "end"}]}


def registry_with(wait: Any, gate: threading.Event) -> Registry:
    registry = default_registry().copy()

    async def release() -> str:
        gate.set()
        return "released"

    registry.add_function("wait", wait)
    registry.add_function("release", release)
    return registry


def test_a_blocking_function_waits_in_a_thread_while_the_run_goes_on() -> None:
    gate = threading.Event()

    def wait() -> str:
        if not gate.wait(HOLD_S):
            raise RuntimeError("never released: the event loop was blocked")
        return "let go"

    result = run_flow(parallel_wait_and_release(), registry=registry_with(blocking(wait), gate))
    assert result.status == "completed", result.error
    assert result.outputs["wait"] == "let go"


def test_an_unmarked_plain_function_runs_on_the_event_loop() -> None:
    seen: list[bool] = []

    def where() -> bool:
        seen.append(threading.current_thread() is threading.main_thread())
        return True

    registry = default_registry().copy()
    registry.add_function("where", where)
    registry.add_function("where_blocking", blocking(where))
    doc = {"name": "where", "nodes": [{"id": "a", "type": "python", "input": {"function": "where"}},
                                      {"id": "b", "type": "python", "input": {"function": "where_blocking"}}],
           "edges": [{"from": "a", "to": "b"}]}
    assert run_flow(doc, registry=registry).status == "completed"
    assert seen == [True, False]


def test_blocking_keeps_the_name_and_arguments_of_what_it_marks() -> None:
    registry = default_registry().copy()

    @registry.register_function
    @blocking
    def fetch_page(url: str, retries: int = 2) -> str:
        return f"{url}:{retries}"

    assert isinstance(registry.functions["fetch_page"], Blocking)
    doc = {"name": "fetch", "nodes": [{"id": "f", "type": "python",
                                       "input": {"function": "fetch_page", "args": {"url": "u", "retries": 3}}}]}
    assert run_flow(doc, registry=registry).outputs["f"] == "u:3"
    assert blocking(registry.functions["fetch_page"]) is registry.functions["fetch_page"]


def test_blocking_refuses_functions_that_take_ctx_or_are_async() -> None:
    def uses_state(ctx: NodeContext) -> None:
        ctx.patch_state("set", "x", 1)

    async def already_async() -> None:
        return None

    with pytest.raises(InvalidInputError, match=r"blocking\(.*uses_state\): a function run in a worker thread "
                                                r"cannot take `ctx`.*make it async"):
        blocking(uses_state)
    with pytest.raises(InvalidInputError, match=r"already_async\): an async function does not block"):
        blocking(already_async)


def test_a_timeout_fails_a_blocking_call_when_it_returns() -> None:
    def overruns() -> str:
        time.sleep(0.3)  # the work itself: three times the node's timeout
        return "late"

    registry = default_registry().copy()
    registry.add_function("overruns", blocking(overruns))
    doc = {"name": "late", "nodes": [{"id": "slow", "type": "python", "input": {"function": "overruns"},
                                      "policy": {"timeoutMs": 100}}]}
    result = run_flow(doc, registry=registry)
    assert result.status == "failed"
    assert "slow" not in result.outputs
    assert [(f.node, f.error_type) for f in result.failures] == [("slow", "timeout")], result.failures
