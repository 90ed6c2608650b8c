"""Shared pytest configuration.

Which engines a test runs on (`pytest_generate_tests`):

- A test of the store's behaviour runs on SQLite and on PostgreSQL: every test on the `fake`
  provider (it runs a server and its store) and every test marked `both_engines`. Races, budgets
  and reservations, leases, approvals' guarded writes, the audit chain, faults, crashes and
  restarts, pacing and fair shares, one job one budget, migrations, and everything RELIABILITY.md
  claims stay here, as does the engine conformance suite
  (tests/integration/test_engine_conformance.py: each executor carries out each kind of write a
  plan makes, under a race and a fault).
- A module whose subject is not the store — the MCP surface, wording, views, the CLI's
  conventions, the docs, the console's rendering, the app card, the tasks protocol, bad-input
  messages, reading provider tables — is marked `one_engine` (module-level `pytestmark`) and runs
  on SQLite only: its store writes are the same plans the both-engine tests and the conformance
  suite already carry out on PostgreSQL. In such a module a test marked `both_engines` still runs on
  both (the closer of the two markers wins), so a module that mixes the two kinds marks its store
  tests one by one.
- `sqlite_only` (about the SQLite file itself) runs on SQLite only; `postgres_only` (PostgreSQL's
  own faults) on PostgreSQL only.

A new test of the store needs nothing: on the fake provider it runs on both engines by default.
"""

import os
from collections.abc import Generator, Iterator, Sequence
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


# A test of the store runs once per engine (PostgreSQL: a schema of its own, see pg_support).
DATABASE_ENGINES: tuple[Engine, ...] = (Engine.SQLITE, Engine.POSTGRES)


ENGINE_MARKERS = ("one_engine", "both_engines")


def engines_for(definition: pytest.Function, fixturenames: Sequence[str]) -> tuple[Engine, ...] | None:
    """The engines a test runs on (the module docstring's rule); None: not parametrized (SQLite)."""
    if definition.get_closest_marker("postgres_only"):
        return (Engine.POSTGRES,)
    if definition.get_closest_marker("sqlite_only"):
        return (Engine.SQLITE,)
    closest = next((m.name for m in definition.iter_markers() if m.name in ENGINE_MARKERS), None)
    if closest == "one_engine":
        return (Engine.SQLITE,)
    if closest == "both_engines" or "fake" in fixturenames:
        return DATABASE_ENGINES
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests of the store run on every engine; tests marked `one_engine` on SQLite only (see above)."""
    engines = engines_for(metafunc.definition, metafunc.fixturenames)
    if engines is not None:
        metafunc.parametrize("database_engine", engines, indirect=True, ids=str)


@pytest.fixture(autouse=True)
def database_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """The engine this test's harness stores its records in (SQLite for tests that touch no store)."""
    engine: Engine = getattr(request, "param", Engine.SQLITE)
    if engine == Engine.POSTGRES:
        request.getfixturevalue("postgres_server")
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
