"""Coatcheck's protocol and HTTP surface: translates MCP and browser requests into store calls."""
