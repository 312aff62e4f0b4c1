"""Connections: third-party OAuth at Coatcheck, completed in the browser through URL-mode elicitation.

``providers`` holds the configured providers at run time (their configuration is read by
:mod:`api.provider_config`, outside this package, so loading settings needs no OAuth library), ``client``
talks OAuth to them (authlib), ``login`` signs the browser in against ``OIDC_ISSUER``, ``session`` seals the
browser cookies, ``service`` is what the MCP tools and the browser routes share, ``routes`` and ``pages`` are
the browser side. See docs/connections.md.
"""
