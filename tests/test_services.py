"""What a run uses is typed: ``Kernel(services=...)`` takes ``RunServices`` or the documented mapping
(each key to its field, a key flowkernel does not know kept for the embedder's node types, a wrong
type refused naming the key), and the query function agents call is chosen in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.agents.default import default_query
from flowkernel.core.expression_scope import ExpressionLimits
from flowkernel.core.node_context import NodeContext
from flowkernel.core.services import NodeLimits, RunServices
from flowkernel.errors import InvalidInputError
from flowkernel.fixtures.mock import MockQuery
from flowkernel.run.kernel import Kernel
from flowkernel.run.settings import RunSettings
from flowkernel.run.setup import query_for
from flowkernel.run.tuning import Tuning
from flowkernel.store.memory import MemoryStore

from tests.helpers import flow, py, registry


async def a_query(request: dict[str, Any], emit: Any, ctx: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "hi"}], "stopReason": "end_turn"}


def test_every_documented_service_key_lands_in_its_typed_field() -> None:
    limits = ExpressionLimits(timeout_ms=1234)
    provider, prices = object(), {"claude-x": {"input": 1.0}}
    kernel = Kernel(MemoryStore(), services={
        "query_fn": a_query, "fixtures": Path("fx"), "tracer_provider": provider, "prices": prices,
        "expression_limits": limits, "max_flow_depth": 3, "agent_max_total_turns": 40,
        "tool_result_max_bytes": 512, "observability_commit_ms": 0, "budget_poll_s": 0.25,
        "pause_grace_s": 2, "kernel": "ignored"})
    s = kernel.services
    assert (s.query_fn, s.fixtures, s.tracer_provider, s.prices, s.expression_limits) == \
        (a_query, "fx", provider, prices, limits)
    assert s.limits == NodeLimits(flow_depth=3, agent_total_turns=40, tool_result_bytes=512)
    assert s.extra == {}  # "kernel" was flow.call's way to its child runs: it has ctx.children now
    assert kernel.tuning == Tuning(observability_commit_ms=0, budget_poll_s=0.25, pause_grace_s=2)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("observability_commit_ms", "fast", "expected a number"),
    ("max_flow_depth", "deep", "expected a whole number"),
    ("query_fn", "anthropic", "expected a query function"),
    ("expression_limits", {"timeout_ms": 5}, "expected flowkernel.core.expression_scope.ExpressionLimits"),
    ("prices", 3, "expected a mapping"),
])
def test_a_service_of_the_wrong_type_is_refused_naming_its_key(key: str, value: Any, expected: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        Kernel(MemoryStore(), services={key: value})
    assert f"services[{key!r}]" in str(caught.value) and expected in str(caught.value)


def test_a_service_flowkernel_does_not_know_reaches_node_types_typed_and_by_name() -> None:
    seen: dict[str, Any] = {}

    async def look(ctx: NodeContext) -> str:
        seen["extra"] = ctx.services.extra["greeting"]
        seen["by_name"] = ctx.services["greeting"]
        seen["prices"] = ctx.services.get("prices", "none given")
        return "ok"

    kernel = Kernel(MemoryStore(), registry=registry(look=look), services={"greeting": "hello"})
    snap = anyio.run(kernel.run, kernel.compile(flow([py("a", "look")])), {})
    assert snap.status == "completed"
    assert seen == {"extra": "hello", "by_name": "hello", "prices": "none given"}


def test_typed_services_and_tuning_are_taken_as_given() -> None:
    services = RunServices(query_fn=a_query, limits=NodeLimits(flow_depth=2))
    kernel = Kernel(MemoryStore(), services=services, tuning=Tuning(pause_grace_s=0.5))
    assert kernel.services.query_fn is a_query and kernel.services.limits.flow_depth == 2
    assert kernel.services.expression_limits is not None  # the environment's, read when the kernel is made
    assert kernel.tuning.pause_grace_s == 0.5


def test_the_query_function_is_the_given_one_else_the_fixtures_else_the_messages_api(tmp_path: Path) -> None:
    mocks: dict[str, Any] = {}
    given = RunServices(query_fn=a_query)
    assert query_for("run_1", given, RunSettings(fixtures=str(tmp_path)), mocks).query_fn is a_query
    from_fixtures = query_for("run_1", RunServices(), RunSettings(fixtures=str(tmp_path)), mocks)
    assert isinstance(from_fixtures.query_fn, MockQuery) and from_fixtures.fixtures == str(tmp_path)
    again = query_for("run_2", RunServices(), RunSettings(fixtures=str(tmp_path)), mocks)
    assert again.query_fn is from_fixtures.query_fn  # one mock per fixtures directory
    assert query_for("run_1", RunServices(), RunSettings(), mocks).query_fn is default_query()
