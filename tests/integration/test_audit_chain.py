"""The audit chain is tamper-evident, concurrency-safe and reads as a story."""

from __future__ import annotations

import hashlib
import hmac
import io
import itertools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from pollwarden.audit.chain import (
    GENESIS_HASH,
    REKEY_KIND,
    Anchor,
    AuditError,
    AuditKeyError,
    AuditRow,
    audit_key_from_env,
    canonical_json,
    export_jsonl,
    read_anchor,
    read_rows,
    row_hash,
    write_anchor,
)
from pollwarden.audit.story import render_story
from pollwarden.audit.verify import rekey_chain, verify_chain
from pollwarden.cli.main import main as audit_main
from pollwarden.store.migrations.sqlite import audit_table_v1
from pollwarden.store.sqlite.executor import append_audit
from tests.support.live import REPO_ROOT

# The audit table as the store's first migration creates it (the chain alone, without operations).
AUDIT_SCHEMA_SQL = audit_table_v1()
SERVER_DIR = REPO_ROOT / "server"
T0 = datetime(2025, 4, 18, 10, 20, 0, tzinfo=UTC)
KEY = b"correct horse battery staple"

PAYLOAD_KEYS = (
    "decision",
    "outcome",
    "status",
    "state",
    "category",
    "stop_reason",
    "next_check_at",
    "delay_source",
    "retry_after_seconds",
    "status_requests_used",
    "max_status_requests",
    "transport_failures_used",
    "max_transport_failures",
    "rate_limited_used",
    "deadline_at",
    "business_deadline_at",
    "http_status",
    "provider_request_id",
    "provider_job_id",
    "rejected_hints",
    "note",
)


def ts(hms: str) -> str:
    """RFC 3339 for a time of day on the scenario's date."""
    return f"2025-04-18T{hms}.000Z"


def at(hms: str) -> datetime:
    hours, minutes, seconds = (int(part) for part in hms.split(":"))
    return T0.replace(hour=hours, minute=minutes, second=seconds)


def payload(kind: str, **fields: object) -> dict[str, object]:
    """A controller payload: every key present, null when not applicable."""
    base: dict[str, object] = {key: None for key in PAYLOAD_KEYS}
    base["decision"] = kind
    base["rejected_hints"] = []
    base.update(fields)
    return base


async def open_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(AUDIT_SCHEMA_SQL)
    return conn


async def append(
    conn: sqlite3.Connection,
    kind: str,
    fields: Mapping[str, object],
    *,
    when: datetime,
    key: bytes | None = None,
    operation_id: str = "report-export-2025-04-18-01",
) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        seq = append_audit(conn, operation_id=operation_id, at=when, kind=kind, payload=fields, key=key)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return seq


SCENARIO: Sequence[tuple[str, str, dict[str, object]]] = (
    (
        "10:20:00",
        "submitted",
        payload(
            "submitted",
            status="waiting",
            provider_job_id="exp_71c",
            deadline_at=ts("11:00:00"),
            max_status_requests=12,
            next_check_at=ts("10:20:05"),
            delay_source="local_backoff",
        ),
    ),
    (
        "10:20:05",
        "polled",
        payload(
            "polled",
            outcome="polled",
            status="waiting",
            state="queued",
            category="pending",
            http_status=200,
            next_check_at=ts("10:20:14"),
            delay_source="local_backoff",
            status_requests_used=1,
            max_status_requests=12,
            provider_job_id="exp_71c",
        ),
    ),
    (
        "10:20:31",
        "polled",
        payload(
            "polled",
            outcome="polled",
            status="waiting",
            state="queued",
            category="pending",
            http_status=503,
            retry_after_seconds=120.0,
            next_check_at=ts("10:22:31"),
            delay_source="provider_retry_after",
            transport_failures_used=1,
            max_transport_failures=3,
        ),
    ),
    (
        "10:22:31",
        "polled",
        payload(
            "polled",
            outcome="polled",
            status="waiting",
            state="running",
            category="pending",
            http_status=200,
            next_check_at=ts("10:23:48"),
            delay_source="local_backoff",
        ),
    ),
    (
        "10:23:48",
        "polled",
        payload(
            "polled",
            outcome="polled",
            status="succeeded",
            state="succeeded",
            category="succeeded",
            stop_reason="succeeded",
            http_status=200,
        ),
    ),
)

