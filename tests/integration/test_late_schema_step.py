"""A schema step that shipped after a higher one (step 8, operation owners, after steps 9 and 12) still runs.

A database the previous release migrated to its latest step never ran step 8;
its version number alone cannot say so. On either engine the next start runs
step 8, keeps every record (they belong to the local user), records which
steps ran, and runs nothing twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import database_in, db_rows, db_write
from pollwarden.store import DatabaseLocation, open_store
from pollwarden.store.migrations import postgres as pg_schema
from pollwarden.store.migrations import sqlite as sqlite_schema

pytestmark = [pytest.mark.anyio, pytest.mark.both_engines]

OLD_ROW = (
    "INSERT INTO operations (operation_id, provider, provider_job_id, account_context, request_fingerprint, "
    "expected_terminal_state, status, started_at, deadline_at, max_status_requests, max_transport_failures, "
    "max_rate_limited, next_check_at, delay_source, created_at, updated_at) VALUES ('op-old', 'acme', 'old', "
    "'x', 'f', 'succeeded', 'waiting', 1744971600, 1744975200, 12, 3, 3, 1744971605, 'local_backoff', "
    "1744971600, 1744971600)"
)


def _as_the_previous_release_left_it(where: DatabaseLocation) -> None:
    """Every step but 8 (no record of steps), at the latest version, one waiting operation."""
    if where.is_sqlite:
        for step in sqlite_schema.MIGRATIONS:
            if step.number != 8:
                for statement in sqlite_schema.split_sql(step.script):
                    db_write(where, statement)
        db_write(where, f"PRAGMA user_version = {sqlite_schema.LATEST}")
    else:
        for step in pg_schema.MIGRATIONS:
            if step.number != 8:
                for statement in step.statements:
                    if statement.strip():
                        db_write(where, statement)
        db_write(where, pg_schema.VERSION_TABLE)
        db_write(where, "INSERT INTO pollwarden_schema (version) VALUES (?)", pg_schema.LATEST)
    db_write(where, OLD_ROW)


def _steps_recorded(where: DatabaseLocation) -> list[int]:
    table = "schema_steps" if where.is_sqlite else "pollwarden_schema_steps"
    return [int(r["number"]) for r in db_rows(where, f"SELECT number FROM {table} ORDER BY number")]


async def test_a_database_at_the_latest_step_without_step_8_gets_it_on_its_next_start_and_keeps_its_records(
    tmp_path: Path,
) -> None:
    where = database_in(tmp_path)
    _as_the_previous_release_left_it(where)
    async with open_store(where) as store:
        old = await store.get("op-old")
        assert old is not None
        assert old.owner == "local"
        assert [r.operation_id for r in await store.list_operations(owner="local")] == ["op-old"]
        assert await store.list_operations(owner="alice") == []
    steps = sqlite_schema.MIGRATIONS if where.is_sqlite else pg_schema.MIGRATIONS
    expected = sorted(s.number for s in steps)
    assert 8 in expected
    assert _steps_recorded(where) == expected
    async with open_store(where) as store:  # a second start runs nothing again
        assert (await store.get("op-old")) is not None
    assert _steps_recorded(where) == expected


async def test_a_new_database_records_every_step_in_number_order(tmp_path: Path) -> None:
    where = database_in(tmp_path)
    async with open_store(where) as store:
        assert await store.count_operations() == 0
    numbers = sqlite_schema.MIGRATIONS if where.is_sqlite else pg_schema.MIGRATIONS
    assert _steps_recorded(where) == sorted(s.number for s in numbers)
    if where.is_sqlite:
        assert db_rows(where, "PRAGMA user_version") == [{"user_version": sqlite_schema.LATEST}]
    else:
        assert db_rows(where, "SELECT version FROM pollwarden_schema") == [{"version": pg_schema.LATEST}]
