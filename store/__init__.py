"""Coatcheck's durable state: PostgreSQL through SQLAlchemy 2 (async).

This package never imports Litestar or MCP. Every repository call takes the
principal first and scopes its SQL to it.
"""
