"""The crash soak in the suite: runs of every example flow (with their fixtures and replies) and of two
deterministic flows, killed at seeded random durable writes in ``run``, ``reply`` and ``resume``, end
as uninterrupted runs do (``tests/soak.py`` says what is checked; ``scripts/soak`` runs any number).

A failure names its flow and seed: ``scripts/soak --case FLOW --seed SEED --trials 1`` runs it again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import soak

TRIALS = 105  # 15 per flow


@pytest.mark.slow
def test_runs_killed_at_random_moments_end_as_uninterrupted_runs(tmp_path: Path) -> None:
    report = soak.soak(TRIALS, tmp_path, jobs=2)
    assert len(report.trials) == TRIALS
    assert sum(t.kills for t in report.trials) >= TRIALS, "every trial kills at least its first process"
    assert not report.failures(), report.table() + "\n\n" + report.failures()
