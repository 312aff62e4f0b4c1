"""Serve the conformance profile: the production app plus the conformance fixtures.

Test-only entry point: ``python -m tests.support.conformance.serve_profile --port N``. It builds the app with
the same factory, settings, auth, transport security and request-state sealing as ``coatcheck serve``
and serves it with the same uvicorn configuration; the only difference is ``configure_mcp``,
which registers the fixture tools, prompts and resources the conformance suite calls by name.
"""

import argparse

from api.app import create_app
from api.serving import configure_logging, run_http_server
from api.settings import Settings
from tests.support.conformance.fixtures import register_conformance_fixtures


def main() -> None:
    parser = argparse.ArgumentParser(description="Coatcheck conformance profile (test-only)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    settings = Settings.from_env()
    configure_logging(settings)
    app = create_app(settings, configure_mcp=register_conformance_fixtures)
    run_http_server(app, settings, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
