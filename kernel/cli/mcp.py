"""``mcp list FLOW NODE``: what the MCP servers of an agent node offer (started, asked, stopped)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flowkernel.cli.session import EXIT_OK, add_json, run_async
from flowkernel.errors import FlowkernelError, InvalidInputError, Problem


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser("mcp", help="the MCP servers of an agent node")
    commands = sp.add_subparsers(dest="mcp_command", metavar="COMMAND", required=True)
    ls = commands.add_parser("list", help="start a node's MCP servers and list the tools they offer "
                                          "(name as the model sees it, description, input schema)")
    ls.add_argument("flow")
    ls.add_argument("node", help="the id of a node with `mcpServers`")
    add_json(ls)
    ls.set_defaults(handler=cmd_list)


def _servers_of(flow_path: str, node_id: str) -> Any:
    from flowkernel.flowfiles.validated import load_valid_flow
    from flowkernel.plugins.registry import default_registry

    flow = load_valid_flow(flow_path, default_registry())
    node = flow.nodes.get(node_id)
    if node is None:
        raise InvalidInputError(f"{flow_path}: no node {node_id!r} (nodes: {', '.join(sorted(flow.nodes))})")
    servers = node.raw_input.get("mcpServers")
    if not servers:
        raise InvalidInputError(f"{flow_path}: node {node_id!r} has no `mcpServers`")
    if isinstance(servers, str) or "{{" in json.dumps(servers):
        raise InvalidInputError(f"{flow_path}: node {node_id!r}: `mcpServers` has bindings, resolved only when "
                                "the node runs; list a flow whose servers are written out")
    return servers


def cmd_list(args: argparse.Namespace) -> int:
    from flowkernel.agents.mcp import McpServerError, check_servers, open_servers, parse_servers

    servers = _servers_of(args.flow, args.node)
    problems: list[Problem] = []
    check_servers(servers, f"nodes.{args.node}.input.mcpServers", problems)
    if problems:
        raise InvalidInputError("; ".join(map(str, problems)))

    async def ask() -> list[Any]:
        async with open_servers(parse_servers(servers)) as running:
            return running.tools()

    try:
        tools = run_async(ask)
    except McpServerError as exc:
        raise FlowkernelError(str(exc)) from None
    for t in tools:
        if args.json:
            print(json.dumps({"server": t.server, "name": t.name, "description": t.description,
                              "inputSchema": t.input_schema}, ensure_ascii=False))
        else:
            print(f"{t.name}  ({t.server})\n  {t.description or '(no description)'}\n"
                  f"  input: {json.dumps(t.input_schema, ensure_ascii=False)}")
    return EXIT_OK
