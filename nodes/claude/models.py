"""What each Claude model accepts in a request: which thinking forms, effort, a temperature, native
structured output, compaction.

Checked when a flow is validated, so a node asks each model for thinking the way it wants it and
the user hears about a mismatch with the JSON path, before any call. A model is matched by its
longest id prefix (dated ids find their family). An id the table does not know (a newer model, a
gateway's alias) gets ``UNKNOWN``: everything allowed, the API has the last word.

Sources: the models' overview and migration pages and the adaptive-thinking page of the Claude
platform docs, checked 2026-11-22. Adaptive thinking (``thinking: {type: "adaptive"}`` with
``output_config.effort``) is the only thinking form from Opus 4.7 and Sonnet 5 on (budgeted thinking
answers 400); Opus 4.6, Sonnet 4.6 and Opus 5 still take ``budget_tokens`` (deprecated on the 4.6
models); Opus 4.5 and older take only ``budget_tokens`` (Opus 4.5 takes effort too). Sonnet 5 and
the 5.x models after it reject a non-default temperature.

Native structured output (``output_config.format``, generally available since early 2026, from the
structured-outputs page): Sonnet 4.5, Haiku 4.5, Opus 4.5 and every model after them; Opus 4.1 had it
in beta only and older models not at all, so they get the instruction in the system prompt instead
(``structured.py``). Context-management compaction (the ``compact-2026-01-12`` beta; the compaction
page lists Opus 4.6 and 4.7, Sonnet 4.6 and Mythos Preview, and the models released after it take it
too): not the 4.5 models and older, where validation refuses it instead of the API answering 400.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ADAPTIVE = "adaptive"
BUDGET = "budget"


@dataclass(frozen=True, slots=True)
class ModelTraits:
    thinking: frozenset[str]  # ADAPTIVE, BUDGET
    effort: bool = True  # takes output_config.effort
    temperature: bool = True  # takes a temperature other than the default (1)
    structured_output: bool = True  # takes output_config.format (native structured output)
    compaction: bool = True  # takes the compact_20260112 context-management edit


_ADAPTIVE_ONLY = ModelTraits(frozenset({ADAPTIVE}), effort=True, temperature=False)
_ADAPTIVE_ONLY_SAMPLING = ModelTraits(frozenset({ADAPTIVE}))
_BOTH = ModelTraits(frozenset({ADAPTIVE, BUDGET}))
_BUDGET_EFFORT = ModelTraits(frozenset({BUDGET}), effort=True, compaction=False)
_BUDGET_ONLY = ModelTraits(frozenset({BUDGET}), effort=False, compaction=False)
_BUDGET_ONLY_UNSTRUCTURED = ModelTraits(frozenset({BUDGET}), effort=False, structured_output=False, compaction=False)

UNKNOWN = ModelTraits(frozenset({ADAPTIVE, BUDGET}))

TRAITS: dict[str, ModelTraits] = {
    "claude-fable-5-2": _ADAPTIVE_ONLY,
    "claude-mythos-5-2": _ADAPTIVE_ONLY,
    "claude-fable-5-1": _ADAPTIVE_ONLY,
    "claude-mythos-5-1": _ADAPTIVE_ONLY,
    "claude-fable-5": _ADAPTIVE_ONLY_SAMPLING,
    "claude-mythos-5": _ADAPTIVE_ONLY_SAMPLING,
    "claude-opus-5-5": _ADAPTIVE_ONLY,
    "claude-opus-5": _BOTH,
    "claude-opus-4-8": _ADAPTIVE_ONLY_SAMPLING,
    "claude-opus-4-7": _ADAPTIVE_ONLY_SAMPLING,
    "claude-opus-4-6": _BOTH,
    "claude-opus-4-5": _BUDGET_EFFORT,
    "claude-opus-4-1": _BUDGET_ONLY_UNSTRUCTURED,
    "claude-opus-4-0": _BUDGET_ONLY_UNSTRUCTURED,
    "claude-opus-4-20250514": _BUDGET_ONLY_UNSTRUCTURED,
    "claude-sonnet-5-5": _ADAPTIVE_ONLY,
    "claude-sonnet-5": _ADAPTIVE_ONLY,
    "claude-sonnet-4-6": _BOTH,
    "claude-sonnet-4-5": _BUDGET_ONLY,
    "claude-sonnet-4-0": _BUDGET_ONLY_UNSTRUCTURED,
    "claude-sonnet-4-20250514": _BUDGET_ONLY_UNSTRUCTURED,
    "claude-haiku-5-5": _ADAPTIVE_ONLY,
    "claude-haiku-4-5": _BUDGET_ONLY,
}


def traits(model: str) -> ModelTraits:
    """What ``model`` accepts; ``UNKNOWN`` (everything) for an id the table does not know."""
    best = max((k for k in TRAITS if model.startswith(k)), key=len, default=None)
    return TRAITS[best] if best is not None else UNKNOWN


# Where the installed ``anthropic`` SDK keeps the models it warns about (model id -> end-of-life date).
SDK_DEPRECATIONS = "anthropic._data.deprecated_models"


def deprecated_models() -> dict[str, str]:
    """The installed ``anthropic`` SDK's deprecation table: model id -> the date it reaches end of life.
    Empty when this SDK keeps none where it is looked for (the table is the SDK's, not a public API).

    Read without importing the SDK, whose import costs more than a whole validation: the table module
    as the SDK loaded it in this process, else its file executed on its own."""
    module = sys.modules.get(SDK_DEPRECATIONS) or _table_file()
    table = getattr(module, "DEPRECATED_MODELS", None)
    if not isinstance(table, dict):
        return {}
    return {k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, str)}


@functools.cache
def _table_file() -> ModuleType | None:
    try:
        spec = importlib.util.find_spec("anthropic")  # finds the package without importing it
        folders = list(spec.submodule_search_locations or ()) if spec is not None else []
        if not folders:
            return None
        path = Path(folders[0], "_data", "deprecated_models.py")
        loaded = importlib.util.spec_from_file_location("_flowkernel_sdk_deprecated_models", path)
        if not path.is_file() or loaded is None or loaded.loader is None:
            return None
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
        return module
    except Exception:  # an SDK laid out otherwise: no table, so no warning
        return None
