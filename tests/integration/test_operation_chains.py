"""Per-operation audit chains under the one chain (PostgreSQL; `pollwarden.audit.verify`).

On PostgreSQL an operation's first audit row is a row of the one chain and
every later row follows that operation's own last row, so answers to
different operations never wait for one head. These tests show what that
keeps: every edit, reorder or deletion in the middle is caught as before, a
deleted operation leaves a gap in the one chain, rows deleted from the end of
an operation are caught once a seal (or `audit anchor`, which seals first)
named them, keys work as on one chain, and a database of the previous release
(one chain only) upgrades and keeps verifying. Where both engines behave
alike, the test runs on both.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from harness import database_in, db_rows, db_write, error_text, make_harness
from pollwarden.audit.chain import CHAIN, OPERATION_LINK, SEAL_KIND, canonical_json, read_rows, row_hash
from pollwarden.audit.entry import ChainHead, chain_row
from pollwarden.audit.verify import rekey_chain, verify_chain
from pollwarden.core.errors import AuditKeyError, StoreError
from pollwarden.store import DatabaseLocation, Engine, open_store
from pollwarden.store.migrations import postgres as schema
from pollwarden.store.postgres.engine import PostgresStore
from pollwarden.surface.server import controller_factory, seal_moved_chains, seal_periodically
from tests.support.fake_provider import FakeProvider, pending

pytestmark = [pytest.mark.anyio, pytest.mark.both_engines]

KEY = b"an audit key of the team"


def _new_operation(operation_id: str) -> dict[str, object]:
    return dict(
        operation_id=operation_id, provider="acme", provider_job_id=None, account_context="a",
        request_fingerprint="f-" + operation_id, idempotency_key=None, expected_terminal_state="succeeded",
        status="waiting", started_at=0.0, deadline_at=1e9, business_deadline_at=None,
        max_status_requests=50, max_transport_failures=3, max_rate_limited=3, next_check_at=0.0,
        delay_source="local_backoff", submit_payload_json=None, created_at=0.0, updated_at=0.0,
    )  # fmt: skip


async def _three_operations(where: DatabaseLocation, *, rows_each: int = 3, key: bytes | None = None) -> None:
    """op-0, op-1, op-2, created in turn, then `rows_each` more rows each, interleaved."""
    async with open_store(where, audit_key=key) as store:
        for n in range(3):
            await store.create_operation(_new_operation(f"op-{n}"), kind="tracking", at=1.0 + n)
        for i in range(rows_each):
            for n in range(3):
                await store.audit_event(f"op-{n}", kind="polled", at=10.0 + i, note=None, extra={"i": i})


def _seq_of(where: DatabaseLocation, operation_id: str, position: int) -> int:
    rows = [r for r in read_rows(where, operation_id)]
    return rows[position - 1].seq


@pytest.mark.postgres_only
async def test_an_operations_first_row_joins_the_one_chain_and_its_later_rows_follow_its_own(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where)
    rows = read_rows(where)
    openings = [r for r in rows if r.kind == "tracking"]
    assert [(r.link, r.position, r.operation_id) for r in openings] == [
        (CHAIN, 1, "op-0"),
        (CHAIN, 2, "op-1"),
        (CHAIN, 3, "op-2"),
    ]
    for n in range(3):
        mine = read_rows(where, f"op-{n}")
        # Its first row's place is in the one chain; its others count its own rows.
        assert [r.position for r in mine] == [n + 1, 2, 3, 4]
        assert [r.link for r in mine] == [CHAIN, OPERATION_LINK, OPERATION_LINK, OPERATION_LINK]
        for before, after in itertools.pairwise(mine):
            assert after.prev_hash == before.hash  # each follows its own operation's row, not the last row
    assert rows[1].prev_hash == rows[0].hash  # the openings follow each other in the one chain
    recorded = db_rows(where, "SELECT operation_id, audit_rows, audit_hash FROM operations ORDER BY 1")
    assert [(r["audit_rows"], r["audit_hash"]) for r in recorded] == [
        (4, read_rows(where, f"op-{n}")[-1].hash) for n in range(3)
    ]
    verdict = verify_chain(where, None)
    assert verdict.ok, verdict.problem
    assert (verdict.rows_checked, verdict.operations) == (12, 3)
    # Each row re-hashes from the export alone: the number hashed is its position.
    for row in rows:
        parts = {"operation_id": row.operation_id, "at": row.at, "kind": row.kind, "payload": row.payload}
        assert row.hash == row_hash(prev_hash=row.prev_hash, seq=row.position, key=None, **parts)


async def test_a_row_deleted_from_the_middle_of_an_operations_chain_is_caught_and_named(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where)
    gone = _seq_of(where, "op-1", 3)
    db_write(where, "DELETE FROM audit WHERE seq = ?", gone)
    broken = verify_chain(where, None)
    assert not broken.ok
    if database_engine == Engine.POSTGRES:
        assert broken.first_broken_seq == _seq_of(where, "op-1", 3)  # the row after the gap
        assert broken.problem is not None
        assert "'op-1''s row 3 is missing (deleted)" in broken.problem
    else:
        assert broken.first_broken_seq == gone


async def test_an_edited_or_reordered_operation_row_is_caught(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where)
    edited = _seq_of(where, "op-2", 2)
    db_write(where, "UPDATE audit SET payload = replace(payload, '\"i\":0', '\"i\":7') WHERE seq = ?", edited)
    broken = verify_chain(where, None)
    assert (broken.ok, broken.first_broken_seq) == (False, edited)
    assert broken.problem is not None
    assert "hash mismatch" in broken.problem


async def test_a_deleted_operation_leaves_a_gap_in_the_one_chain(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where)
    # Everything about op-1, its own record included, as someone hiding it would.
    db_write(where, "DELETE FROM audit WHERE operation_id = ?", "op-1")
    db_write(where, "DELETE FROM operations WHERE operation_id = ?", "op-1")
    broken = verify_chain(where, None)
    assert not broken.ok
    assert broken.problem is not None
    if database_engine == Engine.POSTGRES:
        assert broken.first_broken_seq == 2  # op-1's opening was the chain's second row (seq 2)
        assert "row 2 is missing (deleted from the chain)" in broken.problem
    else:
        assert "seq gap" in broken.problem


@pytest.mark.postgres_only
async def test_rows_deleted_from_an_operations_end_are_caught_by_its_record_and_once_sealed_by_the_seal(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where)
    # Naive: the last two rows of op-0 go, its own record still says four.
    last_two = [r.seq for r in read_rows(where, "op-0")[2:]]
    for seq in last_two:
        db_write(where, "DELETE FROM audit WHERE seq = ?", seq)
    naive = verify_chain(where, None)
    assert not naive.ok
    assert naive.problem is not None
    assert "'op-0' records 4 audit rows, but its chain holds 2" in naive.problem


@pytest.mark.postgres_only
async def test_a_seal_names_every_moved_chain_so_a_tail_hidden_with_its_record_is_still_caught(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where)
    async with open_store(where) as store:
        assert isinstance(store, PostgresStore)
        assert await store.seal(at=100.0) == 3
        assert await store.seal(at=101.0) == 0  # nothing moved since: no row written
        await store.audit_event("op-2", kind="polled", at=102.0, note=None, extra={"i": 9})
        assert await store.seal(at=103.0) == 1
    seals = [r for r in read_rows(where) if r.kind == SEAL_KIND]
    assert [r.link for r in seals] == [CHAIN, CHAIN]
    assert [[e[0], e[1]] for e in seals[0].payload_obj["operations"]] == [  # type: ignore[index, union-attr]
        ["op-0", 4],
        ["op-1", 4],
        ["op-2", 4],
    ]
    assert verify_chain(where, None).ok
    # Someone hides op-0's last row and fixes op-0's record to match: only the seal still knows.
    hidden = read_rows(where, "op-0")
    db_write(where, "DELETE FROM audit WHERE seq = ?", hidden[-1].seq)
    db_write(
        where,
        "UPDATE operations SET audit_rows = 3, audit_hash = ? WHERE operation_id = 'op-0'",
        hidden[-2].hash,
    )
    broken = verify_chain(where, None)
    assert not broken.ok
    assert broken.first_broken_seq == seals[0].seq
    assert broken.problem is not None
    assert (
        f"the seal at row {seals[0].seq} names 4 rows of operation 'op-0': row 4 is missing" in broken.problem
    )


@pytest.mark.postgres_only
async def test_a_seal_names_at_most_a_batch_per_row_and_skips_chains_of_one_row_the_one_chain_holds(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    async with open_store(where) as store:
        assert isinstance(store, PostgresStore)
        for n in range(5):
            await store.create_operation(_new_operation(f"op-{n}"), kind="tracking", at=1.0 + n)
            if n != 3:  # op-3 keeps its first row alone
                await store.audit_event(f"op-{n}", kind="polled", at=10.0, note=None, extra={})
        assert await store.seal(at=20.0, batch=2) == 4
        assert await store.seal(at=21.0, batch=2) == 0
    seals = [r for r in read_rows(where) if r.kind == SEAL_KIND]
    named = [[e[0] for e in r.payload_obj["operations"]] for r in seals]  # type: ignore[union-attr]
    assert named == [["op-0", "op-1"], ["op-2", "op-4"]]
    assert verify_chain(where, None).ok
    # op-3 needs no seal: its one row cut, with its record, breaks the one chain.
    cut = _seq_of(where, "op-3", 1)
    db_write(where, f"DELETE FROM audit WHERE seq = {cut}")
    db_write(where, "DELETE FROM operations WHERE operation_id = 'op-3'")
    broken = verify_chain(where, None)
    assert not broken.ok
    assert "is missing" in (broken.problem or "")


@pytest.mark.postgres_only
async def test_audit_anchor_on_postgresql_seals_first_so_the_anchor_catches_a_hidden_operation_tail(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where)
    anchor_file = tmp_path / "anchor.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}
    anchored = subprocess.run(
        [sys.executable, "-m", "pollwarden", "audit", "anchor", "--db", where.dsn, "--out", str(anchor_file)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert anchored.returncode == 0, anchored.stderr
    assert "sealed the audit chains of 3 operations" in anchored.stdout
    seal = [r for r in read_rows(where) if r.kind == SEAL_KIND][-1]
    assert json.loads(anchor_file.read_text())["seq"] == seal.seq  # the anchor is the seal row

    hidden = read_rows(where, "op-1")
    db_write(where, "DELETE FROM audit WHERE seq = ?", hidden[-1].seq)
    db_write(
        where,
        "UPDATE operations SET audit_rows = 3, audit_hash = ? WHERE operation_id = 'op-1'",
        hidden[-2].hash,
    )
    checked = subprocess.run(
        [sys.executable, "-m", "pollwarden", "audit", "verify", "--db", where.dsn, "--anchor", str(anchor_file)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert checked.returncode == 1
    assert "names 4 rows of operation 'op-1': row 4 is missing (deleted)" in checked.stdout


@pytest.mark.postgres_only
async def test_answers_to_other_operations_never_wait_for_the_chain_head_but_a_new_operation_does(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where, rows_each=1)
    with psycopg.connect(where.dsn) as holder:  # another session holds the one chain's head
        holder.execute("SELECT 1 FROM audit_head FOR UPDATE")
        async with open_store(where, busy_timeout_seconds=0.3) as store:
            check = {"wait_until": 0.0, "lease_seconds": 30.0, "fleets": {"acme": None}}
            started = await store.begin_check("op-0", now=50.0, owner="me", **check)
            assert started is not None
            assert started.record.lease_owner == "me"
            answered, applied = await store.apply_answer(
                "op-0", owner="me", changes={"polls_completed": 1}, at=51.0, payload_extra={}
            )
            assert applied
            assert answered.polls_completed == 1
            await store.audit_event("op-1", kind="note", at=52.0, note="still free", extra={})
            with pytest.raises(StoreError, match=r"stayed locked by (another session|session [0-9]+)"):
                await store.create_operation(_new_operation("op-new"), kind="tracking", at=53.0)
    assert verify_chain(where, None).ok
    assert [r.kind for r in read_rows(where, "op-0")][-1] == "polled"
    assert read_rows(where, "op-new") == []


async def test_a_keyed_teams_operation_rows_are_keyed_and_verify_only_with_the_key(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where, key=KEY)
    rows = read_rows(where)
    assert all(r.keyed for r in rows)
    assert verify_chain(where, KEY).ok
    without = verify_chain(where, None)
    assert without.problem is not None
    assert "is keyed (HMAC); set POLLWARDEN_AUDIT_KEY" in without.problem
    wrong = verify_chain(where, b"another key")
    assert wrong.problem is not None
    assert "hash mismatch" in wrong.problem


@pytest.mark.postgres_only
async def test_a_rekey_seals_the_unkeyed_operations_so_rewriting_one_afterwards_is_caught(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where)
    rekey_seq = rekey_chain(where, KEY, by="ops", at=datetime(2026, 12, 1, tzinfo=UTC))
    async with open_store(where, audit_key=KEY) as store:
        for n in range(3):
            await store.audit_event(f"op-{n}", kind="polled", at=200.0, note="keyed now", extra={})
    assert verify_chain(where, KEY, rekeyed_at=rekey_seq).ok
    rekey_row = next(r for r in read_rows(where) if r.seq == rekey_seq)
    assert len(rekey_row.payload_obj["operations"]) == 3  # type: ignore[arg-type]

    # Someone rewrites op-0's unkeyed rows consistently (plain SHA-256 needs no key) after the re-key.
    mine = read_rows(where, "op-0")
    unkeyed = [r for r in mine if not r.keyed]
    prev = unkeyed[0].prev_hash
    for row in unkeyed:
        payload = row.payload.replace('"i":', '"i":1') if row.kind == "polled" else row.payload
        parts = {"operation_id": row.operation_id, "at": row.at, "kind": row.kind, "payload": payload}
        digest = row_hash(prev_hash=prev, seq=row.position, key=None, **parts)
        db_write(
            where,
            "UPDATE audit SET payload = ?, prev_hash = ?, hash = ? WHERE seq = ?",
            payload,
            prev,
            digest,
            row.seq,
        )
        prev = digest
    broken = verify_chain(where, KEY, rekeyed_at=rekey_seq)
    assert not broken.ok  # the keyed re-key row named op-0's unkeyed head: the rewrite cannot match it


@pytest.mark.postgres_only
async def test_a_database_of_the_previous_release_upgrades_and_its_operations_continue_in_chains_of_their_own(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    previous = [step for step in schema.MIGRATIONS if step.number < 13]
    with psycopg.connect(
        where.dsn, autocommit=True
    ) as conn:  # the schema as the release before step 13 left it
        conn.execute(schema.VERSION_TABLE)
        conn.execute(schema.STEPS_TABLE)
        for step in previous:
            for statement in step.statements:
                if statement.strip():
                    conn.execute(statement)  # pyright: ignore[reportArgumentType]
            conn.execute("INSERT INTO pollwarden_schema_steps (number) VALUES (%s)", (step.number,))
        conn.execute("INSERT INTO pollwarden_schema (version) VALUES (12)")
        head: ChainHead | None = None
        for n, (op, kind) in enumerate((("old-a", "tracking"), ("old-b", "tracking"), ("old-a", "polled"))):
            if kind == "tracking":
                values = {**_new_operation(op), "owner": "local"}
                names = ", ".join(values)
                conn.execute(
                    f"INSERT INTO operations ({names}) VALUES ({', '.join('%(' + k + ')s' for k in values)})",  # pyright: ignore[reportArgumentType]
                    values,
                )
            row = chain_row(head, operation_id=op, at=datetime(2026, 1, 1, 0, 0, n, tzinfo=UTC), kind=kind,
                            payload={"decision": kind}, key=None)  # fmt: skip
            conn.execute(
                "INSERT INTO audit (seq, operation_id, at, kind, payload, prev_hash, hash, keyed) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, false)",
                (row.position, op, row.at, kind, row.payload, row.prev_hash, row.hash),
            )
            conn.execute("UPDATE audit_head SET seq = %s, hash = %s", (row.position, row.hash))
            head = ChainHead(row.position, row.hash, False)
    assert verify_chain(where, None).ok

    async with open_store(where) as store:
        await store.audit_event("old-a", kind="polled", at=300.0, note="after the upgrade", extra={})
        await store.create_operation(_new_operation("new-c"), kind="tracking", at=301.0)
        await store.audit_event("old-b", kind="polled", at=302.0, note="after the upgrade", extra={})
    old_a = read_rows(where, "old-a")
    assert [(r.seq, r.position, r.link) for r in old_a] == [
        (1, 1, CHAIN),
        (3, 3, CHAIN),
        (4, 3, OPERATION_LINK),
    ]
    assert old_a[-1].prev_hash == old_a[-2].hash  # continues from its last row in the one chain
    new_c = read_rows(where, "new-c")
    assert [(r.position, r.link) for r in new_c] == [(4, CHAIN)]  # the one chain goes on after seq 3
    assert db_rows(where, "SELECT version FROM pollwarden_schema") == [{"version": schema.LATEST}]
    verdict = verify_chain(where, None)
    assert verdict.ok, verdict.problem
    assert verdict.rows_checked == 6


def test_four_processes_appending_to_their_own_operations_at_once_leave_one_valid_audit(
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
    ready = [tmp_path / f"ready-{n}" for n in range(4)]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in ready):  # bounded: every worker has created its operation
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.02)
    go.touch()
    for proc in workers:
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err.decode()
    verdict = verify_chain(where, None)
    assert verdict.ok, verdict.problem
    assert verdict.rows_checked == 4 * 26
    rows = read_rows(where)
    for n in range(4):
        mine = read_rows(where, f"op-{n}")
        assert [r.payload_obj.get("i") for r in mine if r.kind == "polled"] == list(range(25))
        if database_engine == Engine.POSTGRES:  # its first row in the one chain, then its own chain
            assert [(r.link, r.position) for r in mine][1:] == [(OPERATION_LINK, p) for p in range(2, 27)]
        else:  # every row in the one chain, at its seq
            assert all(r.link == CHAIN and r.position == r.seq for r in mine)
    owners = [r.operation_id for r in rows]
    assert sum(1 for a, b in itertools.pairwise(owners) if a != b) > 3  # they interleaved


APPENDER = """
import os, sys, anyio
from pathlib import Path
from pollwarden.store import open_store

