"""Whether this process can call the Anthropic Messages API, and the one sentence that says how to
make it so: ``flowkernel run`` refuses with it before anything is stored, ``record`` before a model is
called, and an agent node executed without credentials (by a worker, or ``serve``) fails with it.

Read from the environment only, without importing the SDK (whose import costs more than a small
run): ``ANTHROPIC_API_KEY``, ``ANTHROPIC_AUTH_TOKEN`` or ``ANTHROPIC_BASE_URL`` (a compatible server,
which may need no key), or what the SDK's own credential discovery would look at (a profile, a
config folder, workload identity), which is then left to the SDK.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flowkernel.errors import InvalidInputError

CREDENTIAL_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL")
KEY_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
# What makes the SDK look for credentials of its own (profiles, workload identity federation).
_DISCOVERY_VARIABLES = ("ANTHROPIC_PROFILE", "ANTHROPIC_CONFIG_DIR", "ANTHROPIC_IDENTITY_TOKEN",
                        "ANTHROPIC_IDENTITY_TOKEN_FILE")


def has_key() -> bool:
    """An API key or auth token is set."""
    return any(os.environ.get(name) for name in KEY_VARIABLES)


def sdk_may_discover() -> bool:
    """The SDK's own credential discovery has something to look at: a variable that drives it, or its
    config folder (``~/.config/anthropic``; ``%APPDATA%\\Anthropic`` on Windows)."""
    if any(os.environ.get(name) for name in _DISCOVERY_VARIABLES):
        return True
    if sys.platform == "win32":
        base = os.environ.get("APPDATA")
        folder = Path(base) / "Anthropic" if base else Path.home() / "AppData" / "Roaming" / "Anthropic"
    else:
        folder = Path.home() / ".config" / "anthropic"
    try:
        return folder.is_dir()
    except (OSError, RuntimeError):  # no home directory to look in
        return False


def how_to_call(*, fixtures: bool = True) -> str:
    """How to give this process credentials (and, with ``fixtures``, the other way: recorded fixtures)."""
    other = ", or serve its model calls from recorded fixtures with --fixtures DIR" if fixtures else ""
    return f"set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN, or ANTHROPIC_BASE_URL for a compatible server){other}"


def missing_credentials(what: str, *, fixtures: bool = True) -> str | None:
    """The sentence that refuses ``what`` (which calls the API) when nothing says where or as whom to
    call it; None when something does. ``fixtures``: recorded fixtures are the other way to run it."""
    if any(os.environ.get(name) for name in CREDENTIAL_VARIABLES) or sdk_may_discover():
        return None
    return f"{what} calls the Anthropic Messages API and no credentials are set: {how_to_call(fixtures=fixtures)}"


def require_credentials(what: str, *, fixtures: bool = True) -> None:
    """Refuse, in one line, to start ``what`` against the API without credentials: better than failing
    at the first model call, after the nodes before it have run."""
    problem = missing_credentials(what, fixtures=fixtures)
    if problem is not None:
        raise InvalidInputError(f"{problem}; nothing was run")
