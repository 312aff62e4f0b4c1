"""A browser MCP client on another origin: a web page served from a different port calls ``/mcp`` with
``fetch`` in headless Chromium. The origin in ``CORS_ALLOWED_ORIGINS`` gets through its preflight, reads the
tool list and the ``WWW-Authenticate`` challenge of a 401; a page on any other origin is refused."""

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
import pytest
from playwright.async_api import Browser

from tests.support.auth_mode import McpTokens
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port

# The page's client: the requests a browser MCP client sends, with the headers that make them preflighted.
PAGE = b"""<!doctype html>
<html><head><title>a browser MCP client</title><script>
async function mcp(url, token, method) {
  const headers = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": method,
  };
  if (token) headers["Authorization"] = "Bearer " + token;
  const body = {jsonrpc: "2.0", id: 1, method, params: {_meta: {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {name: "browser-page", version: "0"}}}};
  try {
    const response = await fetch(url, {method: "POST", headers, body: JSON.stringify(body)});
    return {status: response.status, challenge: response.headers.get("WWW-Authenticate"),
            contentType: response.headers.get("Content-Type"), text: await response.text()};
  } catch (error) {
    return {error: String(error)};
  }
}
async function metadata(url) {
  try {
    const response = await fetch(url, {headers: {"MCP-Protocol-Version": "2026-07-28"}});
    return {status: response.status, body: await response.json()};
  } catch (error) {
    return {error: String(error)};
  }
}
</script></head><body>client page</body></html>"""


@dataclass(frozen=True)
class PageOrigin:
    """A tiny HTTP server serving the client page; its origin is ``http://127.0.0.1:<port>``."""

    origin: str

    @property
    def page_url(self) -> str:
        return f"{self.origin}/client.html"


class _PageHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page_origins() -> Iterator[tuple[PageOrigin, PageOrigin]]:
    """Two page servers on two ports: the allowed origin and a foreign one."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler) for _ in range(2)]
    threads = [threading.Thread(target=server.serve_forever, daemon=True) for server in servers]
    for thread in threads:
        thread.start()
    try:
        allowed, foreign = (PageOrigin(f"http://127.0.0.1:{server.server_address[1]}") for server in servers)
        yield allowed, foreign
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def cors_server(server_env: dict[str, str], page_origins: tuple[PageOrigin, PageOrigin]) -> Iterator[RunningServer]:
    """``coatcheck serve`` with the first page's origin in ``CORS_ALLOWED_ORIGINS``."""
    allowed, _ = page_origins
    port = free_port()
    env = {**server_env, "CORS_ALLOWED_ORIGINS": allowed.origin}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        yield running


async def _token(mcp_token: McpTokens, server: RunningServer) -> str:
    # The session's dev IdP lists another resource; `audience` names this server's.
    return await mcp_token(f"cors-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)


async def _on_page(chromium: Browser, page_url: str, script: str, argument: object) -> dict[str, Any]:
    context = await chromium.new_context()
    try:
        page = await context.new_page()
        await page.goto(page_url)
        result: dict[str, Any] = await page.evaluate(script, argument)
        return result
    finally:
        await context.close()


async def test_a_page_on_an_allowed_origin_lists_tools_with_a_token(
    chromium: Browser, cors_server: RunningServer, mcp_token: McpTokens, page_origins: tuple[PageOrigin, PageOrigin]
) -> None:
    allowed, _ = page_origins
    token = await _token(mcp_token, cors_server)
    result = await _on_page(
        chromium, allowed.page_url, "([url, token]) => mcp(url, token, 'tools/list')", [cors_server.mcp_url, token]
    )
    assert "error" not in result, result
    assert result["status"] == 200, result
    assert '"cart_create"' in result["text"]
    assert '"catalog_search"' in result["text"]


async def test_a_page_on_an_allowed_origin_reads_the_401_challenge_and_the_resource_metadata(
    chromium: Browser, cors_server: RunningServer, page_origins: tuple[PageOrigin, PageOrigin]
) -> None:
    allowed, _ = page_origins
    unauthenticated = await _on_page(
        chromium, allowed.page_url, "([url]) => mcp(url, null, 'tools/list')", [cors_server.mcp_url]
    )
    assert unauthenticated.get("status") == 401, unauthenticated
    metadata_url = f"{cors_server.base_url}/.well-known/oauth-protected-resource/mcp"
    assert unauthenticated["challenge"] is not None, "WWW-Authenticate is not exposed to the page"
    assert f'resource_metadata="{metadata_url}"' in unauthenticated["challenge"]
    document = await _on_page(chromium, allowed.page_url, "(url) => metadata(url)", metadata_url)
    assert document.get("status") == 200, document
    assert document["body"]["resource"] == cors_server.mcp_url


async def test_a_page_on_a_foreign_origin_is_refused_but_may_read_the_public_metadata(
    chromium: Browser, cors_server: RunningServer, mcp_token: McpTokens, page_origins: tuple[PageOrigin, PageOrigin]
) -> None:
    _, foreign = page_origins
    token = await _token(mcp_token, cors_server)
    refused = await _on_page(
        chromium, foreign.page_url, "([url, token]) => mcp(url, token, 'tools/list')", [cors_server.mcp_url, token]
    )
    assert "status" not in refused, f"the foreign page read an answer: {refused}"
    assert "Failed to fetch" in refused["error"]
    metadata_url = f"{cors_server.base_url}/.well-known/oauth-protected-resource/mcp"
    document = await _on_page(chromium, foreign.page_url, "(url) => metadata(url)", metadata_url)
    assert document.get("status") == 200, document


async def test_the_foreign_origin_gets_403_on_the_wire_and_the_allowed_preflight_names_every_mcp_header(
    cors_server: RunningServer, mcp_token: McpTokens, page_origins: tuple[PageOrigin, PageOrigin]
) -> None:
    allowed, foreign = page_origins
    token = await _token(mcp_token, cors_server)
    requested = "authorization, content-type, mcp-protocol-version, mcp-method, mcp-name, mcp-param-region, x-other"
    async with httpx2.AsyncClient(timeout=30) as http:
        preflight = await http.options(
            cors_server.mcp_url,
            headers={
                "Origin": allowed.origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": requested,
            },
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == allowed.origin
        assert "POST" in preflight.headers["access-control-allow-methods"]
        allowed_headers = {h.strip() for h in preflight.headers["access-control-allow-headers"].split(",")}
        assert allowed_headers == set(requested.split(", ")) - {"x-other"}

        foreign_preflight = await http.options(
            cors_server.mcp_url, headers={"Origin": foreign.origin, "Access-Control-Request-Method": "POST"}
        )
        assert foreign_preflight.status_code == 403
        assert "access-control-allow-origin" not in foreign_preflight.headers

        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/list",
        }
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/list",
            "params": {
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            },
        }
        foreign_post = await http.post(cors_server.mcp_url, headers={**headers, "Origin": foreign.origin}, json=body)
        assert foreign_post.status_code == 403
        assert "access-control-allow-origin" not in foreign_post.headers
        allowed_post = await http.post(cors_server.mcp_url, headers={**headers, "Origin": allowed.origin}, json=body)
        assert allowed_post.status_code == 200
        assert allowed_post.headers["access-control-allow-origin"] == allowed.origin
        assert "WWW-Authenticate" in allowed_post.headers["access-control-expose-headers"]
