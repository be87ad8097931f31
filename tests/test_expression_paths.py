"""A plain path binding (``planner.text``) gives what JSONata gives, without walking the value."""

from __future__ import annotations

from typing import Any

import jsonata
import pytest
from flowkernel.core.expressions import Expr
from hypothesis import given, settings
from hypothesis import strategies as st

names = st.sampled_from(["a", "b", "c", "text", "and", "true"])
values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=4),
                      max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(names, values, max_size=4), st.lists(names, min_size=1, max_size=4))
def test_a_plain_path_evaluates_to_what_jsonata_gives(context: dict[str, Any], path: list[str]) -> None:
    source = ".".join(path)
    try:
        reference = jsonata.Jsonata(source)
        reference.set_validate_input(False)
        want = reference.evaluate(context)
    except Exception:
        with pytest.raises(Exception):  # noqa: B017 (a keyword in the path: JSONata's own error)
            Expr(source).evaluate(context)
        return
    assert repr(Expr(source).evaluate(context)) == repr(want)


class Untouchable(list[Any]):
    """A list that fails when anything walks it."""

    def __iter__(self) -> Any:
        raise AssertionError("the list was walked")


def test_binding_a_long_list_hands_it_over_without_walking_it() -> None:
    transcript = Untouchable([{"role": "user", "content": "x"}] * 10_000)
    context = {"agent": {"transcript": transcript}, "flow": {"input": {}}}
    assert Expr("agent.transcript").evaluate(context) is transcript
