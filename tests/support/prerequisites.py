"""What a test needs from the machine beyond the project's own install, and what its absence does.

On a developer's machine a missing prerequisite (not root for the compose emulation, no ``pg_trgm``, npm
unreachable) skips the test and says why. CI sets ``COATCHECK_TESTS_REQUIRE_ALL=1`` (``.ci/run``): there the
same absence fails the test, so a green run cannot hide a missing install step.
"""

import os
from typing import NoReturn

import pytest

REQUIRE_ALL = "COATCHECK_TESTS_REQUIRE_ALL"


def missing(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it where every test must run."""
    if os.environ.get(REQUIRE_ALL) == "1":
        pytest.fail(f"{reason} (this run sets {REQUIRE_ALL}=1, so nothing may be skipped)", pytrace=False)
    pytest.skip(reason)
