"""A run's input against its flow: what may be stored, and the flow's ``inputs`` schema."""

from __future__ import annotations

from typing import Any

import msgspec
from flowkernel.core.commands import unstorable_at
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import encoder
from flowkernel.errors import PatternTimeoutError, RunInputError


def check_input(flow: CompiledFlow, value: Any) -> None:
    """Raise RunInputError if ``value`` does not satisfy the flow's ``inputs`` schema (or is not JSON
    that can be stored: text that is not UTF-8, nesting deeper than the encoder goes)."""
    found = unstorable_at(value, "input")
    if found is None:
        try:
            encoder.encode(value)
        except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
            found = ("input", f"is not JSON that can be stored: {exc}")
    if found is not None:
        where, problem = found
        raise RunInputError(f"{flow.source}: {where} {problem}", [(where, problem)])
    schema = flow.inputs_schema
    if schema is None:
        return
    from flowkernel.core.jsonschemas import instance_errors

    try:
        errors = instance_errors(schema, value, schema_at="$.inputs")
    except PatternTimeoutError as exc:
        problems = [(f"input{exc.where}", str(exc))]
        raise RunInputError(f"{flow.source}: input{exc.where}: {exc}", problems) from None
    if errors:
        problems = [(f"input{where}", message) for where, message in errors]
        raise RunInputError(f"{flow.source}: run input does not match `inputs`: "
                            + "; ".join(f"{where}: {message}" for where, message in problems), problems)
