"""A plugin whose tool fails the way a careless HTTP client does: its error quotes the request it
sent, the API key in its headers included."""

from __future__ import annotations

import os

from flowkernel.plugins.registry import register_tool


@register_tool("status_page")
def status_page(service: str) -> str:
    """Fetch a service's status page."""
    headers = {"x-api-key": os.environ.get("ANTHROPIC_API_KEY", ""), "accept": "text/html"}
    raise RuntimeError(f"GET https://status.example/{service} failed: 502 from the proxy; sent headers {headers}")
