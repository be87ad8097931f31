"""What the soak's process server imports once, so each forked ``flowkernel`` process starts warm:
the CLI and the runtime, the crash plugin, and the plugins the soak flows use (registered in the
default registry every forked process inherits)."""

from __future__ import annotations

import flowkernel.cli
import flowkernel.fixtures
import flowkernel.nodes.claude.node
import flowkernel.run.kernel
import flowkernel.run.loop  # noqa: F401
from flowkernel.plugins.registry import default_registry, load_plugins

from tests.soak import PLUGINS

default_registry()
load_plugins(PLUGINS)
