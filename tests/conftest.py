"""Shared pytest configuration."""

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

import harness
import pg_support
from pollwarden.store import Engine
from tests.support import parallel
from tests.support.fake_provider import FakeProvider, running_fake_provider

# Hypothesis's default deadline (200 ms of wall-clock time per example) measures how busy the
# machine is, not the code: with pytest-xdist every worker shares two cores with the others and
# their server processes. No test relies on it (the slow ones already set deadline=None).
settings.register_profile("pollwarden", deadline=None)
settings.load_profile("pollwarden")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """How many workers `-n auto` (pyproject's addopts) starts: none for tests/unit alone (parallel.py)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    return parallel.workers_for(config.args, pure=Path(__file__).parent / "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `alone` first: then they wait only for the other workers' first, short tests."""
    items.sort(key=lambda item: item.get_closest_marker(parallel.ALONE) is None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """On an xdist worker, every test holds the run's test lock: a test marked `alone` exclusively."""
    basetemp = item.config.option.basetemp  # set by pytest-xdist: <the run's basetemp>/popen-gwN
    if parallel.xdist_worker() is None or not basetemp:
        return (yield)
    alone = item.get_closest_marker(parallel.ALONE) is not None
    with parallel.sharing_the_machine(Path(basetemp).parent, alone=alone):
        return (yield)


# Every store-touching test runs once per engine (PostgreSQL: a schema of its own, see pg_support).
DATABASE_ENGINES: tuple[Engine, ...] = (Engine.SQLITE, Engine.POSTGRES)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Store-touching tests (every test on the fake provider runs a server and its store) run on every engine."""
    if metafunc.definition.get_closest_marker("postgres_only"):
        metafunc.parametrize("database_engine", (Engine.POSTGRES,), indirect=True, ids=str)
    elif "fake" in metafunc.fixturenames or metafunc.definition.get_closest_marker("both_engines"):
        metafunc.parametrize("database_engine", DATABASE_ENGINES, indirect=True, ids=str)


@pytest.fixture(autouse=True)
def database_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """The engine this test's harness stores its records in (SQLite for tests that touch no store)."""
    engine: Engine = getattr(request, "param", Engine.SQLITE)
    if engine == Engine.POSTGRES:
        request.getfixturevalue("postgres_server")
        if request.node.get_closest_marker("sqlite_only") is not None:
            pytest.skip("SQLite only: this test is about the SQLite file itself")
    harness.use_engine(engine)
    try:
        yield engine
    finally:
        harness.use_engine(Engine.SQLITE)
        if engine == Engine.POSTGRES:
            pg_support.drop_schemas()


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The test PostgreSQL server's URL; skips (fails under CI=1) when it cannot be reached.

    Under pytest-xdist, the URL of this worker's own database there (pg_support).
    """
    reason = pg_support.unreachable()
    if reason is not None:
        if pg_support.in_ci():
            pytest.fail(f"{reason} (CI=1: PostgreSQL tests must run)")
        pytest.skip(reason)
    return pg_support.server_url()


@pytest.fixture
def own_postgres_cluster() -> Iterator[pg_support.Cluster]:
    """A PostgreSQL server of this test's own, for a test that stops it (never the shared one).

    A throwaway cluster (initdb into a temporary directory, a free port, its own socket
    directory), removed after the test. Skips (fails under CI=1) when there is no initdb.
    """
    try:
        cluster = pg_support.create_cluster()
    except pg_support.ClusterUnavailable as reason:
        if pg_support.in_ci():
            pytest.fail(f"{reason} (CI=1: PostgreSQL tests must run)")
        pytest.skip(str(reason))
    try:
        yield cluster
    finally:
        cluster.remove()


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
