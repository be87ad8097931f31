"""What model calls cost: a per-model price table (USD per million tokens) the user can override.

Overrides, later wins: the file named by ``FLOWKERNEL_PRICES`` (JSON), then the run's ``RunServices.prices``.
Both map a model id or id prefix to ``{"input", "output", "cacheWrite"?, "cacheRead"?, "longPrompt"?}``;
cache prices default to 1.25x and 0.1x the input price, as the API bills them (5-minute cache writes),
and ``longPrompt`` (``{"above": <prompt tokens>, "input", "output", ...}``) gives the rates of a
request whose prompt is longer than ``above`` tokens. A model is matched by its longest prefix in the
table, so dated ids (``claude-haiku-4-5-20251001``) find their family.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flowkernel.core.events import USAGE_KEYS
from flowkernel.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class Price:
    """Rates of one model, USD per million tokens. ``long`` applies instead to a request whose prompt
    (input, cache writes and cache reads together) is longer than ``long_above`` tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float
    long: Price | None = None
    long_above: int = 0

    @staticmethod
    def of(spec: Mapping[str, Any]) -> Price:
        try:
            inp, out = float(spec["input"]), float(spec["output"])
            cache_write = float(spec.get("cacheWrite", inp * 1.25))
            cache_read = float(spec.get("cacheRead", inp * 0.1))
        except (KeyError, TypeError, ValueError):
            raise InvalidInputError(f"price {dict(spec)!r} needs numeric `input` and `output` (USD per "
                                    "million tokens), and numeric `cacheWrite`/`cacheRead` if given") from None
        long_spec = spec.get("longPrompt")
        if long_spec is None:
            return Price(inp, out, cache_write, cache_read)
        above = long_spec.get("above") if isinstance(long_spec, Mapping) else None
        if not isinstance(above, int) or isinstance(above, bool) or above < 1:
            raise InvalidInputError(f"price {dict(spec)!r}: `longPrompt` needs `above` (a prompt length in "
                                    "tokens) and the rates that apply above it")
        return Price(inp, out, cache_write, cache_read, Price.of(long_spec), above)


def _rates(inp: float, out: float, write: float, read: float) -> Price:
    return Price(inp, out, write, read)


# List prices of the Claude API, USD per million tokens: base input, output, 5-minute cache write,
# cache read. Source: platform.claude.com/docs/en/about-claude/pricing and each model's overview
# page, checked 2026-11-22 (Sonnet 5.5's cache read is $0.10 since 2026-10-07). Every model the API
# still serves is here, and Opus 4 / 4.1, still served on Amazon Bedrock and Google Cloud. Cache
# writes are 1.25x input; cache reads 0.1x input, except 0.025x on Fable/Mythos 5.1 and 5.2 and 0.05x
# on Opus 5.5 and Sonnet 5.5. Haiku 5.5 bills a prompt over 100,000 tokens at five times its rates,
# every token of that request included; Sonnet 4.5 one over 200,000 tokens (1M context) at 2x input
# and 1.5x output.
DEFAULT_PRICES: dict[str, Price] = {
    "claude-fable-5-2": _rates(8.0, 40.0, 10.0, 0.20),
    "claude-mythos-5-2": _rates(8.0, 40.0, 10.0, 0.20),
    "claude-fable-5-1": _rates(10.0, 50.0, 12.50, 0.25),
    "claude-mythos-5-1": _rates(10.0, 50.0, 12.50, 0.25),
    "claude-fable-5": _rates(10.0, 50.0, 12.50, 1.0),
    "claude-mythos-5": _rates(10.0, 50.0, 12.50, 1.0),
    "claude-opus-5-5": _rates(4.0, 20.0, 5.0, 0.20),
    "claude-opus-5": _rates(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-8": _rates(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-7": _rates(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-6": _rates(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-5": _rates(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": _rates(15.0, 75.0, 18.75, 1.50),
    "claude-opus-4-0": _rates(15.0, 75.0, 18.75, 1.50),
    "claude-opus-4-20250514": _rates(15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-5-5": _rates(2.0, 10.0, 2.50, 0.10),
    "claude-sonnet-5": _rates(2.0, 10.0, 2.50, 0.20),
    "claude-sonnet-4-6": _rates(3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4-5": Price(3.0, 15.0, 3.75, 0.30, _rates(6.0, 22.50, 7.50, 0.60), 200_000),
    "claude-haiku-5-5": Price(0.10, 0.50, 0.125, 0.01, _rates(0.50, 2.50, 0.625, 0.05), 100_000),
    "claude-haiku-4-5": _rates(1.0, 5.0, 1.25, 0.10),
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


def prompt_tokens(usage: Mapping[str, int]) -> int:
    """Every token of one request's prompt: the API reports cache reads and writes apart from input."""
    return (usage.get("inputTokens", 0) + usage.get("cacheCreationInputTokens", 0)
            + usage.get("cacheReadInputTokens", 0))


def cost_usd(usage: Mapping[str, int], price: Price | None) -> float:
    """Cost of one model call's ``usage`` (inputTokens, outputTokens, cacheCreationInputTokens,
    cacheReadInputTokens). One call: a long-prompt rate depends on that request's prompt alone."""
    if price is None:
        return 0.0
    if price.long is not None and prompt_tokens(usage) > price.long_above:
        price = price.long
    return (usage.get("inputTokens", 0) * price.input + usage.get("outputTokens", 0) * price.output
            + usage.get("cacheCreationInputTokens", 0) * price.cache_write
            + usage.get("cacheReadInputTokens", 0) * price.cache_read) / 1_000_000


@dataclass(slots=True)
class Tally:
    """Usage and cost of this pass of the node (calls made before an interruption included), per model
    and in total."""

    prices: dict[str, Price]
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS, 0))
    by_model: dict[str, dict[str, Any]] = field(default_factory=dict)
    cost: float = 0.0

    def add(self, model: str, usage: dict[str, int], passes: list[dict[str, Any]] | None = None) -> float:
        """Count one call; returns what it cost. ``passes``: the call's ``iterations`` (a compaction's
        summarizing pass, then the message), each priced as the request it is (long-prompt rates go
        by each pass's own prompt); ``usage`` is their sum."""
        entry = self.by_model.setdefault(model, {**dict.fromkeys(USAGE_KEYS, 0), "costUSD": 0.0})
        price = find_price(model, self.prices)
        call_cost = sum(cost_usd(p, price) for p in passes) if passes else cost_usd(usage, price)
        for k in USAGE_KEYS:
            self.usage[k] += int(usage.get(k, 0))
            entry[k] += int(usage.get(k, 0))
        entry["costUSD"] += call_cost
        entry["priced"] = price is not None
        self.cost += call_cost
        return call_cost
