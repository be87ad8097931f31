"""The ``lookup_fact`` tool of ``flows/research.json``: a small offline knowledge base, deterministic.

Load it with ``flowkernel --plugin flowkernel.examples.research_tools ...`` (it ships with flowkernel,
so this works from any folder) or ``FLOWKERNEL_PLUGINS=flowkernel.examples.research_tools``.
"""

from __future__ import annotations

from flowkernel.agents.tools import tool
from flowkernel.plugins.registry import register_tool

FACTS = {
    "sqlite": "SQLite is an embedded, serverless SQL database; one file holds the whole database.",
    "postgresql": "PostgreSQL is a client-server SQL database with MVCC, rich types and extensions.",
    "duckdb": "DuckDB is an embedded columnar database built for analytical queries.",
}


@register_tool
@tool()
def lookup_fact(topic: str) -> str:
    """Look up a short fact about a database in the offline knowledge base."""
    return FACTS.get(topic.strip().lower(), f"No fact is known about {topic!r}.")

