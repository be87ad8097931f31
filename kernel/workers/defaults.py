"""A worker's defaults (DESIGN §11), one definition for every face of the worker pool:
``flowkernel.workers.worker.Worker``, ``flowkernel worker`` and ``flowkernel serve`` (whose in-process
workers are the same class). Kept apart from the worker itself, so that building the command line
(``flowkernel --help``) does not import the runtime."""

from __future__ import annotations

from flowkernel.run.defaults import DEFAULT_LEASE_S as DEFAULT_LEASE_S  # the Kernel's too: defined in run/

DEFAULT_CONCURRENCY = 8  # runs one worker executes at once
DEFAULT_GRACE_S = 30.0  # on SIGTERM, how long node runs in flight may take to finish before they are handed over