SCENARIO_STORY = [
    "10:20:00 submitted job exp_71c, deadline 11:00:00, budget 12",
    "10:20:05 polled, state queued, next poll 10:20:14 from local backoff",
    "10:20:31 received 503, Retry-After 120, next poll 10:22:31 from provider guidance",
    "10:22:31 polled, state running, next poll 10:23:48 from local backoff",
    "10:23:48 polled, state succeeded, succeeded",
]


async def build_chain(path: Path, rows: int = 6, key: bytes | None = None) -> None:
    conn = await open_db(path)
    try:
        for index in range(rows):
            await append(
                conn,
                "polled",
                payload(
                    "polled", status="waiting", state="running", http_status=200, status_requests_used=index
                ),
                when=T0 + timedelta(seconds=10 * index),
                key=key,
            )
    finally:
        conn.close()


def tamper(path: Path, sql: str, params: Sequence[object] = ()) -> None:
    """Write to the database behind the controller's back, as an attacker would."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(sql, tuple(params))
    finally:
        conn.close()


def rehash_from(
    path: Path, first_seq: int, *, key: bytes | None, keyed: int, last_seq: int | None = None
) -> None:
    """Recompute hashes from ``first_seq`` to the head (or ``last_seq``) so those rows are self-consistent."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        rows = conn.execute(
            "SELECT seq, operation_id, at, kind, payload FROM audit WHERE seq >= ? AND seq <= ? ORDER BY seq",
            (first_seq, last_seq if last_seq is not None else 2**62),
        ).fetchall()
        prev = conn.execute("SELECT hash FROM audit WHERE seq = ?", (first_seq - 1,)).fetchone()
        prev_hash = GENESIS_HASH if prev is None else str(prev[0])
        for seq, operation_id, when, kind, body in rows:
            digest = row_hash(
                prev_hash=prev_hash,
                seq=seq,
                operation_id=operation_id,
                at=when,
                kind=kind,
                payload=body,
                key=key,
            )
            conn.execute(
                "UPDATE audit SET prev_hash = ?, hash = ?, keyed = ? WHERE seq = ?",
                (prev_hash, digest, keyed, seq),
            )
            prev_hash = digest
    finally:
        conn.close()


def checkpoint(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


# --- hashing primitives -----------------------------------------------------


def test_canonical_json_is_sorted_compact_and_unicode() -> None:
    assert canonical_json({"b": 1, "a": ["é", None]}) == '{"a":["é",null],"b":1}'
    with pytest.raises(ValueError, match="JSON compliant"):
        canonical_json({"x": float("nan")})


def test_row_hash_is_sha256_without_key_and_hmac_with_key() -> None:
    def digest(key: bytes | None) -> str:
        return row_hash(
            prev_hash=GENESIS_HASH,
            seq=1,
            operation_id="op",
            at=ts("10:20:00"),
            kind="k",
            payload="{}",
            key=key,
        )

    message = canonical_json([1, "op", ts("10:20:00"), "k", "{}", GENESIS_HASH]).encode()
    assert digest(None) == hashlib.sha256(message).hexdigest()
    assert digest(KEY) == hmac.new(KEY, message, hashlib.sha256).hexdigest()
    assert digest(b"other") != digest(KEY)


def test_audit_key_comes_from_the_environment_and_empty_means_none() -> None:
    assert audit_key_from_env({"POLLWARDEN_AUDIT_KEY": "sécret"}) == "sécret".encode()
    assert audit_key_from_env({"POLLWARDEN_AUDIT_KEY": ""}) is None
    assert audit_key_from_env({}) is None


# --- writing ----------------------------------------------------------------


@pytest.mark.anyio
async def test_rows_are_numbered_from_one_and_linked_to_their_predecessor(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=3)
    rows = read_rows(db)
    assert [row.seq for row in rows] == [1, 2, 3]
    assert rows[0].prev_hash == GENESIS_HASH
    assert rows[1].prev_hash == rows[0].hash
    assert rows[0].at == "2025-04-18T10:20:00.000Z"
    assert rows[0].payload == canonical_json(rows[0].payload_obj)
    assert not rows[0].keyed


@pytest.mark.anyio
async def test_append_outside_a_transaction_is_refused(tmp_path: Path) -> None:
    conn = await open_db(tmp_path / "pw.db")
    try:
        with pytest.raises(RuntimeError, match="transaction"):
            append_audit(conn, operation_id="op", at=T0, kind="polled", payload={}, key=None)
    finally:
        conn.close()


@pytest.mark.anyio
async def test_naive_timestamps_are_refused(tmp_path: Path) -> None:
    conn = await open_db(tmp_path / "pw.db")
    try:
        with pytest.raises(ValueError, match="timezone"):
            await append(conn, "polled", {}, when=datetime(2025, 4, 18, 10, 20))
    finally:
        conn.close()


@pytest.mark.anyio
async def test_continuing_a_keyed_chain_without_the_key_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=2, key=KEY)
    conn = await open_db(db)
    try:
        with pytest.raises(AuditKeyError, match="POLLWARDEN_AUDIT_KEY"):
            await append(conn, "polled", {}, when=T0, key=None)
    finally:
        conn.close()
    assert len(read_rows(db)) == 2


