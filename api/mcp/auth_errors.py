"""A token that cannot be checked right now is a 503, not a 401 and not a 500.

The SDK authenticates each request in Starlette's ``AuthenticationMiddleware`` with our token verifier. A
verifier that cannot reach the identity provider (introspection down, :class:`VerifierUnavailable`) must
not answer 401, which tells the client to throw its token away and sign the user in again, nor let the
exception become a 500. Starlette's hook for this is the middleware's ``on_error``, which the SDK does not
set; :func:`answer_verifier_outages` sets it on the SDK's app before its middleware stack is built.
"""

import json
from typing import Any, cast

from starlette.applications import Starlette
from starlette.authentication import AuthenticationError
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import Response

from api.introspection import VerifierUnavailable

RETRY_AFTER_SECONDS = 5


def verifier_error_response(_conn: HTTPConnection, exc: AuthenticationError) -> Response:
    """503 ``temporarily_unavailable`` (with ``Retry-After``) for an outage; Starlette's 400 for anything else."""
    if isinstance(exc, VerifierUnavailable):
        body = {"error": "temporarily_unavailable", "error_description": str(exc)}
        return Response(
            json.dumps(body),
            status_code=503,
            media_type="application/json",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Cache-Control": "no-store"},
        )
    return AuthenticationMiddleware.default_on_error(_conn, exc)


def answer_verifier_outages(app: Starlette) -> None:
    """Give the SDK app's ``AuthenticationMiddleware`` our ``on_error``.

    Raises:
        RuntimeError: the app has no such middleware (an SDK change this wiring must follow), or it already
            runs (its middleware stack is built).
    """
    if app.middleware_stack is not None:
        raise RuntimeError("the SDK's app is already running; set on_error before it serves")
    for position, entry in enumerate(app.user_middleware):
        factory: object = entry.cls  # typed as a factory protocol; here it is the class the SDK registered
        if factory is AuthenticationMiddleware:
            options = cast(dict[str, Any], dict(entry.kwargs))
            options["on_error"] = verifier_error_response
            app.user_middleware[position] = Middleware(cast(Any, factory), *entry.args, **options)
            return
    raise RuntimeError("the SDK's app has no AuthenticationMiddleware to answer verifier outages")
