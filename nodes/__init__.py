"""The built-in node types, one module each, named by the registry's table (``flowkernel.plugins.builtins``) and imported on first use; they see the run through ``ctx`` and never import the shell."""

from __future__ import annotations