# --- verification -------------------------------------------------------------


@pytest.mark.anyio
async def test_an_intact_chain_verifies(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=6)
    result = verify_chain(db, None)
    assert result.ok
    assert result.rows_checked == 6
    assert result.first_broken_seq is None
    assert result.problem is None
    assert result.head_seq == 6
    assert result.head_hash == read_rows(db)[-1].hash


@pytest.mark.anyio
async def test_an_empty_chain_verifies(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=0)
    result = verify_chain(db, None)
    assert result.ok
    assert result.rows_checked == 0
    assert result.head_hash == GENESIS_HASH


@pytest.mark.anyio
async def test_a_row_edited_in_place_is_caught_at_that_seq(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=6)
    forged = canonical_json(payload("polled", status="succeeded", state="succeeded", http_status=200))
    tamper(db, "UPDATE audit SET payload = ? WHERE seq = 4", (forged,))
    result = verify_chain(db, None)
    assert not result.ok
    assert result.first_broken_seq == 4
    assert result.problem is not None
    assert "hash mismatch" in result.problem
    assert result.rows_checked == 3


@pytest.mark.anyio
async def test_a_row_edited_and_rehashed_breaks_the_link_to_the_next_row(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=6)
    row2 = read_rows(db)[1]
    digest = row_hash(
        prev_hash=row2.prev_hash,
        seq=2,
        operation_id=row2.operation_id,
        at=row2.at,
        kind="forged",
        payload=row2.payload,
        key=None,
    )
    tamper(db, "UPDATE audit SET kind = 'forged', hash = ? WHERE seq = 2", (digest,))
    result = verify_chain(db, None)
    assert not result.ok
    assert result.first_broken_seq == 3
    assert result.problem is not None
    assert "prev_hash" in result.problem


@pytest.mark.anyio
async def test_a_row_deleted_from_the_middle_is_caught_and_named(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=6)
    tamper(db, "DELETE FROM audit WHERE seq = 3")
    result = verify_chain(db, None)
    assert not result.ok
    assert result.first_broken_seq == 3
    assert result.problem is not None
    assert "row 3 is missing" in result.problem


@pytest.mark.anyio
async def test_a_truncated_tail_passes_alone_but_is_caught_by_the_anchor(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=6)
    anchor = write_anchor(db, tmp_path / "anchor.json")
    assert anchor == read_anchor(tmp_path / "anchor.json")
    assert (anchor.seq, anchor.hash) == (6, read_rows(db)[-1].hash)
    assert verify_chain(db, None, anchor).ok

    tamper(db, "DELETE FROM audit WHERE seq > 4")
    assert verify_chain(db, None).ok
    result = verify_chain(db, None, anchor)
    assert not result.ok
    assert result.first_broken_seq == 5
    assert result.problem is not None
    assert "beyond the head" in result.problem


@pytest.mark.anyio
async def test_rows_appended_after_the_anchor_still_verify_against_it(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=3)
    anchor = write_anchor(db, tmp_path / "anchor.json")
    conn = await open_db(db)
    try:
        await append(conn, "polled", payload("polled"), when=T0 + timedelta(minutes=5))
    finally:
        conn.close()
    result = verify_chain(db, None, anchor)
    assert result.ok
    assert result.head_seq == 4