async def main(url, worker, go):
    async with open_store(url) as store:
        values = dict(
            operation_id="op-" + worker, provider="acme", provider_job_id=None, account_context="a",
            request_fingerprint="f" + worker, idempotency_key=None, expected_terminal_state="succeeded",
            status="waiting", started_at=0.0, deadline_at=1e9, business_deadline_at=None,
            max_status_requests=5, max_transport_failures=3, max_rate_limited=3, next_check_at=0.0,
            delay_source="local_backoff", submit_payload_json=None, created_at=0.0, updated_at=0.0,
        )
        await store.create_operation(values, kind="tracking", at=1.0)
        Path(go).with_name("ready-" + worker).write_text("ready")
        with anyio.fail_after(30):
            while not os.path.exists(go):
                await anyio.sleep(0.002)
        for i in range(25):
            await store.audit_event("op-" + worker, kind="polled", at=2.0 + i, note=None, extra={"i": i})
            await anyio.sleep(0.002)  # let the other workers in between

anyio.run(main, *sys.argv[1:4])
"""


@pytest.mark.postgres_only
async def test_a_start_is_one_trip_and_writes_what_the_locked_start_writes(
    tmp_path: Path, database_engine: Engine
) -> None:
    quick, locked = database_in(tmp_path / "quick"), database_in(tmp_path / "locked")
    async with open_store(quick) as store:
        assert isinstance(store, PostgresStore)
        before = store.stats.trips
        record, created = await store.create_operation(_new_operation("op-a"), kind="tracking", at=5.0)
        assert created
        assert store.stats.trips - before == 1  # the row, its first audit row and the head, committed
        again, created_again = await store.create_operation(_new_operation("op-a"), kind="tracking", at=6.0)
        assert (again, created_again) == (record, False)  # the id is taken: answered with the operation
    async with open_store(locked, audit_key=KEY) as store:  # a keyed chain takes the locked way
        keyed, _ = await store.create_operation(_new_operation("op-a"), kind="tracking", at=5.0)
    assert keyed == record
    (first,) = read_rows(quick, "op-a")
    (first_keyed,) = read_rows(locked, "op-a")
    assert (first.payload, first.position, first.link) == (first_keyed.payload, 1, CHAIN)
    assert db_rows(quick, "SELECT audit_rows, audit_hash FROM operations") == [
        {"audit_rows": 1, "audit_hash": first.hash}
    ]
    assert verify_chain(quick, None).ok
    assert verify_chain(locked, KEY).ok


async def test_a_serving_process_seals_the_chains_that_moved_on_its_own(
    tmp_path: Path, fake: FakeProvider, database_engine: Engine
) -> None:
    fake.script("sealed", [pending("running")])
    h = make_harness(tmp_path, fake)
    h.server()  # writes the provider table the factory loads
    async with controller_factory(h.config(), clock=h.clock, rng=h.rng)() as controller:
        await controller.start_operation(provider="acme", operation_id="op-sealed", provider_job_id="sealed")
        assert await seal_moved_chains(controller) == 0  # its one row is in the one chain: nothing to seal
        h.clock.advance(10)
        await controller.check_status("op-sealed")
        first = await seal_moved_chains(controller)
        assert await seal_moved_chains(controller) == 0  # nothing moved since
        await controller.start_operation(provider="acme", operation_id="op-later", provider_job_id="later")
        await controller.check_status("op-later")  # a refusal: counted, no row yet
        h.clock.advance(10)
        await controller.check_status("op-later")
        with anyio.move_on_after(2):  # a round every 0.01 s of real time, for at most 2 s
            await seal_periodically(controller, 0.01)
    seals = [r for r in read_rows(h.db_path) if r.kind == SEAL_KIND]
    if database_engine == Engine.POSTGRES:
        assert first == 1
        named = [[e[0] for e in r.payload_obj["operations"]] for r in seals]  # type: ignore[union-attr]
        assert named == [["op-sealed"], ["op-later"]]  # the loop sealed what moved, once
    else:
        assert (first, seals) == (0, [])  # every SQLite row is in the one chain: nothing to seal
    assert verify_chain(h.db_path, None).ok


@pytest.mark.postgres_only
async def test_a_row_forged_without_the_key_and_slipped_in_before_the_rekey_is_caught_by_its_seal(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where, rows_each=2)
    rekey_seq = rekey_chain(where, KEY, by="ops", at=datetime(2026, 12, 1, tzinfo=UTC))
    assert verify_chain(where, KEY, rekeyed_at=rekey_seq).ok
    # Someone with write access but no key: make room before the re-key row (seq is not hashed), put a
    # plain-SHA-256 "succeeded" there at op-0's next place, and fix op-0's own record to match.
    last = read_rows(where, "op-0")[-1]
    payload = canonical_json({"decision": "polled", "status": "succeeded", "note": "forged"})
    forged_at = "2026-12-01T00:00:09.000Z"
    digest = row_hash(
        prev_hash=last.hash,
        seq=4,
        operation_id="op-0",
        at=forged_at,
        kind="polled",
        payload=payload,
        key=None,
    )
    db_write(where, "UPDATE audit SET seq = seq - 1000 WHERE seq < ?", rekey_seq)
    db_write(
        where,
        "INSERT INTO audit (seq, position, link, operation_id, at, kind, payload, prev_hash, hash, keyed) "
        "VALUES (?, 4, 'operation', 'op-0', ?, 'polled', ?, ?, ?, false)",
        rekey_seq - 1, forged_at, payload, last.hash, digest,
    )  # fmt: skip
    db_write(
        where, "UPDATE operations SET audit_rows = 4, audit_hash = ? WHERE operation_id = 'op-0'", digest
    )
    broken = verify_chain(where, KEY, rekeyed_at=rekey_seq)
    assert not broken.ok
    assert broken.first_broken_seq == rekey_seq
    assert broken.problem is not None
    assert "names 3 rows of operation 'op-0': it has 4 rows before it" in broken.problem


async def test_the_chains_own_operation_id_cannot_be_started_so_no_operation_mixes_with_its_seals(
    tmp_path: Path, fake: FakeProvider, database_engine: Engine
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        refused = await client.call_tool(
            "start_operation",
            {"provider": "acme", "operation_id": "pollwarden-audit", "provider_job_id": "j"},
        )
        assert refused.is_error
        assert "operation_id must not be 'pollwarden-audit'" in error_text(refused)
    async with open_store(h.database) as store:
        with pytest.raises(ValueError, match="names the audit chain's own rows"):
            await store.create_operation(_new_operation("pollwarden-audit"), kind="tracking", at=1.0)
        assert await store.count_operations() == 0


@pytest.mark.postgres_only
async def test_an_instance_of_the_release_before_still_running_after_the_upgrade_cannot_append_a_row(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where, rows_each=1)
    # What the release before step 13 runs for an unkeyed append: its seq from the head, no place.
    old_append = (
        "INSERT INTO audit (seq, operation_id, at, kind, payload, prev_hash, hash, keyed) "
        "SELECT seq + 1, 'op-0', '2026-12-01T00:00:00.000Z', 'polled', '{}', hash, 'x', false FROM audit_head"
    )
    with pytest.raises(psycopg.errors.RaiseException, match="upgraded to pollwarden schema step 13"):
        db_write(where, old_append)
    assert verify_chain(where, None).ok


def _blocked_behind(where: DatabaseLocation, holder: int) -> int:
    """How many sessions wait, directly or through another waiter, for a lock `holder` (a pid) holds."""
    found = db_rows(
        where,
        "WITH RECURSIVE w(pid) AS (SELECT pid FROM pg_stat_activity WHERE ? = ANY(pg_blocking_pids(pid)) "
        "UNION SELECT a.pid FROM pg_stat_activity AS a, w WHERE w.pid = ANY(pg_blocking_pids(a.pid))) "
        "SELECT count(*) AS n FROM w",
        holder,
    )
    return int(found[0]["n"])


def _until_blocked(where: DatabaseLocation, holder: psycopg.Connection[Any], sessions: int) -> None:
    deadline = time.monotonic() + 20
    while _blocked_behind(where, holder.info.backend_pid) < sessions:  # bounded: queued behind the holder
        assert time.monotonic() < deadline, "the session never waited for the lock"
        time.sleep(0.02)


def _in_thread(results: dict[str, object], name: str, work: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        try:
            results[name] = work()
        except Exception as exc:  # the test reports what went wrong
            results[name] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _store_call(where: DatabaseLocation, call: Callable[[Any], Awaitable[object]]) -> Callable[[], object]:
    async def go() -> object:
        async with open_store(where, busy_timeout_seconds=20) as store:
            return await call(store)

    return lambda: anyio.run(go)


@pytest.mark.postgres_only
async def test_a_rekey_and_a_start_both_waiting_for_the_head_neither_deadlock_nor_fork_the_chain(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    await _three_operations(where, rows_each=1)
    results: dict[str, object] = {}
    with psycopg.connect(where.dsn) as holder:  # a start or a seal holding the head for a moment
        holder.execute("SELECT 1 FROM audit_head FOR UPDATE")
        rekeying = _in_thread(
            results, "rekey", lambda: rekey_chain(where, KEY, by="ops", at=datetime(2026, 12, 1, tzinfo=UTC))
        )
        _until_blocked(where, holder, 1)
        starting = _in_thread(
            results,
            "start",
            _store_call(where, lambda s: s.create_operation(_new_operation("late"), kind="tracking", at=9.0)),
        )
        _until_blocked(where, holder, 2)
    rekeying.join(30)
    starting.join(30)
    rekey_seq = results["rekey"]
    assert isinstance(rekey_seq, int), rekey_seq
    # The start waited behind the re-key, then saw the chain keyed: refused with the fix, nothing written.
    assert isinstance(results["start"], AuditKeyError), results["start"]
    assert verify_chain(where, KEY, rekeyed_at=rekey_seq).ok


@pytest.mark.postgres_only
async def test_a_seal_and_a_flush_of_refusals_over_the_same_operations_never_deadlock(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    async with open_store(where) as store:
        await store.create_operation(_new_operation("op-b"), kind="tracking", at=1.0)  # stored before op-a
        await store.create_operation(_new_operation("op-a"), kind="tracking", at=2.0)
        for op in ("op-b", "op-a"):  # a second row each: a chain of one row needs no seal
            await store.audit_event(op, kind="polled", at=3.0, note=None, extra={})
    db_write(
        where,
        "UPDATE operations SET refused_count = 1, refused_outcome = 'not_yet', refused_first_at = 5, "
        "refused_last_at = 5",
    )
    results: dict[str, object] = {}
    with psycopg.connect(where.dsn) as holder:  # an answer to op-b in flight
        holder.execute("SELECT 1 FROM operations WHERE operation_id = 'op-b' FOR UPDATE")
        sealing = _in_thread(results, "seal", _store_call(where, lambda s: s.seal(at=9.0)))
        _until_blocked(where, holder, 1)
        flushing = _in_thread(results, "flush", _store_call(where, lambda s: s.flush_refusals()))
        _until_blocked(where, holder, 2)
    sealing.join(30)
    flushing.join(30)
    # Neither failed on a deadlock or a lock timeout. The seal's own store writes pending refusals as
    # it closes, and may get to them first: then the flush finds nothing left. Either way, once each.
    assert results["seal"] == 2
    assert results["flush"] in (0, 2), results
    summaries = [r.operation_id for r in read_rows(where) if r.kind == "not_yet_summary"]
    assert sorted(summaries) == ["op-a", "op-b"]
    assert verify_chain(where, None).ok


@pytest.mark.postgres_only
async def test_an_operation_recorded_without_any_audit_row_gets_its_answer_recorded_as_its_first(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    async with open_store(where) as store:
        await store.create_operation(_new_operation("op-a"), kind="tracking", at=1.0)
    values = _new_operation("op-bare")
    names = ", ".join(values)
    db_write(
        where, f"INSERT INTO operations ({names}) VALUES ({', '.join('?' for _ in values)})", *values.values()
    )
    async with open_store(where) as store:
        check = {"wait_until": 10.0, "lease_seconds": 30.0, "fleets": {"acme": None}}
        started = await store.begin_check("op-bare", now=10.0, owner="me", **check)
        assert started is not None
        assert started.record.status_requests_used == 1
        _, applied = await store.apply_answer(
            "op-bare", owner="me", changes={"state": "running"}, at=11.0, payload_extra={}
        )
        assert applied
    (first,) = read_rows(where, "op-bare")
    assert (first.kind, first.link) == ("polled", CHAIN)
    assert verify_chain(where, None).ok
