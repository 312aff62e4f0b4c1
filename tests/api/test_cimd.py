"""Client ID Metadata Documents are fetched with SSRF guards and cached as HTTP caching allows: each
refusal says why. Real HTTP (a document server on loopback, allowed only by the development setting) and
real PostgreSQL for the cache."""

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from api.authserver.cimd import CimdFetcher, CimdRefused
from store import authserver as store
from store.db import Database
from tests.support.cimd_server import DocumentServer, serve_documents

pytestmark = pytest.mark.sets_own_auth_mode

GOOD: dict[str, object] = {"client_name": "Doc client", "redirect_uris": ["http://127.0.0.1:4321/callback"]}


@pytest.fixture
def documents() -> Iterator[DocumentServer]:
    with serve_documents() as served:
        yield served


@pytest.fixture
async def dev_fetcher(database: Database) -> AsyncIterator[CimdFetcher]:
    fetcher = CimdFetcher(database, timeout=1.0, allow_loopback=True)
    yield fetcher
    await fetcher.aclose()


@pytest.fixture
async def fetcher(database: Database) -> AsyncIterator[CimdFetcher]:
    fetcher = CimdFetcher(database, timeout=1.0, allow_loopback=False)
    yield fetcher
    await fetcher.aclose()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://10.1.2.3/client.json", "resolves to a private, loopback or link-local address"),
        ("https://169.254.169.254/latest/meta-data", "resolves to a private, loopback or link-local address"),
        ("https://[::1]/client.json", "resolves to a private, loopback or link-local address"),
        ("https://[::ffff:192.168.0.1]/client.json", "resolves to a private, loopback or link-local address"),
        ("https://127.0.0.1/client.json", "resolves to a private, loopback or link-local address"),
        ("https://localhost/client.json", "resolves to a private, loopback or link-local address"),
        ("http://example.com/client.json", "must be https"),
        ("https://example.com/", "must have a path"),
        ("https://user@example.com/client.json", "must not contain user information"),
    ],
)
async def test_a_metadata_url_that_is_not_public_https_is_refused_before_any_request(
    fetcher: CimdFetcher, url: str, reason: str
) -> None:
    with pytest.raises(CimdRefused, match=reason):
        await fetcher.client(url)


async def test_loopback_is_refused_without_the_development_setting_even_when_a_document_is_there(
    fetcher: CimdFetcher, documents: DocumentServer
) -> None:
    documents.documents["/client.json"] = GOOD
    with pytest.raises(CimdRefused, match="must be https"):
        await fetcher.client(documents.url("/client.json"))
    assert documents.hits == {}


async def test_a_redirect_a_huge_or_a_slow_document_is_refused_and_says_why(
    dev_fetcher: CimdFetcher, documents: DocumentServer
) -> None:
    with pytest.raises(CimdRefused, match="redirected; redirects are refused"):
        await dev_fetcher.client(documents.url("/redirect"))
    with pytest.raises(CimdRefused, match="larger than 65536 bytes"):
        await dev_fetcher.client(documents.url("/huge"))
    with pytest.raises(CimdRefused, match="did not arrive within 1 s"):
        await dev_fetcher.client(documents.url("/slow"))
    assert documents.hits["/redirect"] == 1
    assert "/client.json" not in documents.hits  # the redirect was not followed


async def test_a_document_naming_another_client_id_or_wanting_a_secret_is_refused(
    dev_fetcher: CimdFetcher, documents: DocumentServer
) -> None:
    documents.documents["/other.json"] = {**GOOD, "client_id": "https://elsewhere.example/client.json"}
    documents.documents["/secret.json"] = {**GOOD, "token_endpoint_auth_method": "client_secret_basic"}
    documents.documents["/plain-http.json"] = {**GOOD, "redirect_uris": ["http://app.example/cb"]}
    with pytest.raises(CimdRefused, match="client_id is not exactly the URL"):
        await dev_fetcher.client(documents.url("/other.json"))
    with pytest.raises(CimdRefused, match="authenticates with none"):
        await dev_fetcher.client(documents.url("/secret.json"))
    with pytest.raises(CimdRefused, match="neither https nor http on a loopback"):
        await dev_fetcher.client(documents.url("/plain-http.json"))


async def test_a_good_document_is_cached_as_its_max_age_allows_and_no_store_is_not_kept(
    dev_fetcher: CimdFetcher, documents: DocumentServer, database: Database
) -> None:
    cached, uncached = f"/c-{uuid.uuid4().hex[:6]}.json", f"/n-{uuid.uuid4().hex[:6]}.json"
    documents.documents[cached] = GOOD
    documents.documents[uncached] = GOOD
    documents.cache_control[cached] = "public, max-age=600"
    documents.cache_control[uncached] = "no-store"

    first = await dev_fetcher.client(documents.url(cached))
    await dev_fetcher.client(documents.url(cached))
    await dev_fetcher.client(documents.url(uncached))
    await dev_fetcher.client(documents.url(uncached))

    assert first.client_id == documents.url(cached)
    assert first.client_name == "Doc client"
    assert first.token_endpoint_auth_method == "none"
    assert documents.hits[cached] == 1
    assert documents.hits[uncached] == 2
    async with database.one_statement() as conn:
        row = await store.load_client(conn, documents.url(cached))
        assert await store.load_client(conn, documents.url(uncached)) is None
    assert row is not None
    assert row.kind == "cimd"


async def test_turned_off_even_a_good_cached_document_is_refused_and_nothing_is_fetched(
    dev_fetcher: CimdFetcher, documents: DocumentServer, database: Database
) -> None:
    path = f"/off-{uuid.uuid4().hex[:6]}.json"
    documents.documents[path] = GOOD
    documents.cache_control[path] = "public, max-age=600"
    await dev_fetcher.client(documents.url(path))  # cached while documents were accepted
    off = CimdFetcher(database, timeout=1.0, allow_loopback=True, enabled=False)
    try:
        with pytest.raises(CimdRefused, match=r"does not accept client metadata documents \(AS_CIMD_ENABLED=false\)"):
            await off.client(documents.url(path))
    finally:
        await off.aclose()
    assert documents.hits[path] == 1
