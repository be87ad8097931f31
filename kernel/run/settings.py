"""How a run executes: the settings it was started with, kept with the run.

A run started with ``--fixtures DIR`` or ``--plugin MODULE`` needs them whenever it executes again:
after a reply, a send, a resume or a retry, in another process or a worker. So they are stored
with the run (``RunRecord.settings``), every execution uses them unless the process executing it
was given others (which then replace them for the run), and a setting the run needs but this
process cannot provide (a fixtures directory that is gone, a plugin that does not import here)
refuses the execution before anything is recorded, naming it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import msgspec
from flowkernel.errors import InvalidInputError


class SettingUnavailableError(InvalidInputError):
    """A run needs a setting (fixtures directory, plugin module) that this process cannot provide."""


class RunSettings(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """``fixtures``: the directory model calls are served from (absolute), instead of the API;
    ``plugins``: modules imported before the run executes (they register functions, tools, node types);
    ``rerunOf``: the run is a rerun of that one, whose recorded model calls and replies it replays
    (``flowkernel.run.timetravel.execute_rerun``)."""

    fixtures: str | None = None
    plugins: tuple[str, ...] = ()
    rerunOf: str | None = None

    @staticmethod
    def of(fixtures: str | Path | None = None, plugins: list[str] | tuple[str, ...] = ()) -> RunSettings:
        """Settings as a command line gives them: the directory made absolute (a run continued from
        another directory still finds it), plugin modules once each, in order."""
        unique = tuple(dict.fromkeys(p.strip() for p in plugins if p.strip()))
        return RunSettings(fixtures=str(Path(fixtures).resolve()) if fixtures else None, plugins=unique)

    @staticmethod
    def from_json(value: dict[str, Any] | None) -> RunSettings:
        return msgspec.convert(value or {}, RunSettings)

    def to_json(self) -> dict[str, Any] | None:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out or None

    def overridden_by(self, given: RunSettings) -> RunSettings:
        """These settings with what ``given`` sets: its fixtures directory instead, its plugins too."""
        return RunSettings(fixtures=given.fixtures or self.fixtures,
                           plugins=tuple(dict.fromkeys([*self.plugins, *given.plugins])), rerunOf=self.rerunOf)


def check_fixtures(run_id: str, settings: RunSettings) -> None:
    """Raise SettingUnavailableError if the (stored) run's fixtures directory is not there."""
    if settings.fixtures is not None and not Path(settings.fixtures).is_dir():
        raise SettingUnavailableError(
            f"run {run_id} serves its model calls from --fixtures {settings.fixtures}, which is not a directory "
            "now; pass --fixtures DIR to use another one")


def import_plugins(run_id: str, settings: RunSettings) -> None:
    """Import the run's plugin modules (each once per process); raise SettingUnavailableError naming
    one that does not import here."""
    from flowkernel.plugins.registry import load_plugins

    if settings.plugins and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `--plugin` does: a project's own modules import
    for module in settings.plugins:
        try:
            load_plugins([module])
        except InvalidInputError as exc:
            raise SettingUnavailableError(
                f"run {run_id} was started with --plugin {module}, which cannot be imported here ({exc}); "
                "run the command where the module imports (or with it on PYTHONPATH)") from None
