"""The PostgreSQL engine itself: selection by URL, passwords never shown, migrations once, the audit.

The tool tests run on PostgreSQL through the engine parameter (conftest); these
are about what only PostgreSQL has: a URL with a password, several instances
migrating one database at once, processes on different connections appending
to the audit (and `test_operation_chains.py`, for the audit's per-operation chains).
"""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import psycopg
import psycopg.errors
import pytest
from psycopg import ClientCursor

from harness import database_in, db_rows, db_write, make_harness
from pollwarden.audit.chain import GENESIS_HASH, AuditKeyError, export_jsonl, read_rows, row_hash
from pollwarden.audit.verify import rekey_chain, verify_chain
from pollwarden.config import load_config
from pollwarden.core.errors import ConfigError, StoreError
from pollwarden.store import Engine, open_store
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.migrations import postgres as schema
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.connection import Pool
from pollwarden.store.postgres.engine import PostgresStore
from pollwarden.surface.server import controller_factory
from tests.support.fake_provider import FakeProvider, pending

pytestmark = [pytest.mark.anyio, pytest.mark.both_engines]

SECRET = "s3cr3t-Pa55"


def _new_operation(operation_id: str) -> dict[str, object]:
    """The columns of a new waiting operation with no job, as `Store.create_operation` takes them."""
    return dict(
        operation_id=operation_id, provider="acme", provider_job_id=None, account_context="a",
        request_fingerprint="f", idempotency_key=None, expected_terminal_state="succeeded",
        status="waiting", started_at=0.0, deadline_at=1e9, business_deadline_at=None,
        max_status_requests=5, max_transport_failures=3, max_rate_limited=3, next_check_at=0.0,
        delay_source="local_backoff", submit_payload_json=None, created_at=0.0, updated_at=0.0,
    )  # fmt: skip


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


@pytest.mark.postgres_only
async def test_a_wrong_password_is_a_clear_error_that_does_not_repeat_it(
    tmp_path: Path, database_engine: Engine
) -> None:
    own = database_in(tmp_path)
    # Trust authentication lets any password in on this server: a role that may not log in fails instead.
    # Roles are the whole server's: one of this test's own, dropped after, so none is left behind.
    role = f"pw_locked_{uuid.uuid4().hex[:8]}"
    db_write(own, f"CREATE ROLE {role} NOLOGIN")
    try:
        url = own.dsn.replace("postgres@", f"{role}:{SECRET}@")
        with pytest.raises(StoreError) as refused:
            async with open_store(url, busy_timeout_seconds=1.0):
                pass
    finally:
        db_write(own, f"DROP ROLE IF EXISTS {role}")
    message = str(refused.value)
    assert SECRET not in message
    assert f"{role}:***@" in message
    assert "cannot use PostgreSQL" in message
    assert db_rows(own, "SELECT rolname FROM pg_roles WHERE rolname = ?", role) == []


@pytest.mark.postgres_only
async def test_instances_starting_at_the_same_moment_migrate_the_schema_once(
    tmp_path: Path, database_engine: Engine
) -> None:
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


