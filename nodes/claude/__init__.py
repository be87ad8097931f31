"""``claude.agent``: the agent node (``node``), its input (``config``), its stored conversation
(``transcript``) and the price table its costs come from (``pricing``). The query function that calls
the Messages API through the ``anthropic`` SDK is ``flowkernel.agents.anthropic``."""

from flowkernel.nodes.claude.node import ClaudeAgentNode

__all__ = ["ClaudeAgentNode"]
