"""What a run executes with: the services the Kernel was given, read once into typed form
(``services_of``), and the query function each run's agents call, chosen in one place (``query_for``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from flowkernel.agents.default import default_query
from flowkernel.core.expression_scope import ExpressionLimits, limits_from_env
from flowkernel.core.services import NodeLimits, RunServices
from flowkernel.errors import InvalidInputError
from flowkernel.plugins.registry import default_registry
from flowkernel.run.settings import RunSettings, check_fixtures, import_plugins
from flowkernel.run.tuning import Tuning

if TYPE_CHECKING:
    from flowkernel.core.compiler import CompiledFlow
    from flowkernel.plugins.registry import Registry
    from flowkernel.run.flow_cache import FlowCache
    from flowkernel.store.base import RunRecord, Store


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"services[{key!r}]: expected a number, got {type(value).__name__}")
    return float(value)


def _whole(key: str, value: Any) -> int | None:
    if value is None:
        return None
    try:
        if isinstance(value, bool | float):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"services[{key!r}]: expected a whole number, got {value!r}") from None


def _query(key: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise InvalidInputError(f"services[{key!r}]: expected a query function, got {type(value).__name__}")
    return value


def _limits(key: str, value: Any) -> Any:
    if value is not None and not isinstance(value, ExpressionLimits):
        raise InvalidInputError(f"services[{key!r}]: expected flowkernel.core.expression_scope.ExpressionLimits, "
                                f"got {type(value).__name__}")
    return value


def _prices(key: str, value: Any) -> Any:
    if value is not None and not isinstance(value, Mapping):
        raise InvalidInputError(f"services[{key!r}]: expected a mapping of model to prices, "
                                f"got {type(value).__name__}")
    return value


def _fixtures(key: str, value: Any) -> Any:
    return None if value is None else str(value)


# The documented keys of ``Kernel(services={...})``: where each lands, and how it is checked.
_SERVICES: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "query_fn": ("query_fn", _query),
    "fixtures": ("fixtures", _fixtures),
    "tracer_provider": ("tracer_provider", lambda key, value: value),
    "prices": ("prices", _prices),
    "expression_limits": ("expression_limits", _limits),
}
_LIMITS: dict[str, str] = {"max_flow_depth": "flow_depth", "agent_max_total_turns": "agent_total_turns",
                           "tool_result_max_bytes": "tool_result_bytes"}
_TUNING: dict[str, str] = {"observability_commit_ms": "observability_commit_ms", "budget_poll_s": "budget_poll_s",
                           "pause_grace_s": "pause_grace_s"}
_IGNORED = frozenset({"kernel"})  # the Kernel itself, once put here: flow.call has ``ctx.children`` now


def services_of(given: RunServices | Mapping[str, Any] | None,
                tuning: Tuning | None = None) -> tuple[RunServices, Tuning]:
    """The typed services and tuning of a Kernel given ``services`` as ``RunServices`` or as the
    documented mapping (each known key to its field, a key flowkernel does not know to ``extra``; a
    value of the wrong type is an InvalidInputError naming the key). The expression limits not given
    are the ``FLOWKERNEL_EXPR_*`` variables' (read, and checked, now)."""
    if isinstance(given, RunServices):
        services, knobs = given, tuning or Tuning()
    else:
        fields: dict[str, Any] = {}
        limits: dict[str, Any] = {}
        knobs_given: dict[str, float] = {}
        extra: dict[str, Any] = {}
        for key, value in (given or {}).items():
            if key in _SERVICES:
                name, check = _SERVICES[key]
                fields[name] = check(key, value)
            elif key in _LIMITS:
                limits[_LIMITS[key]] = _whole(key, value)
            elif key in _TUNING:
                knobs_given[_TUNING[key]] = _number(key, value)
            elif key not in _IGNORED:
                extra[key] = value
        services = RunServices(**fields, limits=NodeLimits(**limits), extra=extra)
        knobs = tuning or Tuning(**knobs_given)
    if services.expression_limits is None:
        services = msgspec.structs.replace(services, expression_limits=limits_from_env())
    return services, knobs


