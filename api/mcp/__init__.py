"""The MCP surface: the SDK's server with Coatcheck's tools, mounted into the Litestar app."""
