"""What node runs, commands and timers hand to a run's loop (besides events), in the order they came.

The loop's messages are msgspec structs: a dataclass costs each process that imports it half a
millisecond to build, a struct a twentieth of that.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from flowkernel.core.commands import Command, CommandOutcome
from flowkernel.core.events import BaseEvent, FlowPaused
from flowkernel.run.commit_policy import Durable


class Incoming(msgspec.Struct):
    """A command for the run, from this process or the store's command queue (``command_id``)."""

    command: Command
    command_id: int | None = None
    reply: Callable[[CommandOutcome], None] | None = None


class Finished(msgspec.Struct):
    """A node run ended without an event (interrupted at a step boundary by a pause)."""

    node_id: str
    item: int | None
    pause: FlowPaused | None = None  # it stopped of its own accord: the run pauses (node.Interrupted)


class Wake(msgspec.Struct):
    """Nothing to apply: makes the loop look at its state again."""


class CostCheck(msgspec.Struct):
    """Look at what the run's child runs have spent so far (``BudgetWatch.watch_children``)."""


Message = BaseEvent | Durable | Incoming | Finished | Wake | CostCheck
