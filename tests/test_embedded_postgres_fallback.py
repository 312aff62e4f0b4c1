"""A fresh machine without PostgreSQL passes the tests: with ``TEST_DATABASE_URL`` unset and nothing listening
at the default address, the suite runs on an embedded PostgreSQL (pgserver) it starts itself.

Proved by running the README's test command on two store modules in a subprocess whose default address is a
port where nothing listens. The migration module runs the whole chain up, down and up again on pgserver,
which has no contrib extensions (``pg_trgm``…): a migration that needs one must degrade there.
"""

import os
import subprocess
import sys
from pathlib import Path

from tests.support.waiting import free_port

REPO = Path(__file__).resolve().parents[1]
MODULES = ["tests/store/test_catalog.py", "tests/store/test_migrations.py"]


def test_the_suite_falls_back_to_an_embedded_postgresql_when_nothing_answers_at_the_default_address() -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    env = {key: value for key, value in os.environ.items() if key != "TEST_DATABASE_URL"}
    env["TEST_DATABASE_DEFAULT_URL"] = nowhere
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *MODULES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "database server: an embedded PostgreSQL (pgserver) at postgresql://postgres@127.0.0.1:" in result.stdout
    assert f"nothing answered at {nowhere}" in result.stdout
    assert " passed" in result.stdout
    assert "failed" not in result.stdout
