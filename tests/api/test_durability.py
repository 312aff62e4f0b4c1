"""DB_REQUIRE_SYNC_STANDBY: /readyz is 503 until the primary has a synchronous standby, and again once it lost it.

A real primary and a real streaming standby of it (``pg_basebackup``): asynchronous at first, then made
synchronous the way an operator (or Patroni's ``synchronous_mode``) does it, by naming the standby in
``synchronous_standby_names``; then the standby stops.
"""

import httpx2

from tests.support.inprocess import settings_from, started_app
from tests.support.pg_nodes import fetchval, primary_and_standby
from tests.support.waiting import eventually

CHECK_EVERY = 0.2


async def _answer(http: httpx2.AsyncClient) -> tuple[int, dict[str, str]]:
    response = await http.get("/readyz")
    return response.status_code, response.json()


def _gauge(metrics: str) -> str:
    return next(line for line in metrics.splitlines() if line.startswith("coatcheck_db_sync_standbys "))


async def test_readyz_waits_for_a_synchronous_standby_and_goes_503_when_it_is_gone(server_env: dict[str, str]) -> None:
    with primary_and_standby() as (primary, standby):
        await eventually(lambda: _streaming(primary.url), within=30, what="the standby to stream from the primary")
        env = {
            **server_env,
            "DATABASE_URL": primary.url,
            "DB_REQUIRE_SYNC_STANDBY": "true",
            "DB_SYNC_STANDBY_CHECK_SECONDS": str(CHECK_EVERY),
            "METRICS_ENABLED": "true",
        }
        plain = {**env, "DB_REQUIRE_SYNC_STANDBY": "false"}
        async with started_app(settings_from(plain)) as app, app.http(timeout=10) as http:
            without_the_setting = await _answer(http)
        async with started_app(settings_from(env)) as app, app.http(timeout=10) as http:

            async def status_is(expected: str) -> bool:
                return (await _answer(http))[1].get("durability") == expected

            # Before the first check has answered, durability is "unknown" (also 503).
            await eventually(lambda: status_is("no synchronous standby"), within=10, what="the first check")
            asynchronous = await _answer(http)
            asynchronous_gauge = _gauge((await http.get("/metrics")).text)

            await fetchval(primary.url, "ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            await fetchval(primary.url, "SELECT pg_reload_conf()")
            await eventually(
                lambda: status_is("synchronous standby"), within=15, what="readiness once the standby is synchronous"
            )
            synchronous = await _answer(http)
            synchronous_gauge = _gauge((await http.get("/metrics")).text)

            standby.stop("immediate")
            await eventually(lambda: status_is("no synchronous standby"), within=15, what="the lost standby to show")
            lost_gauge = _gauge((await http.get("/metrics")).text)

    assert without_the_setting == (200, {"status": "ready", "catalog_search": without_the_setting[1]["catalog_search"]})
    assert asynchronous == (503, {"status": "no synchronous standby", "durability": "no synchronous standby"})
    assert asynchronous_gauge == "coatcheck_db_sync_standbys 0.0"
    assert synchronous[0] == 200
    assert synchronous[1]["durability"] == "synchronous standby"
    assert synchronous_gauge == "coatcheck_db_sync_standbys 1.0"
    assert lost_gauge == "coatcheck_db_sync_standbys 0.0"


async def _streaming(url: str) -> bool:
    return bool(await fetchval(url, "SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming'"))
