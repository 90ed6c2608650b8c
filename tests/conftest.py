"""Shared pytest configuration."""

from collections.abc import Iterator

import pytest

import harness
from pollwarden.store import Engine
from tests.support.fake_provider import FakeProvider, running_fake_provider

# Every store-touching test runs once per engine here. Adding PostgreSQL is adding
# its Engine member here and its URL in `harness.database_in`.
DATABASE_ENGINES: tuple[Engine, ...] = (Engine.SQLITE,)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Store-touching tests (every test on the fake provider runs a server and its store) run on every engine."""
    if "fake" in metafunc.fixturenames:
        metafunc.parametrize("database_engine", DATABASE_ENGINES, indirect=True, ids=str)


@pytest.fixture(autouse=True)
def database_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """The engine this test's harness stores its records in (SQLite for tests that touch no store)."""
    engine: Engine = getattr(request, "param", Engine.SQLITE)
    harness.use_engine(engine)
    yield engine
    harness.use_engine(Engine.SQLITE)


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only."""
    return "asyncio"


@pytest.fixture(scope="session")
def fake_provider_server() -> Iterator[FakeProvider]:
    """One fake provider on 127.0.0.1 for the whole session (tests script distinct job ids)."""
    with running_fake_provider() as fake:
        yield fake


@pytest.fixture
def fake(fake_provider_server: FakeProvider) -> FakeProvider:
    """The session's fake provider, reset for this test."""
    fake_provider_server.reset()
    return fake_provider_server
