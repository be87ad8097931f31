"""The price table: every served model priced, each family's rates to the cent, long-prompt tiers."""

from __future__ import annotations

import datetime as dt
import json
import re
import typing
from pathlib import Path

import pytest
from anthropic.resources.messages.messages import DEPRECATED_MODELS
from anthropic.types.model_param import ModelParam
from flowkernel.errors import InvalidInputError
from flowkernel.nodes.claude.config import DEFAULT_MODEL
from flowkernel.nodes.claude.pricing import DEFAULT_PRICES, cost_usd, find_price, price_table

ROOT = Path(__file__).resolve().parent.parent

# One call: 30k input, 8k output, 20k written to the cache, 40k read from it (a 90k-token prompt).
USAGE = {"inputTokens": 30_000, "outputTokens": 8_000, "cacheCreationInputTokens": 20_000,
         "cacheReadInputTokens": 40_000}

# Worked by hand from the published rates (input, output, 5m cache write, cache read per MTok).
EXPECTED_USD = {
    "claude-fable-5-2": 0.768,   # 30k*8 + 8k*40 + 20k*10 + 40k*0.20
    "claude-mythos-5-2": 0.768,
    "claude-fable-5-1": 0.96,    # 30k*10 + 8k*50 + 20k*12.50 + 40k*0.25
    "claude-mythos-5-1": 0.96,
    "claude-fable-5": 0.99,      # 30k*10 + 8k*50 + 20k*12.50 + 40k*1
    "claude-mythos-5": 0.99,
    "claude-opus-5-5": 0.388,    # 30k*4 + 8k*20 + 20k*5 + 40k*0.20
    "claude-opus-5": 0.495,      # 30k*5 + 8k*25 + 20k*6.25 + 40k*0.50
    "claude-opus-4-8": 0.495,
    "claude-opus-4-7": 0.495,
    "claude-opus-4-6": 0.495,
    "claude-opus-4-5-20251101": 0.495,
    "claude-opus-4-1": 1.485,    # 30k*15 + 8k*75 + 20k*18.75 + 40k*1.50
    "claude-sonnet-5-5": 0.194,  # 30k*2 + 8k*10 + 20k*2.50 + 40k*0.10
    "claude-sonnet-5": 0.198,    # 30k*2 + 8k*10 + 20k*2.50 + 40k*0.20
    "claude-sonnet-4-6": 0.297,  # 30k*3 + 8k*15 + 20k*3.75 + 40k*0.30
    "claude-sonnet-4-5-20250929": 0.297,
    "claude-haiku-5-5": 0.0099,  # 30k*0.10 + 8k*0.50 + 20k*0.125 + 40k*0.01
    "claude-haiku-4-5-20251001": 0.099,  # 30k*1 + 8k*5 + 20k*1.25 + 40k*0.10
}


def _cents(usd: float) -> int:
    return round(usd * 100)


@pytest.mark.parametrize("model", sorted(EXPECTED_USD))
def test_each_family_costs_its_published_rates_including_cache_writes_and_reads(model: str) -> None:
    cost = cost_usd(USAGE, find_price(model, DEFAULT_PRICES))
    assert cost == pytest.approx(EXPECTED_USD[model], abs=1e-12)
    assert _cents(cost) == _cents(EXPECTED_USD[model])


def test_haiku_5_5_bills_a_prompt_over_100k_tokens_at_the_higher_tier_on_every_token() -> None:
    price = find_price("claude-haiku-5-5", DEFAULT_PRICES)
    at_limit = {**USAGE, "inputTokens": 40_000}  # 40k + 20k + 40k: exactly 100k, still the base rates
    assert cost_usd(at_limit, price) == pytest.approx(0.0109, abs=1e-12)  # 40k*0.10 + 8k*0.50 + 20k*0.125 + 40k*0.01
    over = {**USAGE, "inputTokens": 60_000}  # a 120k prompt: $0.50 / $2.50 / $0.625 / $0.05
    assert cost_usd(over, price) == pytest.approx(0.0645, abs=1e-12)  # 60k*0.5 + 8k*2.5 + 20k*0.625 + 40k*0.05


def test_sonnet_4_5_bills_a_prompt_over_200k_tokens_at_the_long_context_rates() -> None:
    usage = {**USAGE, "inputTokens": 150_000}  # a 210k prompt: $6 / $22.50 / $7.50 / $0.60
    cost = cost_usd(usage, find_price("claude-sonnet-4-5", DEFAULT_PRICES))
    assert cost == pytest.approx(1.254, abs=1e-12)  # 150k*6 + 8k*22.5 + 20k*7.5 + 40k*0.6


def _end_of_life(text: str) -> dt.date:
    return dt.datetime.strptime(re.sub(r"(\d+)(st|nd|rd|th)", r"\1", text), "%B %d, %Y").date()


def test_every_model_the_installed_sdk_knows_and_still_serves_has_a_price() -> None:
    ids = [m for m in typing.get_args(typing.get_args(ModelParam)[0])]
    assert "claude-sonnet-5-5" in ids  # the literal list is where we think it is
    served = [m for m in ids if m not in DEPRECATED_MODELS or _end_of_life(DEPRECATED_MODELS[m]) >= dt.date.today()]
    assert [m for m in served if find_price(m, DEFAULT_PRICES) is None] == []


def test_the_default_model_and_the_examples_models_are_not_deprecated() -> None:
    assert DEFAULT_MODEL not in DEPRECATED_MODELS
    assert find_price(DEFAULT_MODEL, DEFAULT_PRICES) is not None
    for path in sorted((ROOT / "flows").glob("*.json")):
        for node in json.loads(path.read_text())["nodes"]:
            model = node.get("input", {}).get("model") if isinstance(node.get("input"), dict) else None
            assert model is None or model not in DEPRECATED_MODELS, f"{path.name}: node {node['id']} uses {model}"


def test_overrides_may_give_a_long_prompt_tier_and_bad_ones_are_refused() -> None:
    table = price_table({"my-model": {"input": 1, "output": 2, "longPrompt": {"above": 10, "input": 3, "output": 4}}})
    price = find_price("my-model-v2", table)
    assert cost_usd({"inputTokens": 10, "outputTokens": 1}, price) == pytest.approx(12 / 1e6)
    assert cost_usd({"inputTokens": 11, "outputTokens": 1}, price) == pytest.approx(37 / 1e6)
    with pytest.raises(InvalidInputError, match="longPrompt"):
        price_table({"m": {"input": 1, "output": 2, "longPrompt": {"input": 3, "output": 4}}})
