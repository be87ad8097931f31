"""``--input KEY=VALUE`` and ``--input-json FILE``: a run's input from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.nesting import MAX_DEPTH
from flowkernel.core.nonfinite import loads_strict
from flowkernel.errors import InvalidInputError


def parse_inputs(flow: CompiledFlow, pairs: list[str], json_file: str | None) -> dict[str, Any]:
    """``--input k=v`` pairs (JSON values unless the schema wants a string) and ``--input-json FILE``."""
    value: dict[str, Any] = {}
    if json_file:
        path = Path(json_file)
        try:
            loaded = loads_strict(path.read_text(encoding="utf-8"))
        except RecursionError:
            raise InvalidInputError(f"--input-json {json_file}: nested too deeply to read (flowkernel takes at most "
                                    f"{MAX_DEPTH} levels of lists and objects)") from None
        except FileNotFoundError:
            raise InvalidInputError(f"--input-json {json_file}: no such file") from None
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or NaN or Infinity (JSON has neither)
            raise InvalidInputError(f"--input-json {json_file}: not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise InvalidInputError(f"--input-json {json_file}: must hold a JSON object")
        value.update(loaded)
    props = (flow.inputs_schema or {}).get("properties", {})
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise InvalidInputError(f"--input {pair!r}: expected KEY=VALUE")
        want = props.get(key, {}).get("type") if isinstance(props.get(key), dict) else None
        if want == "string":
            value[key] = raw
            continue
        try:
            value[key] = loads_strict(raw)
        except RecursionError:
            raise InvalidInputError(f"--input {key}=…: nested too deeply to read (flowkernel takes at most "
                                    f"{MAX_DEPTH} levels of lists and objects)") from None
        except json.JSONDecodeError:
            value[key] = raw
        except ValueError as exc:  # NaN or Infinity: not JSON, and not to be stored as text by surprise
            raise InvalidInputError(f"--input {key}=…: {exc}; quote it as a JSON string to pass the text") from None
    return value