@pytest.mark.anyio
async def test_an_unkeyed_chain_rewritten_consistently_is_caught_only_by_the_anchor(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=6)
    anchor = write_anchor(db, tmp_path / "anchor.json")
    tamper(db, "UPDATE audit SET kind = 'forged' WHERE seq = 2")
    rehash_from(db, 2, key=None, keyed=0)
    assert verify_chain(db, None).ok
    result = verify_chain(db, None, anchor)
    assert not result.ok
    assert result.first_broken_seq == 6
    assert result.problem is not None
    assert "differs from the anchor" in result.problem


@pytest.mark.anyio
async def test_a_keyed_chain_verifies_with_the_key_only(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=4, key=KEY)
    assert all(row.keyed for row in read_rows(db))
    assert verify_chain(db, KEY).ok

    without = verify_chain(db, None)
    assert not without.ok
    assert without.first_broken_seq == 1
    assert without.problem is not None
    assert "set POLLWARDEN_AUDIT_KEY to verify" in without.problem

    wrong = verify_chain(db, b"not the key")
    assert not wrong.ok
    assert wrong.first_broken_seq == 1


@pytest.mark.anyio
async def test_a_keyed_chain_rewritten_without_the_key_is_caught(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=6, key=KEY)
    tamper(
        db, "UPDATE audit SET payload = ? WHERE seq = 3", (canonical_json(payload("polled", note="forged")),)
    )

    # Attacker recomputes plain SHA-256 over the edited rows and marks them unkeyed.
    rehash_from(db, 3, key=None, keyed=0)
    result = verify_chain(db, KEY)
    assert not result.ok
    assert result.first_broken_seq == 3
    assert result.problem is not None
    assert "not keyed" in result.problem

    # Or keeps the keyed flag: the HMAC no longer matches.
    rehash_from(db, 3, key=None, keyed=1)
    result = verify_chain(db, KEY)
    assert not result.ok
    assert result.first_broken_seq == 3
    assert result.problem is not None
    assert "hash mismatch" in result.problem


@pytest.mark.anyio
async def test_a_whole_chain_rewritten_unkeyed_fails_when_a_key_is_given(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=3, key=KEY)
    rehash_from(db, 1, key=None, keyed=0)
    assert verify_chain(db, None).ok
    result = verify_chain(db, KEY)
    assert not result.ok
    assert result.first_broken_seq == 1


@pytest.mark.anyio
async def test_a_keyed_append_onto_an_unkeyed_head_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=2)
    conn = await open_db(db)
    try:
        with pytest.raises(AuditKeyError, match="audit rekey"):
            await append(conn, "polled", payload("polled"), when=T0, key=KEY)
    finally:
        conn.close()
    assert [row.keyed for row in read_rows(db)] == [False, False]


@pytest.mark.anyio
async def test_an_unkeyed_prefix_is_accepted_only_up_to_the_named_rekey_row(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    await build_chain(db, rows=2)
    seq = rekey_chain(db, KEY, by="ops-alice", at=T0 + timedelta(minutes=1))
    assert seq == 3
    conn = await open_db(db)
    try:
        for minute in range(2, 4):
            await append(conn, "polled", payload("polled"), when=T0 + timedelta(minutes=minute), key=KEY)
    finally:
        conn.close()
    rekey_row = read_rows(db)[2]
    assert (rekey_row.kind, rekey_row.keyed, rekey_row.operation_id) == (REKEY_KIND, True, "pollwarden-audit")
    assert rekey_row.payload_obj["unkeyed_rows"] == 2

    unnamed = verify_chain(db, KEY)
    assert not unnamed.ok
    assert unnamed.first_broken_seq == 1
    assert unnamed.problem is not None
    assert "pass --rekeyed-at 3" in unnamed.problem

    named = verify_chain(db, KEY, rekeyed_at=3)
    assert named.ok
    assert (named.mode, named.unkeyed_prefix, named.rows_checked) == ("rekeyed", 2, 5)

    wrong = verify_chain(db, KEY, rekeyed_at=2)
    assert not wrong.ok
    assert wrong.problem is not None
    assert "row 2 is not the keyed re-key row" in wrong.problem

    # The unkeyed rows are linked to the re-key row: rewriting them afterwards breaks the link.
    shutil.copy(db, tmp_path / "before-edit.db")
    tamper(db, "UPDATE audit SET kind = 'forged' WHERE seq = 1")
    rehash_from(db, 1, key=None, keyed=0, last_seq=2)
    edited = verify_chain(db, KEY, rekeyed_at=3)
    assert not edited.ok
    assert edited.first_broken_seq == 3

    shutil.copy(tmp_path / "before-edit.db", db)
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"pw.db{suffix}").unlink(missing_ok=True)
    rehash_from(db, 4, key=None, keyed=0)  # a downgrade after the re-key
    downgraded = verify_chain(db, KEY, rekeyed_at=3)
    assert not downgraded.ok
    assert downgraded.first_broken_seq == 4


