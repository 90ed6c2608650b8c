"""The SQLite engine: its schema says the vocabulary, old files keep working, and each operation is one trip.

These are about the SQLite engine itself (its file format, its SQL, its
durability settings); the behaviour every engine owes is tested through the
tools in the other files.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from harness import check, make_harness, track
from pollwarden.core.errors import StoreError
from pollwarden.core.vocabulary import Category, DelaySource, Outcome, Status, StopReason
from pollwarden.rules.gate import Verdict
from pollwarden.store import open_store, statements
from pollwarden.store.migrations.sqlite import LATEST, MIGRATIONS, split_sql
from pollwarden.store.sqlite.connection import Session
from pollwarden.store.sqlite.engine import SQLiteStore
from pollwarden.surface.server import controller_factory
from tests.integration.test_engine_conformance import NO_FLEET, NOW, values
from tests.support.fake_provider import FakeProvider, pending

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]  # PostgreSQL: test_postgres_engine.py


async def _fresh(db: Path) -> None:
    async with open_store(db):
        pass


def _allowed_in_check(db: Path, column: str) -> set[str]:
    with sqlite3.connect(db) as conn:
        (ddl,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'operations'").fetchone()
    match = re.search(rf"\b{column} TEXT[^,]*?CHECK \({column} IN\s*\(([^)]*)\)\)", ddl)
    assert match is not None, f"no CHECK on {column}"
    return set(re.findall(r"'([^']*)'", match.group(1)))


@pytest.mark.parametrize(
    ("column", "words"),
    [
        ("status", Status),
        ("stop_reason", StopReason),
        ("category", Category),
        ("delay_source", DelaySource),
        ("refused_outcome", Outcome),
    ],
)
async def test_the_schema_allows_exactly_the_words_of_the_vocabulary(
    tmp_path: Path, column: str, words: type[StrEnum]
) -> None:
    db = tmp_path / "pw.db"
    await _fresh(db)
    allowed = _allowed_in_check(db, column)
    expected = {w.value for w in words}
    if column == "refused_outcome":
        expected -= {Outcome.POLLED.value}  # a polled call is never a refusal
    if column == "delay_source":
        # A webhook's wake-up is the woken_at column: shown as a delay source, never stored as one.
        expected -= {DelaySource.PROVIDER_WEBHOOK.value}
    assert allowed == expected


async def test_a_word_outside_the_vocabulary_is_refused_by_the_database(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("typo", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "typo")
    with sqlite3.connect(h.db_path) as conn, pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        conn.execute("UPDATE operations SET stop_reason = 'gave_up' WHERE operation_id = 'op-typo'")


def _database_at(db: Path, version: int) -> None:
    """A file as the pollwarden that shipped schema `version` left it, with one waiting operation."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        for step in MIGRATIONS[:version]:
            for statement in split_sql(step.script):
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
        conn.execute(
            "INSERT INTO operations (operation_id, provider, provider_job_id, account_context, request_fingerprint, "
            "expected_terminal_state, status, started_at, deadline_at, max_status_requests, max_transport_failures, "
            "max_rate_limited, status_requests_used, next_check_at, delay_source, not_yet_count, not_yet_first_at, "
            "not_yet_last_at, created_at, updated_at) VALUES ('op-old', 'acme', 'old', 'x', 'f', 'succeeded', "
            "'waiting', 1744971600, 1744975200, 12, 3, 3, 2, 1744971605, 'local_backoff', 7, 1744971601, 1744971603, "
            "1744971600, 1744971600)"
        )
    finally:
        conn.close()


@pytest.mark.parametrize("version", [1, 2, 3])
async def test_a_database_an_earlier_release_wrote_is_upgraded_and_keeps_its_records(
    tmp_path: Path, version: int
) -> None:
    db = tmp_path / "pw.db"
    _database_at(db, version)
    async with open_store(db) as store:
        record = await store.get("op-old")
        assert record is not None
        assert (record.status, record.status_requests_used, record.delay_source) == (
            Status.WAITING,
            2,
            DelaySource.LOCAL_BACKOFF,
        )
        # The refused calls it had counted are still owed to the story, as early check_procedure.
        assert await store.flush_refusals("op-old") == 1
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST
        (payload,) = conn.execute("SELECT payload FROM audit WHERE kind = 'not_yet_summary'").fetchone()
        assert '"count":7' in payload
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


