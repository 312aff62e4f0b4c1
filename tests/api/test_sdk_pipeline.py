"""The /mcp handler is the SDK's own middleware around its route handler, without Starlette's app layers.

(api/mcp/sdk_pipeline.py.) What the SDK answers over HTTP (401 challenges, 503 for a verifier outage, the
transport's checks) is covered by the HTTP tests; here, that the composition keeps every piece the SDK
configured, in its order and with its arguments, and refuses an app it does not understand.
"""

from typing import Any

import pytest
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.applications import Starlette
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from api.mcp.auth_errors import answer_verifier_outages, verifier_error_response
from api.mcp.sdk_pipeline import sdk_pipeline
from tests.support.inprocess import production_mcp_server


def test_the_pipeline_is_the_sdks_auth_middleware_in_order_around_its_authenticated_route_handler() -> None:
    app = production_mcp_server().streamable_http_app(streamable_http_path="/", stateless_http=True)
    answer_verifier_outages(app)

    outer: Any = sdk_pipeline(app)

    assert isinstance(outer, AuthenticationMiddleware)
    assert isinstance(outer.backend, BearerAuthBackend)
    assert outer.on_error is verifier_error_response  # the 503 for an IdP outage survives the composition
    context = outer.app
    assert isinstance(context, AuthContextMiddleware)
    required = context.app
    assert isinstance(required, RequireAuthMiddleware)
    assert required is app.routes[0].app  # type: ignore[attr-defined]  # the SDK's own handler object
    assert isinstance(required.app, StreamableHTTPASGIApp)


def test_an_app_without_an_all_methods_route_at_the_root_is_refused() -> None:
    def page(_request: object) -> PlainTextResponse:
        return PlainTextResponse("hi")

    with pytest.raises(RuntimeError, match="no single all-methods route"):
        sdk_pipeline(Starlette(routes=[Route("/other", page)]))
    with pytest.raises(RuntimeError, match="no single all-methods route"):
        sdk_pipeline(Starlette(routes=[Route("/", page)]))  # a GET page, not the transport


def test_a_transport_wrapper_sits_inside_the_sdks_auth_check_with_its_scopes_and_metadata_url() -> None:
    app = production_mcp_server().streamable_http_app(streamable_http_path="/", stateless_http=True)
    sdk_required: Any = app.routes[0].app  # type: ignore[attr-defined]
    wrapped: list[object] = []

    def transport(inner: Any) -> Any:
        wrapped.append(inner)
        return PlainTextResponse("wrapped")

    outer: Any = sdk_pipeline(app, transport=transport)

    required = outer.app.app
    assert isinstance(required, RequireAuthMiddleware)
    assert wrapped == [sdk_required.app]  # the SDK's transport handler, given to the wrapper once
    assert isinstance(required.app, PlainTextResponse)  # what the wrapper returned, behind the auth check
    assert required.required_scopes == sdk_required.required_scopes
    assert required.resource_metadata_url == sdk_required.resource_metadata_url


def test_a_transport_wrapper_is_refused_for_a_route_that_is_not_the_sdks_auth_check() -> None:
    with pytest.raises(RuntimeError, match="not its auth check"):
        sdk_pipeline(Starlette(routes=[Route("/", PlainTextResponse("hi"))]), transport=lambda inner: inner)