@pytest.mark.anyio
async def test_rekey_refuses_an_empty_a_keyed_or_a_broken_chain(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    await build_chain(empty, rows=0)
    with pytest.raises(AuditKeyError, match="empty"):
        rekey_chain(empty, KEY, by="ops", at=T0)
    keyed = tmp_path / "keyed.db"
    await build_chain(keyed, rows=2, key=KEY)
    with pytest.raises(AuditKeyError, match="already keyed"):
        rekey_chain(keyed, KEY, by="ops", at=T0)
    broken = tmp_path / "broken.db"
    await build_chain(broken, rows=3)
    tamper(broken, "DELETE FROM audit WHERE seq = 2")
    with pytest.raises(AuditKeyError, match="broken chain"):
        rekey_chain(broken, KEY, by="ops", at=T0)
    assert len(read_rows(broken)) == 2


def test_cli_verify_states_its_mode_and_what_it_cannot_detect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "pw.db"
    anyio.run(build_chain, db, 3)
    monkeypatch.delenv("POLLWARDEN_AUDIT_KEY", raising=False)
    assert audit_main(["audit", "verify", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "mode: unkeyed (plain SHA-256; POLLWARDEN_AUDIT_KEY not given)" in out
    assert "cannot detect: a chain rewritten consistently by anyone who can write the database file" in out

    monkeypatch.setenv("POLLWARDEN_AUDIT_KEY", KEY.decode())
    assert audit_main(["audit", "verify", "--db", str(db)]) == 1
    assert "row 1 is not keyed" in capsys.readouterr().out
    assert audit_main(["audit", "rekey", "--db", str(db), "--by", "ops-alice"]) == 0
    assert "re-keyed the audit chain at seq 4" in capsys.readouterr().out
    assert audit_main(["audit", "verify", "--db", str(db)]) == 1
    assert "pass --rekeyed-at 4" in capsys.readouterr().out
    assert audit_main(["audit", "verify", "--db", str(db), "--rekeyed-at", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("audit chain OK: 4 rows")
    assert "mode: keyed from the re-key row at seq 4 on" in out
    assert "cannot detect: a rewrite of the unkeyed rows before the re-key" in out
    assert KEY.decode() not in out


@pytest.mark.anyio
async def test_verify_works_on_an_offline_copy_of_the_file(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    await build_chain(db, rows=5, key=KEY)
    checkpoint(db)
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    copy = evidence / "copy.db"
    shutil.copy(db, copy)
    assert not (evidence / "copy.db-wal").exists()
    result = verify_chain(copy, KEY)
    assert result.ok
    assert result.rows_checked == 5
    copy.chmod(0o444)
    assert [row.seq for row in read_rows(copy)] == [1, 2, 3, 4, 5]


def test_a_missing_database_is_an_error_not_an_empty_chain(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="not found"):
        verify_chain(tmp_path / "absent.db", None)
    assert not (tmp_path / "absent.db").exists()
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(AuditError, match="audit table"):
        read_rows(empty)


def test_a_malformed_anchor_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "anchor.json"
    bad.write_text(json.dumps({"seq": -1, "hash": "x", "at": "now"}))
    with pytest.raises(AuditError, match="seq"):
        read_anchor(bad)
    bad.write_text("not json")
    with pytest.raises(AuditError):
        read_anchor(bad)


# --- concurrency ----------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import os, sqlite3, sys, time
    from datetime import UTC, datetime
    from pollwarden.store.sqlite.executor import append_audit

    def main(db: str, worker: str, go: str) -> None:
        print("ready", flush=True)  # imported and at the start line
        deadline = time.monotonic() + 20
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                raise SystemExit("start signal never came")
            time.sleep(0.002)
        conn = sqlite3.connect(db, isolation_level=None, timeout=30)
        for i in range(25):
            conn.execute("BEGIN IMMEDIATE")
            try:
                append_audit(conn, operation_id="op-" + worker, at=datetime.now(UTC),
                             kind="polled", payload={"i": i, "worker": worker}, key=None)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            time.sleep(0.001)  # hold the write lock a moment: widen any race
            conn.execute("COMMIT")
            time.sleep(0.003)  # let the other workers in between our rows
        conn.close()

    main(*sys.argv[1:4])
    """
)


def test_four_processes_appending_together_leave_one_contiguous_chain(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.executescript(AUDIT_SCHEMA_SQL)
    setup.close()
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SERVER_DIR), os.environ.get("PYTHONPATH", "")])}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(db), str(n), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(4)
    ]
    try:
        # Every interpreter is at the start line before any may begin: so they run together.
        for proc in workers:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"ready\n", proc.communicate(timeout=60)[1].decode()
        go.touch()
        for proc in workers:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err.decode()
    finally:
        for proc in workers:  # none outlives a failed test
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    result = verify_chain(db, None)
    assert result.ok, result.problem
    assert result.rows_checked == 100
    rows = read_rows(db)
    assert [row.seq for row in rows] == list(range(1, 101))
    for n in range(4):
        mine = read_rows(db, f"op-{n}")
        assert [row.payload_obj["i"] for row in mine] == list(range(25))
    # The workers really interleaved (otherwise the test proves little).
    owners = [row.operation_id for row in rows]
    assert sum(1 for a, b in itertools.pairwise(owners) if a != b) > 3


# --- story ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_scripted_scenario_reads_as_the_source_documents_story(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    conn = await open_db(db)
    try:
        for hms, kind, fields in SCENARIO:
            await append(conn, kind, fields, when=at(hms))
        await append(conn, "polled", payload("polled"), when=at("10:30:00"), operation_id="someone-else")
    finally:
        conn.close()
    rows = read_rows(db, "report-export-2025-04-18-01")
    assert render_story(rows) == SCENARIO_STORY


def story_of(kind: str, when: str, **fields: object) -> str:
    body = payload(kind, **fields)
    row = AuditRow(
        seq=1,
        operation_id="op",
        at=ts(when),
        kind=kind,
        payload=canonical_json(body),
        prev_hash=GENESIS_HASH,
        hash=GENESIS_HASH,
        keyed=False,
        payload_obj=body,
    )
    [line] = render_story([row])
    return line


def test_every_kind_of_decision_has_its_story_line() -> None:
    assert (
        story_of(
            "tracking",
            "10:20:00",
            provider_job_id="exp_71c",
            deadline_at=ts("11:00:00"),
            max_status_requests=12,
        )
        == "10:20:00 tracking job exp_71c, deadline 11:00:00, budget 12"
    )
    assert (
        story_of(
            "polled",
            "10:58:00",
            http_status=200,
            state="running",
            status="escalated",
            stop_reason="request_budget_exhausted",
        )
        == "10:58:00 polled, state running, request budget exhausted, escalated"
    )
    assert (
        story_of(
            "polled",
            "10:21:00",
            http_status=429,
            status="waiting",
            next_check_at=ts("10:22:00"),
            delay_source="local_backoff",
        )
        == "10:21:00 received 429, next poll 10:22:00 from local backoff"
    )
    assert (
        story_of(
            "polled", "10:24:00", http_status=401, status="escalated", stop_reason="authorization_denied"
        )
        == "10:24:00 received 401, authorization denied, escalated"
    )
    assert (
        story_of(
            "polled",
            "10:24:00",
            note="connection refused",
            status="escalated",
            stop_reason="delivery_ambiguous",
        )
        == "10:24:00 no response (connection refused), delivery ambiguous, escalated"
    )
    assert (
        story_of(
            "polled",
            "10:24:00",
            note="timeout",
            status="waiting",
            next_check_at=ts("10:24:30"),
            delay_source="local_backoff",
        )
        == "10:24:00 no response (timeout), next poll 10:24:30 from local backoff"
    )
    assert (
        story_of("stopped", "11:00:02", status="escalated", stop_reason="deadline_exceeded")
        == "11:00:02 deadline exceeded before polling, escalated"
    )
    assert (
        story_of("not_yet_summary", "10:20:13", count=37, first_at=ts("10:20:06"), last_at=ts("10:20:13"))
        == "10:20:06–10:20:13 refused 37 early checks (not yet)"
    )
    assert (
        story_of("not_yet_summary", "10:20:06", count=1, first_at=ts("10:20:06"), last_at=ts("10:20:06"))
        == "10:20:06 refused 1 early check (not yet)"
    )
    assert (
        story_of(
            "extension_approved",
            "10:59:00",
            extra_seconds=900,
            extra_status_requests=4,
            deadline_at=ts("11:15:00"),
            max_status_requests=16,
        )
        == "10:59:00 extension approved: +900 s, +4 checks, deadline 11:15:00, budget 16"
    )
    assert story_of("extension_denied", "10:59:30") == "10:59:30 extension denied"
    assert (
        story_of("extension_denied", "10:59:30", note="ap-1 by bob (console)", authenticated_by="console")
        == "10:59:30 extension denied: ap-1 by bob (console), authenticated by console"
    )
    assert (
        story_of(
            "extension_approved", "10:59:00", extra_seconds=60, approved_by="alice", authenticated_by="tty"
        )
        == "10:59:00 extension approved: +60 s by alice, authenticated by tty"
    )
    assert (
        story_of("approval_pending", "10:59:00", note="(+900 s, +4 checks)")
        == "10:59:00 extension awaiting operator approval (+900 s, +4 checks)"
    )
    assert (
        story_of("cancel_requested", "11:01:00", note="by operator")
        == "11:01:00 cancel_requested: by operator"
    )
    assert story_of("lease_lost", "11:01:00") == "11:01:00 lease_lost: lease_lost"


def test_rejected_hints_ride_on_the_polled_line() -> None:
    line = story_of(
        "polled",
        "10:20:14",
        http_status=200,
        state="running",
        status="waiting",
        next_check_at=ts("10:20:31"),
        delay_source="local_backoff",
        rejected_hints=[{"source": "poll_after_seconds", "value": -5, "reason": "negative"}],
    )
    assert line == (
        "10:20:14 polled, state running, next poll 10:20:31 from local backoff"
        " (ignored hint: poll_after_seconds -5: negative)"
    )


def test_provider_text_cannot_break_the_story_onto_new_lines() -> None:
    line = story_of(
        "polled", "10:24:00", note="boom\n10:25:00 polled, state succeeded\x1b[2J", status="waiting"
    )
    assert "\n" not in line
    assert "\x1b" not in line


# --- export and CLI ---------------------------------------------------------------


@pytest.mark.anyio
async def test_export_writes_one_json_object_per_row(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    conn = await open_db(db)
    try:
        for hms, kind, fields in SCENARIO:
            await append(conn, kind, fields, when=at(hms))
        await append(conn, "polled", payload("polled"), when=at("10:30:00"), operation_id="someone-else")
    finally:
        conn.close()
    out = io.StringIO()
    assert export_jsonl(db, out) == 6
    lines = out.getvalue().splitlines()
    assert len(lines) == 6
    records = [json.loads(line) for line in lines]
    assert [r["seq"] for r in records] == list(range(1, 7))
    assert records[0]["payload"]["provider_job_id"] == "exp_71c"
    assert canonical_json(records[0]["payload"]) == records[0]["payload_text"]
    assert {"operation_id", "at", "kind", "prev_hash", "hash", "keyed"} <= set(records[0])

    only = io.StringIO()
    assert export_jsonl(db, only, "someone-else") == 1


@pytest.mark.anyio
async def test_cli_verify_exits_zero_when_intact_and_one_when_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "pw.db"
    secret = "cli-secret-key-value"
    await build_chain(db, rows=4, key=secret.encode())
    monkeypatch.setenv("POLLWARDEN_AUDIT_KEY", secret)
    monkeypatch.delenv("POLLWARDEN_DB", raising=False)

    assert audit_main(["audit", "verify", "--db", str(db)]) == 0
    ok = capsys.readouterr().out
    assert ok.startswith("audit chain OK: 4 rows, head seq 4 hash ")

    anchor_file = tmp_path / "anchor.json"
    monkeypatch.setenv("POLLWARDEN_DB", str(db))
    assert audit_main(["audit", "anchor", "--out", str(anchor_file)]) == 0
    assert audit_main(["audit", "verify", "--anchor", str(anchor_file)]) == 0
    capsys.readouterr()

    tamper(db, "DELETE FROM audit WHERE seq = 4")
    assert audit_main(["audit", "verify", "--db", str(db)]) == 0
    assert audit_main(["audit", "verify", "--db", str(db), "--anchor", str(anchor_file)]) == 1
    broken = capsys.readouterr().out
    assert "audit chain BROKEN at seq 4: " in broken

    tamper(db, "UPDATE audit SET at = '2025-04-18T09:00:00.000Z' WHERE seq = 2")
    assert audit_main(["audit", "verify"]) == 1
    assert audit_main(["audit", "anchor", "--out", str(tmp_path / "laundered.json")]) == 1
    assert not (tmp_path / "laundered.json").exists()

    monkeypatch.delenv("POLLWARDEN_AUDIT_KEY")
    assert audit_main(["audit", "verify"]) == 1
    out = capsys.readouterr().out
    assert "set POLLWARDEN_AUDIT_KEY to verify" in out
    assert secret not in out


def test_cli_without_a_database_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("POLLWARDEN_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    (tmp_path / "data" / "pollwarden").mkdir(parents=True)
    # Like every command, audit looks in the user's data directory; nothing there is an error naming --db.
    assert audit_main(["audit", "verify"]) == 2
    err = capsys.readouterr().err
    assert f"no database at {tmp_path / 'data' / 'pollwarden' / 'pollwarden.db'}" in err
    assert "--db" in err
    assert audit_main(["audit", "verify", "--db", str(tmp_path / "absent.db")]) == 2
    assert audit_main(["audit"]) == 2


@pytest.mark.anyio
async def test_cli_show_prints_the_story_and_export_writes_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "pw.db"
    conn = await open_db(db)
    try:
        for hms, kind, fields in SCENARIO:
            await append(conn, kind, fields, when=at(hms))
    finally:
        conn.close()
    assert audit_main(["audit", "show", "report-export-2025-04-18-01", "--db", str(db)]) == 0
    assert capsys.readouterr().out.splitlines() == SCENARIO_STORY
    assert audit_main(["audit", "show", "no-such-op", "--db", str(db)]) == 1

    out = tmp_path / "audit.jsonl"
    assert audit_main(["audit", "export", "--db", str(db), "--out", str(out)]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 5
    capsys.readouterr()
    assert audit_main(["audit", "export", "--db", str(db)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5


def test_anchor_of_an_empty_chain_is_the_genesis(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    conn = sqlite3.connect(db)
    conn.executescript(AUDIT_SCHEMA_SQL)
    conn.close()
    anchor = write_anchor(db, tmp_path / "a.json")
    assert anchor == Anchor(seq=0, hash=GENESIS_HASH, at=anchor.at)
    assert verify_chain(db, None, anchor).ok


def test_a_pending_approval_is_named_by_the_kind_recorded_with_it() -> None:
    # An extension's request carries the stop reason it answers; it was shown as a "reopen" before.
    extension = {"operation_id": "op", "stop_reason": "request_budget_exhausted", "extra_seconds": 600}
    assert (
        story_of("approval_pending", "10:59:00", note="ap-1", request=extension, approval_kind="extension")
        == "10:59:00 extension awaiting operator approval ap-1"
    )
    assert (
        story_of("approval_pending", "10:59:00", note="ap-1", request=extension)
        == "10:59:00 extension awaiting operator approval ap-1"
    )
    for kind, shown in [("resubmission", "resubmission"), ("status_request", "status request")]:
        line = story_of("approval_pending", "10:59:00", note="ap-2", request={"x": 1}, approval_kind=kind)
        assert line == f"10:59:00 {shown} awaiting operator approval ap-2"
    reopen = {"reason": "key rotated", "stop_reason": "authorization_denied", "stop_detail": "403"}
    assert story_of("approval_pending", "11:00:00", note="ap-3", request=reopen).startswith(
        "11:00:00 reopen awaiting"
    )
