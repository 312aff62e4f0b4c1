"""Raw 2026-07-28 JSON-RPC over HTTP, for checks the SDK client would hide."""

import itertools
import json
from typing import Any

import httpx2

PROTOCOL_VERSION = "2026-07-28"
_ids = itertools.count(1)


def modern_request(
    method: str,
    params: dict[str, Any] | None = None,
    *,
    capabilities: dict[str, Any] | None = None,
    request_id: int | None = None,
) -> tuple[dict[str, str], dict[str, Any]]:
    """Headers and body of a stateless request, with the required ``_meta`` and routing headers."""
    body_params = dict(params or {})
    body_params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": capabilities if capabilities is not None else {},
        "io.modelcontextprotocol/clientInfo": {"name": "coatcheck-wire-tests", "version": "0"},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": PROTOCOL_VERSION,
        "Mcp-Method": method,
    }
    if method in {"tools/call", "prompts/get"}:
        headers["Mcp-Name"] = str(body_params["name"])
    body = {"jsonrpc": "2.0", "id": request_id if request_id is not None else next(_ids), "method": method}
    body["params"] = body_params
    return headers, body


def response_message(response: httpx2.Response) -> dict[str, Any]:
    """The final JSON-RPC message of a response, whether sent as JSON or as an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        messages = [
            json.loads(line.removeprefix("data:").strip())
            for line in response.text.splitlines()
            if line.startswith("data:") and line.removeprefix("data:").strip()
        ]
        final = [m for m in messages if "result" in m or "error" in m]
        assert final, f"no final message in SSE body: {response.text[:500]}"
        return dict(final[-1])
    return dict(response.json())


def _request(
    method: str,
    params: dict[str, Any] | None,
    token: str | None,
    capabilities: dict[str, Any] | None,
    extra_headers: dict[str, str] | None,
) -> tuple[dict[str, str], dict[str, Any]]:
    headers, body = modern_request(method, params, capabilities=capabilities)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    headers.update(extra_headers or {})
    return headers, body


def post(
    client: httpx2.Client,
    url: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    token: str | None = None,
    capabilities: dict[str, Any] | None = None,
    extra_headers: dict[str, str] | None = None,
) -> httpx2.Response:
    """Send one modern request over a real socket and return the raw HTTP response."""
    headers, body = _request(method, params, token, capabilities, extra_headers)
    return client.post(url, headers=headers, json=body)


async def post_async(
    client: httpx2.AsyncClient,
    url: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    token: str | None = None,
    capabilities: dict[str, Any] | None = None,
    extra_headers: dict[str, str] | None = None,
) -> httpx2.Response:
    """:func:`post` for an async client, e.g. one bound to the in-process app (``InProcessApp.http()``)."""
    headers, body = _request(method, params, token, capabilities, extra_headers)
    return await client.post(url, headers=headers, json=body)
