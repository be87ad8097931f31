"""Run defaults every face shares: the Kernel, ``flowkernel worker`` and ``flowkernel serve``. Imports
nothing, so that building the command line (``flowkernel --help``) stays light."""

from __future__ import annotations

DEFAULT_LEASE_S = 15.0  # how soon another worker takes over the runs of one that stopped renewing its leases
