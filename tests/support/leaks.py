"""Checking that no secret reached a text (a log, a page, a command's output) without printing the secret.

pytest's assertion rewriting would show both operands of ``secret not in log``: the secret and the log in
CI's output. :func:`assert_no_secrets` names what leaked instead.
"""

from collections.abc import Iterable

FRAGMENT = 24  # not even the tail of a signature or key may appear


def assert_no_secrets(text: str, secrets: Iterable[str]) -> None:
    """Fail, naming only the secrets' positions in ``secrets``, if any of them (or its last 24 characters)
    occurs in ``text``."""
    leaked = [
        f"secret #{index} ({'whole' if secret in text else f'last {FRAGMENT} characters'})"
        for index, secret in enumerate(secrets)
        if secret and (secret in text or (len(secret) > FRAGMENT and secret[-FRAGMENT:] in text))
    ]
    assert leaked == [], f"secrets reached the text: {leaked}"