def query_for(run_id: str, services: RunServices, settings: RunSettings, mocks: dict[str, Any], *,
              new: bool = False) -> RunServices:
    """``services`` with the query function ``run_id``'s agents call: the one the Kernel was given (tests,
    an embedding program) wins; else the run's fixtures (``--fixtures``: a ``MockQuery``, one per
    directory, kept in ``mocks``); else the Messages API (``agents.query.default_query``). A fixtures
    directory that is gone is refused here, before anything is recorded (a new run's gets MockQuery's
    own error: how to record one)."""
    if services.query_fn is not None:
        if services.fixtures is None or services.session_query is not None:
            return services
        return msgspec.structs.replace(services, session_query=_fixture_sessions(services.fixtures))
    if settings.fixtures is None:
        return msgspec.structs.replace(services, query_fn=default_query())
    if not new:
        check_fixtures(run_id, settings)
    mock = mocks.get(settings.fixtures)
    if mock is None:
        from flowkernel.fixtures.mock import MockQuery

        mock = mocks[settings.fixtures] = MockQuery(settings.fixtures)
    return msgspec.structs.replace(services, fixtures=settings.fixtures, query_fn=mock,
                                   session_query=_fixture_sessions(settings.fixtures))


def _fixture_sessions(directory: str) -> Callable[[str], Any]:
    """``claude.code`` sessions replayed from the fixtures in ``directory``, for a flow's name."""
    from flowkernel.fixtures.sessions import FixtureSessionQuery

    return lambda flow: FixtureSessionQuery(directory, flow)


class RunSetup:
    """What each run executes with here: its settings with this process's replacing what they set, the
    plugins they name (imported, and adopted by a registry of the caller's own), and its services."""

    def __init__(self, store: Store, registry: Registry, flows: FlowCache, services: RunServices,
                 settings: RunSettings) -> None:
        self.store, self.registry, self.flows = store, registry, flows
        self.services, self.settings = services, settings
        self._mocks: dict[str, Any] = {}

    def flow_for_run(self, run_id: str, source: str | Path | dict[str, Any]) -> CompiledFlow:
        """A flow to continue ``run_id`` on (``resume``/``retry`` with ``flow=``): a flow file's path or a
        flow document, validated with the plugins the run executes with loaded first (their functions
        and tools are names the flow may use)."""
        self.load_plugins_of(run_id)
        if isinstance(source, dict):
            return self.flows.compile(source, source="flowDocument")
        return self.flows.load(source)

    def load_plugins_of(self, run_id: str) -> None:
        """Import the plugin modules ``run_id`` executes with (its own, and this kernel's), as an
        execution of it would: what reads its flow file again (``rerun``, ``--flow``) then knows the
        functions, tools and node types the flow names. Raises SettingUnavailableError naming a module
        that does not import here."""
        record = self.store.get_run(run_id)
        settings = RunSettings.from_json(record.settings).overridden_by(self.settings)
        import_plugins(run_id, settings)
        if settings.plugins and self.registry is not default_registry():
            self.adopt_plugins()

    def prepare(self, record: RunRecord) -> RunServices:
        """The services to execute ``record``'s run with: its settings, with this kernel's replacing what
        they set (and kept for the run). Raises SettingUnavailableError, before anything is recorded,
        when the run needs what this process cannot provide."""
        stored = RunSettings.from_json(record.settings)
        effective = stored.overridden_by(self.settings)
        services = self.services_for(record.runId, effective)
        if effective != stored:
            self.store.set_run_settings(record.runId, effective.to_json())
        return services

    def services_for(self, run_id: str, settings: RunSettings, *, new: bool = False) -> RunServices:
        """The services ``run_id`` executes with under ``settings`` (its plugins imported first)."""
        import_plugins(run_id, settings)
        if settings.plugins and self.registry is not default_registry():
            self.adopt_plugins()
        return query_for(run_id, self.services, settings, self._mocks, new=new)

    def adopt_plugins(self) -> None:
        """Plugins register in the default registry: give this kernel's own registry what it lacks of it."""
        default = default_registry()
        for mine, theirs in ((self.registry.functions, default.functions), (self.registry.tools, default.tools),
                             (self.registry.node_types, default.node_types)):
            for name in list(theirs.keys()):
                if name not in mine:
                    mine[name] = theirs[name]  # type: ignore[assignment]
