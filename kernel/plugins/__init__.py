"""Registries of node types, functions and tools, the built-in table (module:attr strings), entry points and --plugin imports; no node module is imported here."""
