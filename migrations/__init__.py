"""The Alembic migration chain, shipped inside the installed package so a wheel install can migrate.

``store.migrations`` finds this directory through ``importlib.resources``; nothing here is imported at run time.
"""
