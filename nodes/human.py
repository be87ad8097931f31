"""``human.input``: waits for a ``reply``; completes with the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowkernel.core.node import WaitFor, check_json_schema
from flowkernel.errors import Problem

if TYPE_CHECKING:
    from flowkernel.core.node_context import NodeContext


class HumanInputNode:
    """Input ``{"prompt": ..., "schema"?: JSON Schema}``. The run goes ``waiting`` until
    ``flowkernel reply RUN --to NODE_RUN_ID ANSWER``; the reply (validated against ``schema`` when
    the command is accepted) is the node's output. A ``send`` to it is judged and taken as its reply."""

    name = "human.input"
    takes_messages = True  # a send is its reply (judged against its schema like one)
    input_schema: dict[str, Any] = {
        "type": "object", "required": ["prompt"], "additionalProperties": False,
        "properties": {
            "prompt": {"description": "What to ask (any JSON; bindings allowed), shown with the waiting node run."},
            "schema": {"type": "object", "description": (
                "A JSON Schema the reply must match (a reply that does not is refused); $ref only within it.")},
        },
    }

    def check(self, raw_input: dict[str, Any], path: str, problems: list[Problem]) -> None:
        if "prompt" not in raw_input:
            problems.append(Problem(f"{path}.prompt", "human.input needs a `prompt`"))
        schema = raw_input.get("schema")
        if schema is not None:
            check_json_schema(schema, f"{path}.schema", problems)

    async def run(self, ctx: NodeContext) -> Any:
        data = ctx.input if isinstance(ctx.input, dict) else {}
        inbox = ctx.inbox()
        for message in inbox:
            if message.kind in ("reply", "send"):
                return message.content
        # Only resume messages (a resume that restarted this node): they ask nothing of a person, and
        # left in the inbox they would wait there as if they were an answer.
        await ctx.consume_inbox(len(inbox))
        schema = data.get("schema")
        return WaitFor(prompt=data.get("prompt"), schema=schema if isinstance(schema, dict) else None)
