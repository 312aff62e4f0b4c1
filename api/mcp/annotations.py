"""Tool annotation sets that several tools share, named once so the same kind of tool says the same thing.

A tool whose effects are its own (a write, a call out to a provider) spells its annotations out where
it is registered.
"""

from mcp.types import ToolAnnotations

__all__ = ["READ_ONLY"]

# Reads Coatcheck's own database and changes nothing: safe to call and repeat at will.
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
