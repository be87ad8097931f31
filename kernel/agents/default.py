"""The default query function: the Messages API with the environment's credentials, made on its first
call, so that a run whose agents are served from fixtures, or never called, never imports the SDK."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flowkernel.agents.query import ModelMessage, QueryContext, QueryFn
from flowkernel.core.events import BaseEvent

if TYPE_CHECKING:
    from flowkernel.agents.anthropic import AnthropicQuery


class DefaultQuery:
    """The Messages API query (``AnthropicQuery`` with the environment's credentials), made on its first
    call: a run whose agents are never called, or are served from fixtures, never imports the SDK."""

    def __init__(self) -> None:
        self._query: AnthropicQuery | None = None

    async def __call__(self, request: dict[str, Any], emit: Callable[[BaseEvent], None],
                       ctx: QueryContext) -> ModelMessage:
        if self._query is None:
            from flowkernel.agents.anthropic import (
                AnthropicQuery,  # the SDK loads only when a model is called
            )

            self._query = AnthropicQuery()
        return await self._query(request, emit, ctx)


_DEFAULT = DefaultQuery()


def default_query() -> QueryFn:
    """The process's default query function: the Messages API, with the environment's credentials."""
    return _DEFAULT


def calls_the_api(query_fn: Any) -> bool:
    """Whether ``query_fn`` is the default one, which needs credentials (a query function given
    explicitly, fixtures or a client of its own, says where and as whom to call)."""
    return query_fn is None or query_fn is _DEFAULT
