"""How the shell runs a run (node types never see it): the observability commit window, how often a run
with a budget looks at what its child runs spent, and how long a pause waits for cooperative nodes."""

from __future__ import annotations

import msgspec

OBSERVABILITY_COMMIT_MS = 50.0
BUDGET_POLL_S = 1.0
PAUSE_GRACE_S = 30.0


class Tuning(msgspec.Struct, frozen=True, kw_only=True):
    """``Kernel(tuning=Tuning(...))``; the documented ``services`` keys of the same names still set them.

    ``observability_commit_ms``: events that only show what a node is doing (streamed text, tool calls,
    what a call cost) are committed at most once per this many ms per run (0: every event at once);
    ``budget_poll_s``: how often a run with a budget looks at what its running child runs spent;
    ``pause_grace_s``: how long cooperative nodes have to finish their step when the run pauses."""

    observability_commit_ms: float = OBSERVABILITY_COMMIT_MS
    budget_poll_s: float = BUDGET_POLL_S
    pause_grace_s: float = PAUSE_GRACE_S
