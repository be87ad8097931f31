"""pytest plugin (entry point ``pytest11``): fixtures for testing flows offline."""

from __future__ import annotations
