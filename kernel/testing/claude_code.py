"""Test help for Claude Code sessions: the hermetic place a real session runs in against the fake
Messages API (``flowkernel.testing.fake_api``), offline, reading nothing of the user's::

    with FakeAnthropic() as fake, hermetic_session(fake.base_url) as cc:
        assert (problem := cli_problem(cc.env())) is None, problem
        fake.script(reply(Text("Hello")))
        async for message in claude_agent_sdk.query(prompt="Hi", options=cc.options(cwd=work)):
            ...

The environment points the bundled Claude Code CLI at the fake (``ANTHROPIC_BASE_URL``, a dummy
key), turns off its nonessential traffic (session titles, telemetry: requests the script did not
plan for) and gives it a ``HOME`` and ``CLAUDE_CONFIG_DIR`` of its own, removed afterwards; the
options read no settings (``setting_sources=[]``: no user or project ``CLAUDE.md``, no permission
rules) and keep the CLI's stderr for the failure message. ``claude_agent_sdk`` is imported only by
``options``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from claude_agent_sdk import ClaudeAgentOptions

DUMMY_API_KEY = "sk-ant-fake-key-for-the-fake-api"
CLI_START_TIMEOUT_S = 60.0


@dataclass
class HermeticSession:
    """Where one Claude Code session runs: the fake's URL and a home of its own."""

    base_url: str
    home: Path
    stderr: list[str] = field(default_factory=list)  # the CLI's stderr lines, as the SDK passes them on

    def env(self, **extra: str) -> dict[str, str]:
        """The CLI's environment (the SDK lays it over ``os.environ``)."""
        return {
            "ANTHROPIC_BASE_URL": self.base_url,
            "ANTHROPIC_API_KEY": DUMMY_API_KEY,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "HOME": str(self.home),
            "CLAUDE_CONFIG_DIR": str(self.home / ".claude"),
            **extra,
        }

    def options(self, *, cwd: str | Path, **options: Any) -> ClaudeAgentOptions:
        """``ClaudeAgentOptions`` for a session in ``cwd`` here; ``options`` add to or override them."""
        from claude_agent_sdk import ClaudeAgentOptions

        defaults: dict[str, Any] = {"env": self.env(), "cwd": str(cwd), "setting_sources": [],
                                    "stderr": self.stderr.append}
        return ClaudeAgentOptions(**{**defaults, **options})


@contextmanager
def hermetic_session(base_url: str) -> Iterator[HermeticSession]:
    """A ``HermeticSession`` with a fresh temporary home, removed on exit."""
    home = Path(tempfile.mkdtemp(prefix="flowkernel-cc-home-"))
    try:
        yield HermeticSession(base_url, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def bundled_cli() -> Path | None:
    """The Claude Code CLI the installed ``claude-agent-sdk`` wheel bundles (found without importing it)."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "_bundled" / "claude"


def cli_problem(env: dict[str, str]) -> str | None:
    """Why the bundled CLI cannot start here (``claude --version`` in ``env`` over ``os.environ``, as
    the SDK starts it), or None if it can."""
    cli = bundled_cli()
    if cli is None:
        return "claude-agent-sdk is not installed: pip install -e '.[test]' (or 'flowkernel[claude-code]')"
    if not cli.is_file():
        return f"the Claude Code CLI the SDK bundles is missing: {cli} (a wheel for another platform?)"
    try:
        done = subprocess.run([str(cli), "--version"], env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=CLI_START_TIMEOUT_S)
    except OSError as exc:
        return f"cannot start {cli}: {exc}"
    except subprocess.TimeoutExpired:
        return f"{cli} --version did not answer within {CLI_START_TIMEOUT_S:.0f} s"
    if done.returncode != 0:
        return f"{cli} --version exited with {done.returncode}: {(done.stderr or done.stdout).strip()[-2000:]}"
    return None
