"""Support for tests/conformance: the pinned MCP conformance suite run against Coatcheck behind a token proxy.

* ``profiles``: Coatcheck in the conformance or the production profile, behind ``token_proxy``.
* ``serve_profile``: the conformance profile's entry point (the production app plus ``fixtures``).
* ``fixtures``: the tools, prompts and resources the suite calls by fixed names (never loaded in production).
* ``suite``: run the suite and read its per-check results.
"""
