"""Helpers for multi round-trip (MRTR) tests: scripted elicitation answers, extra server processes, polling."""

import contextlib
from collections.abc import Iterator, Mapping

from mcp.client import ClientRequestContext
from mcp.types import ElicitRequestFormParams, ElicitRequestParams, ElicitResult

from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port


def flip_one_character(sealed: str) -> str:
    """The same token with one character in the middle changed (still URL-safe base64)."""
    middle = len(sealed) // 2
    replacement = "A" if sealed[middle] != "A" else "B"
    return sealed[:middle] + replacement + sealed[middle + 1 :]


class ScriptedUser:
    """An elicitation callback that answers every form with ``answer`` and records what it was shown."""

    def __init__(self, answer: ElicitResult) -> None:
        self.answer = answer
        self.questions: list[ElicitRequestFormParams] = []

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        assert isinstance(params, ElicitRequestFormParams), f"expected a form elicitation, got {params!r}"
        self.questions.append(params)
        return self.answer


def confirms(value: object = True) -> ElicitResult:
    """An ``accept`` answer to the checkout form with ``confirm`` set to ``value``."""
    return ElicitResult(action="accept", content={"confirm": value})  # type: ignore[dict-item]


@contextlib.contextmanager
def another_instance(env: Mapping[str, str], *, public_url: str, **overrides: str) -> Iterator[RunningServer]:
    """One more ``coatcheck serve`` on its own port, posing as ``public_url`` so tokens for it are accepted.

    The Host allow-list is derived from ``PUBLIC_URL``, so the process also admits its own address.
    """
    port = free_port()
    full_env = {**env, "ALLOWED_HOSTS": f"127.0.0.1:{port}", **overrides}
    with run_server(full_env, port=port, public_url=public_url) as running:
        yield running
