"""The models users get without choosing are ones the installed ``anthropic`` SDK does not deprecate.

This reads the SDK's own deprecation table on purpose: it is the canary that tells us, on the day a
new SDK release deprecates the default model or a shipped example's model, to move them on. Tests of
older models' behaviour do not depend on the table (they carry their own filterwarnings mark)."""

from __future__ import annotations

import warnings

import pytest
from anthropic._data.deprecated_models import DEPRECATED_MODELS
from flowkernel.nodes.claude.config import DEFAULT_MODEL

from tests.conftest import current_models


def test_the_default_model_and_the_shipped_examples_models_are_not_deprecated_by_the_installed_sdk() -> None:
    assert DEFAULT_MODEL in current_models()
    deprecated = {m: DEPRECATED_MODELS[m] for m in current_models() if m in DEPRECATED_MODELS}
    assert deprecated == {}, f"move these to a current model (end of life): {deprecated}"


def test_a_deprecation_warning_for_the_default_model_fails_the_suite() -> None:
    with pytest.raises(DeprecationWarning):
        warnings.warn(f"The model '{DEFAULT_MODEL}' is deprecated and will reach end-of-life on never.",
                      DeprecationWarning, stacklevel=1)


def test_a_deprecation_warning_for_an_older_model_only_warns() -> None:
    with pytest.warns(DeprecationWarning):
        warnings.warn("The model 'claude-3-opus' is deprecated and will reach end-of-life on never.",
                      DeprecationWarning, stacklevel=1)