@pytest.mark.postgres_only
async def test_every_session_bounds_its_lock_waits_commits_durably_and_never_compiles_a_statement(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    assert isinstance(where, DatabaseLocation)
    pool = Pool(where, lock_timeout=2.5, max_size=2)
    await pool.open()
    try:
        shown = [
            await pool.read_one(f"SHOW {name}") for name in ("lock_timeout", "synchronous_commit", "jit")
        ]
    finally:
        await pool.close()
    # JIT off: a start on a one-row head table the planner had no statistics for was compiled, 15 ms
    # of each start at 30,000 operations (benchmarks/scale.py).
    assert shown == [("2500ms",), ("on",), ("off",)]


class _NullParameters(dict[str, object]):
    """Every parameter NULL but the chain's keyed flag: enough for a plan (EXPLAIN alone runs nothing)."""

    def __missing__(self, key: str) -> object:
        return False if key.endswith("keyed") else None  # `keyed = NULL` would plan no read at all


def _scans_of(plan: dict[str, Any], relation: str) -> list[str]:
    found = [plan["Node Type"]] if plan.get("Relation Name") == relation else []
    return found + [scan for child in plan.get("Plans", []) for scan in _scans_of(child, relation)]


@pytest.mark.postgres_only
async def test_a_head_left_with_thousands_of_dead_versions_is_found_through_its_key_not_page_by_page(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    async with open_store(where):
        pass  # migrated
    with psycopg.connect(where.dsn, autocommit=True) as conn:
        # Dead versions a vacuum may not remove yet: a snapshot older than them is still open.
        with psycopg.connect(where.dsn) as old:
            old.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            old.execute("SELECT 1")
            conn.execute(
                "DO $$ BEGIN FOR i IN 1..3000 LOOP UPDATE audit_head SET seq = seq; END LOOP; END $$"
            )
        pages = conn.execute(
            "SELECT pg_relation_size('audit_head') / current_setting('block_size')::int"
        ).fetchone()
        assert pages is not None
        assert pages[0] >= 20
        plain = ClientCursor(conn)
        statements = {
            "a start's first row": sql.OPEN_OPERATION,
            "a chain row's head read": sql.READ_AUDIT_HEAD,
            "a chain row's head lock": sql.LOCK_AUDIT_HEAD,
            "the head moved": sql.SET_AUDIT_HEAD,
            "an operation row": sql.INSERT_OPERATION_ROW,
            "the one-statement answer": sql.answer_statement(("status",)),
        }
        for name, statement in statements.items():
            plain.execute(f"EXPLAIN (FORMAT JSON) {statement}", _NullParameters())
            found = plain.fetchone()
            assert found is not None
            scans = _scans_of(found[0][0]["Plan"], "audit_head")
            assert scans, f"{name} does not read the head"
            assert "Seq Scan" not in scans, f"{name} reads the head with {scans}"


@pytest.mark.postgres_only
async def test_a_database_a_newer_release_migrated_is_refused_with_the_fix(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    async with open_store(where):
        pass
    db_write(where, "UPDATE pollwarden_schema SET version = ?", schema.LATEST + 1)
    with pytest.raises(StoreError, match=r"newer than this pollwarden knows.*upgrade pollwarden"):
        async with open_store(where):
            pass


# Text a JSON encoder must escape (quotes, backslashes, control characters) or pass through (non-ASCII,
# astral characters, U+2028): the row's hash must be the same wherever it was computed.
AWKWARD = 'quote " back \\ slash\nnew line\ttab \x01\x1f del \x7f é ✓ 🦜 \u2028 </script>'


async def test_rows_linked_by_either_engine_verify_and_re_hash_from_the_export_the_same_way(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    async with open_store(where) as store:
        values = _new_operation("op-é")
        await store.create_operation(values, kind="tracking_started", at=1.0)
        for i in range(3):
            await store.audit_event(
                "op-é", kind="polled", at=2.5 + i, note=AWKWARD, extra={AWKWARD: [i, AWKWARD, None]}
            )
    verdict = verify_chain(where, None)
    assert verdict.ok, verdict.problem
    assert verdict.rows_checked == 4
    exported = io.StringIO()
    assert export_jsonl(where, exported) == 4
    prev = GENESIS_HASH
    for line in exported.getvalue().rstrip("\n").split("\n"):  # not splitlines: U+2028 is no line end
        row = json.loads(line)
        assert row["prev_hash"] == prev
        assert row["payload"]["note"] in (None, AWKWARD)
        parts = {k: row[k] for k in ("seq", "operation_id", "at", "kind")}
        assert row["hash"] == row_hash(prev_hash=prev, payload=row["payload_text"], key=None, **parts)
        prev = row["hash"]


async def test_a_server_without_the_key_refuses_to_extend_a_keyed_chain_and_says_how(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    key = b"an audit key"
    values = _new_operation("op-1")
    async with open_store(where) as store:
        await store.create_operation(values, kind="tracking_started", at=1.0)
    async with open_store(where, audit_key=key) as store:
        with pytest.raises(AuditKeyError, match="the audit chain is not keyed"):
            await store.audit_event("op-1", kind="polled", at=2.0, note=None, extra={})
    rekey_chain(where, key, by="ops", at=datetime(2026, 1, 1, tzinfo=UTC))
    async with open_store(where) as store:
        with pytest.raises(AuditKeyError, match=r"the audit chain is keyed \(head seq 2\); set POLLWARDEN"):
            await store.audit_event("op-1", kind="polled", at=3.0, note=None, extra={})
    async with open_store(where, audit_key=key) as store:
        await store.audit_event("op-1", kind="polled", at=3.0, note=None, extra={})
    assert [row.keyed for row in read_rows(where)] == [False, True, True]
    assert verify_chain(where, key, rekeyed_at=2).ok


@pytest.mark.postgres_only
async def test_a_postgresql_database_at_schema_5_holding_one_job_twice_upgrades_and_the_earliest_keeps_it(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    first_release = schema.MIGRATIONS[0]
    assert first_release.number == 5
    columns = {
        "provider": "acme", "account_context": "a", "request_fingerprint": "f",
        "expected_terminal_state": "succeeded", "started_at": 0.0, "deadline_at": 1e9,
        "max_status_requests": 5, "max_transport_failures": 3, "max_rate_limited": 3, "next_check_at": 0.0,
        "delay_source": "local_backoff", "updated_at": 0.0,
    }  # fmt: skip
    with psycopg.connect(where.dsn, autocommit=True) as conn:
        conn.execute(schema.VERSION_TABLE)
        for statement in first_release.statements:
            conn.execute(statement)
        conn.execute("INSERT INTO pollwarden_schema (version) VALUES (5)")
        for operation_id, job, created_at, status in (
            ("b-later", "dup-job", 1002.0, "waiting"),
            ("a-first", "dup-job", 1001.0, "escalated"),
            ("c-last", "dup-job", 1003.0, "waiting"),
            ("alone", "solo", 1000.0, "waiting"),
            ("no-job", None, 1000.0, "waiting"),
        ):
            row = {**columns, "operation_id": operation_id, "provider_job_id": job}
            row.update(created_at=created_at, status=status)
            names = ", ".join(row)
            marks = ", ".join(f"%({name})s" for name in row)
            conn.execute(f"INSERT INTO operations ({names}) VALUES ({marks})", row)  # pyright: ignore[reportArgumentType]

    async with open_store(where) as store:
        found = {op: await store.get(op) for op in ("a-first", "b-later", "c-last", "alone", "no-job")}
        assert {op: None if r is None else r.duplicate_of for op, r in found.items()} == {
            "a-first": None,
            "b-later": "a-first",
            "c-last": "a-first",
            "alone": None,
            "no-job": None,
        }
        # A new start of the job is answered with the earliest operation; the database holds no second.
        values = {
            **columns, "operation_id": "d-new", "provider_job_id": "dup-job", "status": "waiting",
            "business_deadline_at": None, "idempotency_key": None, "submit_payload_json": None,
            "created_at": 2000.0,
        }  # fmt: skip
        held, created = await store.create_operation(values, kind="tracking", at=2000.0)
        assert (held.operation_id, created) == ("a-first", False)
    assert db_rows(where, "SELECT version FROM pollwarden_schema") == [{"version": schema.LATEST}]
    with pytest.raises(psycopg.errors.UniqueViolation), psycopg.connect(where.dsn) as conn:
        conn.execute("UPDATE operations SET duplicate_of = NULL WHERE operation_id = 'b-later'")


@pytest.mark.postgres_only
async def test_on_postgresql_a_refusal_is_one_trip_without_a_durable_commit_and_a_poll_two(
    tmp_path: Path, fake: FakeProvider, database_engine: Engine
) -> None:
    fake.script("trips", [pending("running")])
    h = make_harness(tmp_path, fake)
    h.server()  # writes the provider table the factory loads
    async with controller_factory(h.config(), clock=h.clock, rng=h.rng)() as controller:
        store = controller.store
        assert isinstance(store, PostgresStore)
        await controller.start_operation(provider="acme", operation_id="op-trips", provider_job_id="trips")

        def counted() -> tuple[int, int, int]:
            return store.stats.trips, store.stats.durable_commits, store.stats.relaxed_commits

        before = counted()
        assert (await controller.check_status("op-trips")).outcome == "not_yet"
        after = counted()
        # The row as the start wrote it is known: the refusal is counted in one guarded statement, no read
        # (not waited to disk).
        assert tuple(b - a for a, b in zip(before, after, strict=True)) == (1, 0, 1)

        h.clock.advance(10)
        assert (await controller.check_status("op-trips")).outcome == "polled"
        polled = counted()
        # The reservation (one statement, durable), then the answer on the locked row, which also writes
        # the summary of the refused call (two trips).
        assert tuple(b - a for a, b in zip(after, polled, strict=True)) == (3, 2, 0)

        h.clock.advance(300)
        assert (await controller.check_status("op-trips")).outcome == "polled"
        again = counted()
        # Nothing pending: the reservation, then the answer and its audit row in one trip, guarded by
        # the reserved row.
        assert tuple(b - a for a, b in zip(polled, again, strict=True)) == (2, 2, 0)

        # Another process moves the row: the known row's guard fails, and the check reads it afresh.
        db_write(h.db_path, "UPDATE operations SET version = version + 1 WHERE operation_id = 'op-trips'")
        assert (await controller.check_status("op-trips")).outcome == "not_yet"
        moved = counted()
        assert tuple(b - a for a, b in zip(again, moved, strict=True)) == (3, 0, 2)
    assert len(fake.status_requests("trips")) == 2
    kinds = [row.kind for row in read_rows(h.db_path)]
    assert kinds[-4:] == ["not_yet_summary", "polled", "polled", "not_yet_summary"]  # the last at close
    assert verify_chain(h.db_path, None).ok


async def test_an_answer_that_comes_after_its_lease_was_taken_over_is_recorded_and_not_applied(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    async with open_store(where) as store:
        await store.create_operation(_new_operation("op-late"), kind="tracking_started", at=1.0)
        check = {"wait_until": 0.0, "lease_seconds": 30.0, "fleets": {"acme": None}}
        first = await store.begin_check("op-late", now=10.0, owner="check-a", **check)
        assert first is not None
        assert first.record.lease_owner == "check-a"
        # check-a's process stalls past its lease; another check recovers the lease and reserves.
        second = await store.begin_check("op-late", now=41.0, owner="check-b", **check)
        assert second is not None
        assert (second.record.lease_owner, second.record.status_requests_used) == ("check-b", 2)

        late, applied = await store.apply_answer(
            "op-late", owner="check-a", changes={"polls_completed": 1}, at=42.0, payload_extra={}
        )
        assert not applied
        assert (late.lease_owner, late.polls_completed) == ("check-b", 0)
        answered, applied = await store.apply_answer(
            "op-late", owner="check-b", changes={"polls_completed": 1}, at=43.0, payload_extra={}
        )
        assert applied
        assert (answered.lease_owner, answered.polls_completed) == (None, 1)
        stored = await store.get("op-late")
        assert stored is not None
        assert (stored.lease_owner, stored.polls_completed, stored.version) == (None, 1, answered.version)
    kinds = [row.kind for row in read_rows(where)]
    assert kinds == ["tracking_started", "lease_recovered", "late_answer_ignored", "polled"]
    assert verify_chain(where, None).ok


@pytest.mark.postgres_only
async def test_a_refusal_that_completes_a_summary_counted_by_another_process_writes_the_summary(
    tmp_path: Path, fake: FakeProvider, database_engine: Engine
) -> None:
    fake.script("runs", [pending("running")])
    h = make_harness(tmp_path, fake)
    h.server()
    async with controller_factory(h.config(), clock=h.clock, rng=h.rng)() as controller:
        await controller.start_operation(provider="acme", operation_id="op-runs", provider_job_id="runs")
        assert (await controller.check_status("op-runs")).outcome == "not_yet"
        # Other processes refused 98 more calls meanwhile (the counters move without a new version):
        # this process's known row still says 1, and the next refusal completes a run of 100.
        db_write(
            h.db_path,
            "UPDATE operations SET refused_count = 99 WHERE operation_id = 'op-runs'",
        )
        assert (await controller.check_status("op-runs")).outcome == "not_yet"
        summaries = [r for r in read_rows(h.db_path, "op-runs") if r.kind == "not_yet_summary"]
        assert [r.payload_obj["count"] for r in summaries] == [100]
        assert db_rows(h.db_path, "SELECT refused_count FROM operations") == [{"refused_count": 0}]
    assert verify_chain(h.db_path, None).ok
