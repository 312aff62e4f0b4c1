"""Authorization-server mode (``AUTH_MODE=authorization-server``): Coatcheck is the MCP clients' OAuth 2.1
authorization server and delegates the user's sign-in to the upstream OpenID provider at ``OIDC_ISSUER``.

The SDK's ``mcp.server.auth`` handlers parse and answer the OAuth requests (authorize, token, register,
revoke); :mod:`api.authserver.provider` implements their provider protocol over PostgreSQL
(:mod:`store.authserver`). See docs/authorization-server.md.
"""
