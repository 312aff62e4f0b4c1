"""A deployment on real processes: 3 ``coatcheck serve`` replicas behind HAProxy, PgBouncer in front of PostgreSQL.

See ``tests.support.replicas.start_deployment``.
"""

from collections.abc import Iterator

import pytest

from tests.support.replicas import Deployment, start_deployment


@pytest.fixture(scope="module")
def deployment(admin_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """compose.scale.yaml's deployment, started once for the module."""
    with start_deployment(admin_database_url, tmp_path_factory.mktemp("replicas")) as running:
        yield running