async def test_a_database_a_newer_release_wrote_is_refused_with_the_fix(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await _fresh(db)
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    with pytest.raises(StoreError, match="newer than this pollwarden knows"):
        await _fresh(db)


@pytest.mark.parametrize(
    "sql",
    [
        statements.list_operations(),
        statements.list_operations("status"),
        statements.list_operations("provider"),
        statements.PENDING_REFUSALS,
        statements.LIST_APPROVALS_BY_STATUS,
    ],
)
async def test_listing_and_scanning_use_an_index_not_a_sort_of_every_operation(
    tmp_path: Path, sql: str
) -> None:
    db = tmp_path / "pw.db"
    await _fresh(db)
    with sqlite3.connect(db) as conn:
        plan = " | ".join(
            str(row[3])
            for row in conn.execute(
                f"EXPLAIN QUERY PLAN {sql}", {"status": "waiting", "provider": "a", "limit": 5}
            )
        )
    assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


async def test_a_refusal_is_one_trip_without_fsync_and_a_poll_is_two_durable_trips(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("trips", [pending("running")])
    h = make_harness(tmp_path, fake)
    h.server()  # writes the provider table the factory loads
    async with controller_factory(h.config(), clock=h.clock, rng=h.rng)() as controller:
        store = controller.store
        assert isinstance(store, SQLiteStore)
        await controller.start_operation(provider="acme", operation_id="op-trips", provider_job_id="trips")

        before = store.stats.trips, store.stats.durable_commits, store.stats.relaxed_commits
        assert (await controller.check_status("op-trips")).outcome == "not_yet"
        after = store.stats.trips, store.stats.durable_commits, store.stats.relaxed_commits
        assert tuple(b - a for a, b in zip(before, after, strict=True)) == (1, 0, 1)

        h.clock.advance(10)
        assert (await controller.check_status("op-trips")).outcome == "polled"
        polled = store.stats.trips, store.stats.durable_commits, store.stats.relaxed_commits
        # The reservation and the answer, each with what it writes to the audit, committed durably.
        assert tuple(b - a for a, b in zip(after, polled, strict=True)) == (2, 2, 0)
    assert len(fake.status_requests("trips")) == 1


async def test_a_refusal_while_another_calls_request_is_in_flight_is_one_relaxed_trip_on_a_moving_clock(
    tmp_path: Path,
) -> None:
    # The busy lease's not_yet says when to come back from the time read under the write lock, which a
    # real clock has moved since the snapshot: still the same verdict, carried out at once (no rollback
    # and no second, durable transaction).
    async with open_store(tmp_path / "p.db") as sender, open_store(tmp_path / "p.db") as store:
        assert isinstance(store, SQLiteStore)
        await sender.create_operation(values("op"), kind="started", at=NOW - 100)
        await sender.begin_check("op", now=NOW, wait_until=NOW, owner="A", lease_seconds=30, fleets=NO_FLEET)
        moving = [NOW + 1]

        def clock() -> float:
            moving[0] += 0.001
            return moving[0]

        before = (
            store.stats.trips,
            store.stats.durable_commits,
            store.stats.relaxed_commits,
            store.stats.rollbacks,
        )
        for _ in range(20):
            now = moving[0]
            refused = await store.begin_check(
                "op", now=now, wait_until=now, owner="B", lease_seconds=30, fleets=NO_FLEET, clock=clock
            )
            assert refused is not None
            assert refused.decision.kind == Verdict.NOT_YET
        after = (
            store.stats.trips,
            store.stats.durable_commits,
            store.stats.relaxed_commits,
            store.stats.rollbacks,
        )
    assert tuple(b - a for a, b in zip(before, after, strict=True)) == (20, 0, 20, 0)


async def test_a_check_through_the_tools_leaves_no_transaction_open_between_calls(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("idle", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "idle")
        assert (await check(client, "idle"))["outcome"] == "not_yet"
        # Another process can take the write lock at once: nothing of ours is held between calls.
        other = sqlite3.connect(h.db_path, isolation_level=None, timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
        finally:
            other.close()


async def test_every_transaction_runs_on_the_stores_one_database_thread_which_ends_when_the_store_closes(
    tmp_path: Path,
) -> None:
    async with open_store(tmp_path / "pw.db") as store:
        assert isinstance(store, SQLiteStore)
        before = set(threading.enumerate())

        def in_a_transaction(session: Session) -> threading.Thread:
            with session.transaction(durable=False):
                return threading.current_thread()

        used = {await store._db.run(in_a_transaction) for _ in range(20)}
        assert len(used) == 1
        (thread,) = used
        assert thread.name == "pollwarden-sqlite"
        assert thread.is_alive()
        assert set(threading.enumerate()) - before <= used  # no other thread was started for the hops
    thread.join(timeout=5)
    assert not thread.is_alive()
    with pytest.raises(StoreError, match=r"the database .* was closed; nothing was changed"):
        await store._db.run(in_a_transaction)


async def test_a_caller_cancelled_after_its_transaction_began_gets_it_committed_and_its_outcome(
    tmp_path: Path,
) -> None:
    # A reservation that committed while its caller was cancelled must come back, so its request is
    # still sent (inside the check's shield); only a transaction still waiting for BEGIN is rolled back.
    began, go_on = threading.Event(), threading.Event()
    outcomes: list[str] = []

    def work(session: Session) -> str:
        with session.transaction() as conn:
            began.set()
            go_on.wait(10)
            conn.execute("CREATE TABLE committed_marker (x)")
        return "committed"

    async with open_store(tmp_path / "pw.db") as store:
        assert isinstance(store, SQLiteStore)

        async def caller() -> None:
            outcomes.append(await store._db.run(work))
            await anyio.lowlevel.checkpoint()  # the cancellation lands here
            outcomes.append("went on after the cancellation")

        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(caller)
                assert await anyio.to_thread.run_sync(began.wait, 10)
                scope.cancel()
                go_on.set()
        assert scope.cancelled_caught
    assert outcomes == ["committed"]
    with sqlite3.connect(tmp_path / "pw.db") as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'committed_marker'").fetchone()


async def test_callers_cancelled_while_waiting_for_their_turn_leave_at_once_and_write_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "pw.db"
    left: list[int] = []

    def work(session: Session) -> None:
        with session.transaction() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS written (x)")

    async with open_store(db) as store:
        assert isinstance(store, SQLiteStore)
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock: the first caller waits
        try:

            async def caller(number: int) -> None:
                try:
                    await store._db.run(work)
                finally:
                    left.append(number)

            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as group:
                    for number in range(3):
                        group.start_soon(caller, number)
                    await anyio.wait_all_tasks_blocked()  # one waits for BEGIN, two for their turn
                    scope.cancel()
                    await anyio.wait_all_tasks_blocked()
                    # The two behind it did not wait for the lock; the one in BEGIN cannot leave it early.
                    assert sorted(left) == [1, 2]
                    holder.execute("ROLLBACK")
            assert scope.cancelled_caught
        finally:
            holder.close()
        assert sorted(left) == [0, 1, 2]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'written'").fetchone() is None


async def test_concurrent_callers_are_served_one_at_a_time_in_the_order_they_came_and_none_is_left_waiting(
    tmp_path: Path,
) -> None:
    served: list[int] = []
    inside = [0, 0]  # hops in the thread now, the most at once

    def work(number: int) -> Callable[[Session], int]:
        def in_thread(session: Session) -> int:
            inside[0] += 1
            inside[1] = max(inside)
            with session.transaction(durable=False):
                served.append(number)
            inside[0] -= 1
            return number

        return in_thread

    async with open_store(tmp_path / "pw.db") as store:
        assert isinstance(store, SQLiteStore)
        answers: list[int] = []

        async def caller(number: int) -> None:
            answers.append(await store._db.run(work(number)))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for number in range(50):
                    group.start_soon(caller, number)
                    await anyio.lowlevel.checkpoint()  # each queued before the next starts
    assert served == list(range(50))  # in the order they came
    assert sorted(answers) == list(range(50))  # every caller got its own answer
    assert inside[1] == 1  # never two at once
