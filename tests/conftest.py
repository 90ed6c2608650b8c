"""Shared pytest configuration."""

from collections.abc import Iterator

import pytest

from pollwarden.fake_provider import FakeProvider, running_fake_provider


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
