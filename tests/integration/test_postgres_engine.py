"""The PostgreSQL engine itself: selection by URL, passwords never shown, migrations once, one audit chain.

The tool tests run on PostgreSQL through the engine parameter (conftest); these
are about what only PostgreSQL has: a URL with a password, several instances
migrating one database at once, processes on different connections appending
to one chain.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from harness import database_in, db_rows, db_write
from pollwarden.audit import read_rows, verify_chain
from pollwarden.config import load_config
from pollwarden.errors import ConfigError, StoreError
from pollwarden.store import Engine, open_store
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.postgres import schema

pytestmark = [pytest.mark.anyio, pytest.mark.both_engines]

SECRET = "s3cr3t-Pa55"


def _postgres_only(engine: Engine) -> None:
    if engine != Engine.POSTGRES:
        pytest.skip("about the PostgreSQL engine")


@pytest.mark.parametrize(
    ("given", "engine"),
    [
        ("postgresql://app@db.internal:5432/pollwarden", Engine.POSTGRES),
        ("postgres://app@db.internal/pollwarden", Engine.POSTGRES),
        ("sqlite:////var/lib/pollwarden.db", Engine.SQLITE),
        ("~/pollwarden.db", Engine.SQLITE),
    ],
)
def test_a_postgresql_url_selects_postgresql_and_a_path_or_sqlite_url_selects_sqlite(
    given: str, engine: Engine
) -> None:
    assert DatabaseLocation.parse(given).engine == engine
    assert load_config(db=None, environ={"POLLWARDEN_DB": given}).database.engine == engine


def test_a_password_in_the_url_is_used_to_connect_but_never_shown() -> None:
    where = DatabaseLocation.parse(
        f"postgresql://app:{SECRET}@db.internal:5432/pw?password={SECRET}&sslmode=require"
    )
    assert SECRET in where.dsn
    for shown in (str(where), repr(where), where.url, where.display, f"{where}"):
        assert SECRET not in shown
    assert str(where) == "postgresql://app:***@db.internal:5432/pw?password=***&sslmode=require"


def test_a_postgresql_url_without_a_database_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"postgresql://user@host:5432/dbname"):
        DatabaseLocation.parse(f"postgresql://app:{SECRET}@db.internal:5432/")
    with pytest.raises(ConfigError) as refused:
        DatabaseLocation.parse(f"postgresql://app:{SECRET}@db.internal:5432")
    assert SECRET not in str(refused.value)


async def test_a_wrong_password_is_a_clear_error_that_does_not_repeat_it(
    tmp_path: Path, database_engine: Engine
) -> None:
    _postgres_only(database_engine)
    own = database_in(tmp_path)
    # Trust authentication lets any password in on this server: a role that may not log in fails instead.
    db_write(
        own, "DO $$BEGIN CREATE ROLE pw_locked NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END$$"
    )
    url = own.dsn.replace("postgres@", f"pw_locked:{SECRET}@")
    with pytest.raises(StoreError) as refused:
        async with open_store(url, busy_timeout_seconds=1.0):
            pass
    message = str(refused.value)
    assert SECRET not in message
    assert "pw_locked:***@" in message
    assert "cannot use PostgreSQL" in message


async def test_instances_starting_at_the_same_moment_migrate_the_schema_once(
    tmp_path: Path, database_engine: Engine
) -> None:
    _postgres_only(database_engine)
    where = database_in(tmp_path)
    counts: list[int] = []

    async def instance() -> None:
        async with open_store(where) as store:
            counts.append(await store.count_operations())

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(instance)
    assert counts == [0] * 6
    assert db_rows(where, "SELECT version FROM pollwarden_schema") == [{"version": schema.LATEST}]
    assert db_rows(where, "SELECT seq, hash FROM audit_head")[0]["seq"] == 0


async def test_a_database_a_newer_release_migrated_is_refused_with_the_fix(
    tmp_path: Path, database_engine: Engine
) -> None:
    _postgres_only(database_engine)
    where = database_in(tmp_path)
    async with open_store(where):
        pass
    db_write(where, "UPDATE pollwarden_schema SET version = ?", schema.LATEST + 1)
    with pytest.raises(StoreError, match=r"newer than this pollwarden knows.*upgrade pollwarden"):
        async with open_store(where):
            pass


APPENDER = textwrap.dedent(
    """
    import os, sys, time, anyio
    from pollwarden.store import open_store

    async def main(url: str, worker: str, go: str) -> None:
        async with open_store(url) as store:
            values = dict(
                operation_id="op-" + worker, provider="acme", provider_job_id=None, account_context="a",
                request_fingerprint="f", idempotency_key=None, expected_terminal_state="succeeded",
                status="waiting", started_at=0.0, deadline_at=1e9, business_deadline_at=None,
                max_status_requests=5, max_transport_failures=3, max_rate_limited=3, next_check_at=0.0,
                delay_source="local_backoff", submit_payload_json=None, created_at=0.0, updated_at=0.0,
            )
            await store.create_operation(values, kind="tracking_started", at=1.0)
            deadline = time.monotonic() + 20
            while not os.path.exists(go):
                if time.monotonic() > deadline:
                    raise SystemExit("start signal never came")
                await anyio.sleep(0.002)
            for i in range(25):
                await store.audit_event("op-" + worker, kind="polled", at=2.0 + i, note=None, extra={"i": i})
                await anyio.sleep(0.003)  # let the other workers in between our rows

    anyio.run(main, *sys.argv[1:4])
    """
)


def test_four_processes_appending_on_their_own_connections_leave_one_contiguous_chain(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    url = where.dsn if not where.is_sqlite else str(where.path)
    go = tmp_path / "go"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, url, str(n), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ),
        )
        for n in range(4)
    ]
    subprocess.run([sys.executable, "-c", "import time; time.sleep(1.0)"], check=True)  # every worker ready
    go.touch()
    for proc in workers:
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err.decode()

    result = verify_chain(where, None)
    assert result.ok, result.problem
    assert result.rows_checked == 4 * 26
    rows = read_rows(where)
    assert [row.seq for row in rows] == list(range(1, 105))
    for n in range(4):
        mine = [row for row in read_rows(where, f"op-{n}") if row.kind == "polled"]
        assert [row.payload_obj["i"] for row in mine] == list(range(25))
    owners = [row.operation_id for row in rows]
    assert sum(1 for a, b in itertools.pairwise(owners) if a != b) > 3  # they interleaved


async def test_a_deleted_operation_story_breaks_the_one_chain(
    tmp_path: Path, database_engine: Engine
) -> None:
    _postgres_only(database_engine)
    where = database_in(tmp_path)
    async with open_store(where) as store:
        for n in range(3):
            values = dict(
                operation_id=f"op-{n}", provider="acme", provider_job_id=None, account_context="a",
                request_fingerprint="f", idempotency_key=None, expected_terminal_state="succeeded",
                status="waiting", started_at=0.0, deadline_at=1e9, business_deadline_at=None,
                max_status_requests=5, max_transport_failures=3, max_rate_limited=3, next_check_at=0.0,
                delay_source="local_backoff", submit_payload_json=None, created_at=0.0, updated_at=0.0,
            )  # fmt: skip
            await store.create_operation(values, kind="tracking_started", at=1.0 + n)
    assert verify_chain(where, None).ok
    db_write(where, "DELETE FROM audit WHERE operation_id = ?", "op-1")
    broken = verify_chain(where, None)
    assert not broken.ok
    assert broken.first_broken_seq == 2
