"""``claude.agent``: the agent node (``node``), its input (``config``), its stored conversation
(``transcript``), the query function that calls the Messages API through the ``anthropic`` SDK
(``query``) and the price table its costs come from (``pricing``)."""

from flowkernel.nodes.claude.node import ClaudeAgentNode

__all__ = ["ClaudeAgentNode"]
