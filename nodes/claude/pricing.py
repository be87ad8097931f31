"""What model calls cost: a per-model price table (USD per million tokens) the user can override.

Overrides, later wins: the file named by ``FLOWKERNEL_PRICES`` (JSON), then ``services["prices"]``.
Both map a model id or id prefix to ``{"input", "output", "cacheWrite"?, "cacheRead"?}``; cache
prices default to 1.25x and 0.1x the input price, as the API bills them (5-minute cache writes).
A model is matched by its longest prefix in the table, so dated ids (``claude-sonnet-4-5-20250929``)
find their family.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flowkernel.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class Price:
    input: float
    output: float
    cache_write: float
    cache_read: float

    @staticmethod
    def of(spec: Mapping[str, Any]) -> Price:
        try:
            inp, out = float(spec["input"]), float(spec["output"])
        except (KeyError, TypeError, ValueError):
            raise InvalidInputError(f"price {dict(spec)!r} needs numeric `input` and `output` (USD per "
                                    "million tokens)") from None
        return Price(inp, out, float(spec.get("cacheWrite", inp * 1.25)), float(spec.get("cacheRead", inp * 0.1)))


# Published list prices, USD per million tokens.
DEFAULT_PRICES: dict[str, Price] = {
    name: Price.of({"input": i, "output": o}) for name, (i, o) in {
        "claude-opus-4-5": (5.0, 25.0),
        "claude-opus-4-1": (15.0, 75.0),
        "claude-opus-4": (15.0, 75.0),
        "claude-sonnet-4-5": (3.0, 15.0),
        "claude-sonnet-4": (3.0, 15.0),
        "claude-3-7-sonnet": (3.0, 15.0),
        "claude-3-5-sonnet": (3.0, 15.0),
        "claude-haiku-4-5": (1.0, 5.0),
        "claude-3-5-haiku": (0.8, 4.0),
        "claude-3-haiku": (0.25, 1.25),
        "claude-3-opus": (15.0, 75.0),
    }.items()
}


def price_table(overrides: Mapping[str, Any] | None = None) -> dict[str, Price]:
    """The default table with ``FLOWKERNEL_PRICES`` and then ``overrides`` applied."""
    table = dict(DEFAULT_PRICES)
    path = os.environ.get("FLOWKERNEL_PRICES")
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                loaded = json.load(fh)
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidInputError(f"FLOWKERNEL_PRICES={path}: cannot read a JSON price table: {exc}") from None
        if not isinstance(loaded, dict):
            raise InvalidInputError(f"FLOWKERNEL_PRICES={path}: must hold a JSON object of model -> price")
        table.update({k: Price.of(v) for k, v in loaded.items()})
    for k, v in (overrides or {}).items():
        table[k] = v if isinstance(v, Price) else Price.of(v)
    return table


def find_price(model: str, table: Mapping[str, Price]) -> Price | None:
    best = max((k for k in table if model.startswith(k)), key=len, default=None)
    return table[best] if best is not None else None


def cost_usd(usage: Mapping[str, int], price: Price | None) -> float:
    """Cost of one model's ``usage`` (inputTokens, outputTokens, cacheCreationInputTokens, cacheReadInputTokens)."""
    if price is None:
        return 0.0
    return (usage.get("inputTokens", 0) * price.input + usage.get("outputTokens", 0) * price.output
            + usage.get("cacheCreationInputTokens", 0) * price.cache_write
            + usage.get("cacheReadInputTokens", 0) * price.cache_read) / 1_000_000
