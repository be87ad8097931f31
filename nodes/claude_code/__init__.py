"""``claude.code``: Claude Code sessions as durable nodes (DESIGN §7b): the node (``node``), its input
(``config``) and how a session's messages become events and history (``stream``). The sessions
themselves are opened through ``flowkernel.agents.sessions``."""

from flowkernel.nodes.claude_code.node import ClaudeCodeNode

__all__ = ["ClaudeCodeNode"]
