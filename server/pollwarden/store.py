"""The SQLite store: operation records, leases, approvals and the audit chain.

Every state change that must not race is one guarded statement inside a
`BEGIN IMMEDIATE` transaction (procrastinate's pattern: `UPDATE … WHERE status
IN (…)` and check the row count). Several server processes share one file.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import anyio

from pollwarden.audit import AUDIT_SCHEMA_SQL, append_audit
from pollwarden.errors import StoreError
from pollwarden.records import OPERATION_COLUMNS, OperationRecord
from pollwarden.schedule import pace, slot_still_held
from pollwarden.timefmt import iso, to_datetime
from pollwarden_providers.table import FleetSpec

BUSY_TIMEOUT_SECONDS = 5.0
# Overrides BUSY_TIMEOUT_SECONDS (the database-fault tests use a short one).
BUSY_TIMEOUT_ENV = "POLLWARDEN_BUSY_TIMEOUT_SECONDS"
# A looping agent's refusals become one audit row per this many calls (or one
# per decision in between), so the audit cannot grow without bound.
REFUSALS_PER_SUMMARY = 100

T = TypeVar("T")

_MIGRATIONS: list[str] = [
    # 1: operations, approvals, audit
    """
    CREATE TABLE operations (
        operation_id TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        provider_job_id TEXT,
        account_context TEXT NOT NULL,
        request_fingerprint TEXT NOT NULL,
        idempotency_key TEXT,
        expected_terminal_state TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN
            ('submitting','waiting','succeeded','failed','cancelled','expired','escalated')),
        stop_reason TEXT,
        stop_detail TEXT,
        state TEXT,
        category TEXT,
        started_at REAL NOT NULL,
        deadline_at REAL NOT NULL,
        business_deadline_at REAL,
        max_status_requests INTEGER NOT NULL CHECK (max_status_requests > 0),
        max_transport_failures INTEGER NOT NULL CHECK (max_transport_failures > 0),
        max_rate_limited INTEGER NOT NULL CHECK (max_rate_limited > 0),
        status_requests_used INTEGER NOT NULL DEFAULT 0,
        transport_failures_used INTEGER NOT NULL DEFAULT 0,
        rate_limited_used INTEGER NOT NULL DEFAULT 0,
        polls_completed INTEGER NOT NULL DEFAULT 0,
        next_check_at REAL NOT NULL,
        delay_source TEXT NOT NULL,
        retry_after_seconds REAL,
        last_http_status INTEGER,
        last_http_at REAL,
        provider_request_id TEXT,
        provider_expires_at REAL,
        error TEXT,
        result_json TEXT,
        lease_owner TEXT,
        lease_expires_at REAL,
        not_yet_count INTEGER NOT NULL DEFAULT 0,
        not_yet_first_at REAL,
        not_yet_last_at REAL,
        extensions_used INTEGER NOT NULL DEFAULT 0,
        stopped_at REAL,
        submit_payload_json TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        CHECK (status_requests_used <= max_status_requests)
    );
    CREATE INDEX operations_by_status ON operations(status, next_check_at);
    CREATE TABLE approvals (
        approval_id TEXT PRIMARY KEY,
        operation_id TEXT NOT NULL REFERENCES operations(operation_id),
        kind TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending','approved','denied','expired','void','applied')),
        request_json TEXT NOT NULL,
        bound_version INTEGER NOT NULL,
        asked_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        decided_at REAL,
        decided_by TEXT,
        note TEXT
    );
    CREATE INDEX approvals_by_operation ON approvals(operation_id, status);
    """
    + AUDIT_SCHEMA_SQL,
    # 2: [fleet] pacing shared by every process: one GCRA clock per provider,
    # and the slot booked for an operation that had to wait for one.
    """
    CREATE TABLE fleet_buckets (
        provider TEXT PRIMARY KEY,
        tat REAL NOT NULL
    );
    ALTER TABLE operations ADD COLUMN fleet_slot_at REAL;
    """,
    # 3: follow-up operations (fetch_result, cancel), each with its own record
    """
    CREATE TABLE followups (
        followup_id TEXT PRIMARY KEY,
        operation_id TEXT NOT NULL REFERENCES operations(operation_id),
        kind TEXT NOT NULL CHECK (kind IN ('fetch_result', 'cancel')),
        status TEXT NOT NULL CHECK (status IN ('done', 'refused', 'sent', 'failed', 'ambiguous')),
        approval_id TEXT,
        requested_at REAL NOT NULL,
        finished_at REAL,
        http_status INTEGER,
        answer TEXT,
        note TEXT
    );
    CREATE INDEX followups_by_operation ON followups(operation_id, requested_at);
    """,
]


@dataclass(frozen=True)
class FollowupRecord:
    """One follow-up operation (fetch_result, cancel) with its own record."""

    followup_id: str
    operation_id: str
    kind: str
    status: str
    approval_id: str | None
    requested_at: float
    finished_at: float | None
    http_status: int | None
    answer: str | None
    note: str | None


@dataclass(frozen=True)
class Reservation:
    """The outcome of trying to reserve one status request."""

    record: OperationRecord
    reserved: bool
    paced: bool


def _may_reserve(record: OperationRecord, now: float) -> bool:
    """The reservation guard, in Python (the SQL guard is the one that counts)."""
    lease_free = record.lease_owner is None or (record.lease_expires_at or 0.0) <= now
    return (
        record.status == "waiting"
        and now < record.effective_deadline
        and now >= record.next_check_at
        and record.status_requests_used < record.max_status_requests
        and lease_free
    )


@dataclass(frozen=True)
class ApprovalRecord:
    """One row of `approvals`."""

    approval_id: str
    operation_id: str
    kind: str
    status: str
    request_json: str
    bound_version: int
    asked_at: float
    expires_at: float
    decided_at: float | None
    decided_by: str | None
    note: str | None

    @property
    def request(self) -> dict[str, Any]:
        """The recorded request (what would be added)."""
        value: dict[str, Any] = json.loads(self.request_json)
        return value


_APPROVAL_COLUMNS = [
    "approval_id",
    "operation_id",
    "kind",
    "status",
    "request_json",
    "bound_version",
    "asked_at",
    "expires_at",
    "decided_at",
    "decided_by",
    "note",
]

_COLUMNS_SQL = ", ".join(OPERATION_COLUMNS)


def busy_timeout_seconds() -> float:
    """How long a write waits for another process's lock before giving up with a clear error."""
    raw = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not raw:
        return BUSY_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise StoreError(f"{BUSY_TIMEOUT_ENV}={raw!r} must be a number of seconds greater than 0, e.g. 5")
    return value


def _describe(exc: sqlite3.Error, path: Path) -> StoreError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreError(
            f"the database {path} stayed locked by another process for more than {busy_timeout_seconds():g} s; "
            "nothing was changed — try again shortly, or find the process holding it"
        )
    if "readonly" in text or "read-only" in text:
        return StoreError(
            f"the database {path} is read-only; nothing was changed — give the server write access to the "
            "file and its directory (SQLite needs to create -wal and -shm files beside it)"
        )
    if "unable to open" in text:
        return StoreError(
            f"cannot open the database {path}: does its directory exist and is it writable? "
            "Set --db or POLLWARDEN_DB to a writable location"
        )
    return StoreError(f"database error on {path}: {text}")


class Store:
    """One process's connection to the shared database."""

    def __init__(self, conn: aiosqlite.Connection, path: Path, audit_key: bytes | None) -> None:
        self.conn = conn
        self.path = path
        self.audit_key = audit_key
        # One connection per process, shared by concurrent tool calls: one
        # transaction (or read) at a time on it, or BEGIN would nest.
        self._lock = anyio.Lock()

    # -- plumbing ---------------------------------------------------------

    @asynccontextmanager
    async def write(self) -> AsyncGenerator[aiosqlite.Connection]:
        """A `BEGIN IMMEDIATE` transaction: the write lock is taken up front, so reads inside are current."""
        async with self._lock:
            try:
                await self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise _describe(exc, self.path) from exc
            try:
                yield self.conn
            except sqlite3.Error as exc:
                # A write refused inside the transaction (read-only file, full disk): the same clear error.
                with suppress(sqlite3.Error):
                    await self.conn.execute("ROLLBACK")
                raise _describe(exc, self.path) from exc
            except BaseException:
                with suppress(sqlite3.Error):
                    await self.conn.execute("ROLLBACK")
                raise
            try:
                await self.conn.execute("COMMIT")
            except sqlite3.Error as exc:
                with suppress(sqlite3.Error):
                    await self.conn.execute("ROLLBACK")
                raise _describe(exc, self.path) from exc

    async def _guard(self, work: Callable[[], Awaitable[T]]) -> T:
        async with self._lock:
            try:
                return await work()
            except sqlite3.Error as exc:
                raise _describe(exc, self.path) from exc

    async def _fetch_operation(self, operation_id: str) -> OperationRecord | None:
        async with self.conn.execute(
            f"SELECT {_COLUMNS_SQL} FROM operations WHERE operation_id = ?", (operation_id,)
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else OperationRecord.from_row(tuple(row), OPERATION_COLUMNS)

    async def _must_fetch(self, operation_id: str) -> OperationRecord:
        record = await self._fetch_operation(operation_id)
        if record is None:  # rows are never deleted, so this is a programming error
            raise StoreError(f"operation {operation_id!r} vanished from {self.path}")
        return record

    async def _audit(
        self, record: OperationRecord, at: float, kind: str, payload: Mapping[str, object]
    ) -> None:
        await append_audit(
            self.conn,
            operation_id=record.operation_id,
            at=to_datetime(at),
            kind=kind,
            payload=payload,
            key=self.audit_key,
        )

    async def _flush_refusals(self, record: OperationRecord) -> OperationRecord:
        """Write the pending not-yet summary row (if any) and reset its counter."""
        if record.not_yet_count == 0:
            return record
        payload = decision_payload(record, kind="not_yet_summary", outcome="not_yet")
        payload.update(
            count=record.not_yet_count,
            first_at=iso(record.not_yet_first_at),
            last_at=iso(record.not_yet_last_at),
        )
        await self._audit(record, record.not_yet_last_at or record.updated_at, "not_yet_summary", payload)
        await self.conn.execute(
            "UPDATE operations SET not_yet_count = 0, not_yet_first_at = NULL, not_yet_last_at = NULL "
            "WHERE operation_id = ?",
            (record.operation_id,),
        )
        return await self._must_fetch(record.operation_id)

    # -- reads --------------------------------------------------------------

    async def get(self, operation_id: str) -> OperationRecord | None:
        """The current record, or None."""
        return await self._guard(lambda: self._fetch_operation(operation_id))

    async def list_operations(
        self, *, status: str | None = None, provider: str | None = None, limit: int = 50
    ) -> list[OperationRecord]:
        """Most recent operations first."""

        async def work() -> list[OperationRecord]:
            sql = f"SELECT {_COLUMNS_SQL} FROM operations"
            clauses: list[str] = []
            params: list[Any] = []
            if status is not None:
                clauses.append("status = ?")
                params.append(status)
            if provider is not None:
                clauses.append("provider = ?")
                params.append(provider)
            if clauses:
                sql += " WHERE " + " AND ".join(clauses)
            sql += " ORDER BY created_at DESC, operation_id LIMIT ?"
            params.append(limit)
            async with self.conn.execute(sql, params) as cur:
                rows = await cur.fetchall()
            return [OperationRecord.from_row(tuple(r), OPERATION_COLUMNS) for r in rows]

        return await self._guard(work)

    async def count_operations(self) -> int:
        """How many operations the database holds."""

        async def work() -> int:
            async with self.conn.execute("SELECT count(*) FROM operations") as cur:
                row = await cur.fetchone()
            return int(row[0]) if row else 0

        return await self._guard(work)

    # -- creating -----------------------------------------------------------

    async def create_operation(
        self, values: Mapping[str, object], *, kind: str, at: float
    ) -> tuple[OperationRecord, bool]:
        """Insert the record (and its first audit row) unless the id exists; return (record, created)."""
        columns = list(values)
        placeholders = ", ".join("?" for _ in columns)
        async with self.write() as conn:
            cur = await conn.execute(
                f"INSERT OR IGNORE INTO operations ({', '.join(columns)}) VALUES ({placeholders})",
                [values[c] for c in columns],
            )
            created = cur.rowcount == 1
            record = await self._must_fetch(str(values["operation_id"]))
            if created:
                await self._audit(record, at, kind, decision_payload(record, kind=kind, outcome=None))
        return record, created

    async def update_fields(
        self,
        operation_id: str,
        changes: Mapping[str, object],
        *,
        expect_status: Sequence[str],
        audit_kind: str | None,
        at: float,
        note: str | None = None,
    ) -> OperationRecord | None:
        """Guarded update: applies only while the status is one of `expect_status`."""
        marks = ", ".join("?" for _ in expect_status)
        async with self.write() as conn:
            if not await _guarded_update(
                conn, operation_id, changes, at=at, guard=f"status IN ({marks})", guard_params=expect_status
            ):
                return None
            record = await self._must_fetch(operation_id)
            if audit_kind is not None:
                await self._audit(
                    record, at, audit_kind, decision_payload(record, kind=audit_kind, outcome=None, note=note)
                )
        return record

    # -- submission ---------------------------------------------------------------

    async def claim_submission(
        self,
        operation_id: str,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        allow_stale: bool,
        note: str,
    ) -> OperationRecord | None:
        """Take the submission lease before the submit request is sent (None: not free).

        The lease stays on the record until `finish_submission` clears it, so a
        lease found later without an outcome means a call stopped mid-submission.
        An expired lease is taken over only with `allow_stale` (the provider has
        idempotency, so sending again cannot create a second job).
        """
        params: list[object] = [owner, now + lease_seconds, now, operation_id]
        free = "lease_owner IS NULL"
        if allow_stale:
            free = "(lease_owner IS NULL OR lease_expires_at <= ?)"
            params.append(now)
        async with self.write() as conn:
            cur = await conn.execute(
                "UPDATE operations SET lease_owner = ?, lease_expires_at = ?, version = version + 1, "
                f"updated_at = ? WHERE operation_id = ? AND status = 'submitting' AND {free}",
                params,
            )
            if cur.rowcount != 1:
                return None
            record = await self._must_fetch(operation_id)
            payload = decision_payload(record, kind="submit_sending", outcome=None, note=note)
            await self._audit(record, now, "submit_sending", payload)
        return record

    async def finish_submission(
        self,
        operation_id: str,
        *,
        owner: str,
        changes: Mapping[str, object],
        kind: str,
        at: float,
        note: str | None,
        payload_extra: Mapping[str, object] | None = None,
    ) -> OperationRecord | None:
        """Record what one submit request led to and release the lease (None: the lease was lost)."""
        async with self.write() as conn:
            released = {**changes, "lease_owner": None, "lease_expires_at": None}
            if not await _guarded_update(
                conn,
                operation_id,
                released,
                at=at,
                guard="status = 'submitting' AND lease_owner = ?",
                guard_params=(owner,),
            ):
                return None
            record = await self._must_fetch(operation_id)
            payload = decision_payload(record, kind=kind, outcome=None, note=note)
            payload.update(payload_extra or {})
            await self._audit(record, at, kind, payload)
        return record

    # -- the check procedure ---------------------------------------------------

    async def note_refusal(self, operation_id: str, at: float) -> OperationRecord:
        """Count one refused call (not_yet or stopped); summarise every `REFUSALS_PER_SUMMARY`."""
        async with self.write() as conn:
            await conn.execute(
                "UPDATE operations SET not_yet_count = not_yet_count + 1, "
                "not_yet_first_at = COALESCE(not_yet_first_at, ?), not_yet_last_at = ? "
                "WHERE operation_id = ?",
                (at, at, operation_id),
            )
            record = await self._must_fetch(operation_id)
            if record.not_yet_count >= REFUSALS_PER_SUMMARY:
                record = await self._flush_refusals(record)
        return record

    async def reserve(
        self,
        operation_id: str,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        fleet: FleetSpec | None = None,
        clock: Callable[[], float] | None = None,
    ) -> Reservation:
        """Count one status request and take the lease, atomically.

        The guard re-checks every precondition (waiting, before the deadline, not
        too early, budget left, lease free) so a racing process cannot slip in.
        With `fleet`, the provider's shared pace is taken in the same
        transaction: a request over the pace is booked the next free slot
        instead (nothing counted). The record returned is reloaded. With
        `clock`, the time of every check is read once the write lock is held,
        not `now` from before waiting for it: the pace is taken when the
        request really leaves.
        """
        async with self.write() as conn:
            if clock is not None:
                now = clock()
            current = await self._must_fetch(operation_id)
            # A booked slot is used without pacing again, unless it was left unused past its grace.
            held = (
                fleet is not None
                and current.fleet_slot_at is not None
                and slot_still_held(current.fleet_slot_at, now=now, rate=fleet.max_requests_per_second)
            )
            if fleet is not None and _may_reserve(current, now) and not held:
                async with conn.execute(
                    "SELECT tat FROM fleet_buckets WHERE provider = ?", (current.provider,)
                ) as cur:
                    row = await cur.fetchone()
                step = pace(
                    None if row is None else float(row[0]),
                    now=now,
                    rate=fleet.max_requests_per_second,
                    burst=fleet.burst,
                )
                await conn.execute(
                    "INSERT INTO fleet_buckets (provider, tat) VALUES (?, ?) "
                    "ON CONFLICT(provider) DO UPDATE SET tat = excluded.tat",
                    (current.provider, step.next_tat),
                )
                if not step.admitted:
                    await conn.execute(
                        "UPDATE operations SET fleet_slot_at = ?, next_check_at = ?, delay_source = 'fleet_pacing', "
                        "version = version + 1, updated_at = ? WHERE operation_id = ?",
                        (step.slot_at, step.slot_at, now, operation_id),
                    )
                    return Reservation(await self._must_fetch(operation_id), reserved=False, paced=True)
            cur = await conn.execute(
                "UPDATE operations SET status_requests_used = status_requests_used + 1, fleet_slot_at = NULL, "
                "lease_owner = ?, lease_expires_at = ?, version = version + 1, updated_at = ? "
                "WHERE operation_id = ? AND status = 'waiting' "
                "AND ? < deadline_at AND (business_deadline_at IS NULL OR ? < business_deadline_at) "
                "AND ? >= next_check_at AND status_requests_used < max_status_requests "
                "AND (lease_owner IS NULL OR lease_expires_at <= ?)",
                (owner, now + lease_seconds, now, operation_id, now, now, now, now),
            )
            if cur.rowcount == 1 and current.lease_owner is not None:
                await self._audit_lease_recovery(current, now)
            record = await self._must_fetch(operation_id)
            return Reservation(record, reserved=cur.rowcount == 1, paced=False)

    async def _audit_lease_recovery(self, before: OperationRecord, at: float) -> None:
        """Make a check that never finished (its process died, say) visible when its expired lease is taken."""
        note = (
            f"the check holding status request {before.status_requests_used} did not finish within its lease "
            f"(expired {iso(before.lease_expires_at)}; its process may have stopped). That request stays "
            "counted: it may have reached the provider. It is never re-sent"
        )
        await self._flush_refusals(before)  # keep the story in order: refusals while it was held come first
        payload = decision_payload(before, kind="lease_recovered", outcome=None, note=note)
        await self._audit(before, at, "lease_recovered", payload)

    async def apply_answer(
        self,
        operation_id: str,
        *,
        owner: str,
        changes: Mapping[str, object],
        at: float,
        payload_extra: Mapping[str, object],
    ) -> tuple[OperationRecord, bool]:
        """Persist what one status answer meant and release the lease; (record, applied).

        Applied only while this caller still holds the lease: an answer that
        arrives after the lease was lost and taken over is audited, not applied.
        """
        async with self.write() as conn:
            before = await self._must_fetch(operation_id)
            if before.lease_owner != owner:
                payload = decision_payload(before, kind="late_answer_ignored", outcome="polled")
                payload.update(payload_extra)
                await self._audit(before, at, "late_answer_ignored", payload)
                return before, False
            before = await self._flush_refusals(before)
            released = {**changes, "lease_owner": None, "lease_expires_at": None}
            await _guarded_update(
                conn, operation_id, released, at=at, guard="lease_owner = ?", guard_params=(owner,)
            )
            record = await self._must_fetch(operation_id)
            payload = decision_payload(record, kind="polled", outcome="polled")
            payload.update(payload_extra)
            await self._audit(record, at, "polled", payload)
        return record, True

    async def stop_without_request(
        self, operation_id: str, *, reason: str, detail: str, status: str, at: float
    ) -> OperationRecord | None:
        """Stop a waiting operation (deadline passed, budget used) when no request is in flight."""
        async with self.write() as conn:
            before = await self._must_fetch(operation_id)
            cur = await conn.execute(
                "UPDATE operations SET status = ?, stop_reason = ?, stop_detail = ?, stopped_at = ?, "
                "lease_owner = NULL, lease_expires_at = NULL, version = version + 1, updated_at = ? "
                "WHERE operation_id = ? AND status = 'waiting' "
                "AND (lease_owner IS NULL OR lease_expires_at <= ?)",
                (status, reason, detail, at, at, operation_id, at),
            )
            if cur.rowcount != 1:
                return None
            if before.lease_owner is not None:
                await self._audit_lease_recovery(before, at)
            record = await self._flush_refusals(await self._must_fetch(operation_id))
            await self._audit(
                record, at, "stopped", decision_payload(record, kind="stopped", outcome="stopped")
            )
        return record

    # -- approvals --------------------------------------------------------------

    async def _fetch_approval(self, approval_id: str) -> ApprovalRecord | None:
        async with self.conn.execute(
            f"SELECT {', '.join(_APPROVAL_COLUMNS)} FROM approvals WHERE approval_id = ?", (approval_id,)
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else ApprovalRecord(*tuple(row))

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        """One approval by id."""
        return await self._guard(lambda: self._fetch_approval(approval_id))

    async def list_approvals(
        self, *, status: str | None = None, operation_id: str | None = None
    ) -> list[ApprovalRecord]:
        """Approvals, newest first."""

        async def work() -> list[ApprovalRecord]:
            sql = f"SELECT {', '.join(_APPROVAL_COLUMNS)} FROM approvals"
            clauses: list[str] = []
            params: list[Any] = []
            if status is not None:
                clauses.append("status = ?")
                params.append(status)
            if operation_id is not None:
                clauses.append("operation_id = ?")
                params.append(operation_id)
            if clauses:
                sql += " WHERE " + " AND ".join(clauses)
            sql += " ORDER BY asked_at DESC"
            async with self.conn.execute(sql, params) as cur:
                rows = await cur.fetchall()
            return [ApprovalRecord(*tuple(r)) for r in rows]

        return await self._guard(work)

    async def open_approval(
        self,
        *,
        approval_id: str,
        record: OperationRecord,
        kind: str,
        request: Mapping[str, object],
        at: float,
        ttl_seconds: float,
    ) -> ApprovalRecord:
        """Record a question for a person, bound to the operation as it is now.

        Idempotent: the same operation version and the same request return the
        pending approval already recorded (so a repeated question is not a new one).
        """
        request_json = json.dumps(request, sort_keys=True)
        async with self.write() as conn:
            async with conn.execute(
                f"SELECT {', '.join(_APPROVAL_COLUMNS)} FROM approvals WHERE operation_id = ? "
                "AND kind = ? AND bound_version = ? AND request_json = ? AND status = 'pending' "
                "AND expires_at > ?",
                (record.operation_id, kind, record.version, request_json, at),
            ) as cur:
                row = await cur.fetchone()
            if row is not None:
                return ApprovalRecord(*tuple(row))
            await conn.execute(
                "INSERT INTO approvals (approval_id, operation_id, kind, status, request_json, "
                "bound_version, asked_at, expires_at) VALUES (?, ?, ?, 'pending', ?, ?, ?, ?)",
                (approval_id, record.operation_id, kind, request_json, record.version, at, at + ttl_seconds),
            )
            payload = decision_payload(record, kind="approval_pending", outcome=None, note=approval_id)
            payload["request"] = dict(request)
            await self._audit(record, at, "approval_pending", payload)
            approval = await self._fetch_approval(approval_id)
            assert approval is not None
            return approval

    async def decide_approval(
        self, approval_id: str, *, approve: bool, by: str, at: float
    ) -> ApprovalRecord | None:
        """A person's answer to a pending approval (pending → approved/denied; expired when late)."""
        async with self.write() as conn:
            approval = await self._fetch_approval(approval_id)
            if approval is None or approval.status != "pending":
                return approval
            current = await self._must_fetch(approval.operation_id)
            if at >= approval.expires_at:
                new_status = "expired"
            elif approve and current.version != approval.bound_version:
                new_status = "void"  # the operation changed since the person was asked
            else:
                new_status = "approved" if approve else "denied"
            await conn.execute(
                "UPDATE approvals SET status = ?, decided_at = ?, decided_by = ? "
                "WHERE approval_id = ? AND status = 'pending'",
                (new_status, at, by, approval_id),
            )
            record = await self._must_fetch(approval.operation_id)
            kind = {
                "approved": "approval_granted",
                "denied": f"{approval.kind}_denied",
                "expired": "approval_expired",
                "void": "approval_void",
            }[new_status]
            await self._audit(
                record,
                at,
                kind,
                decision_payload(record, kind=kind, outcome=None, note=f"{approval_id} by {by}"),
            )
            return await self._fetch_approval(approval_id)

    async def close_approval(self, approval_id: str, *, status: str, at: float, note: str) -> None:
        """Mark an approval applied, void or expired."""
        async with self.write() as conn:
            await conn.execute(
                "UPDATE approvals SET status = ?, note = ?, decided_at = COALESCE(decided_at, ?) "
                "WHERE approval_id = ?",
                (status, note, at, approval_id),
            )

    async def apply_extension(
        self,
        operation_id: str,
        *,
        bound_version: int,
        changes: Mapping[str, object],
        at: float,
        approval_id: str | None,
        payload_extra: Mapping[str, object],
    ) -> OperationRecord | None:
        """Grant a new authorization, only if the operation is still as it was when asked."""
        async with self.write() as conn:
            if not await _guarded_update(
                conn,
                operation_id,
                changes,
                at=at,
                guard="version = ? AND status = 'escalated'",
                guard_params=(bound_version,),
                also="extensions_used = extensions_used + 1, ",
            ):
                return None
            if approval_id is not None:
                await conn.execute(
                    "UPDATE approvals SET status = 'applied', note = 'applied' WHERE approval_id = ?",
                    (approval_id,),
                )
            record = await self._must_fetch(operation_id)
            payload = decision_payload(record, kind="extension_approved", outcome=None, note=approval_id)
            payload.update(payload_extra)
            await self._audit(record, at, "extension_approved", payload)
        return record

    async def audit_event(
        self, operation_id: str, *, kind: str, at: float, note: str | None, extra: Mapping[str, object]
    ) -> None:
        """Append one audit row about an operation (follow-ups, refusals that matter)."""
        async with self.write():
            record = await self._must_fetch(operation_id)
            payload = decision_payload(record, kind=kind, outcome=None, note=note)
            payload.update(extra)
            await self._audit(record, at, kind, payload)

    # -- follow-up operations ---------------------------------------------------------

    async def record_followup(
        self,
        *,
        followup_id: str,
        operation_id: str,
        kind: str,
        status: str,
        at: float,
        approval_id: str | None = None,
        http_status: int | None = None,
        answer: str | None = None,
        note: str | None = None,
        operation_changes: Mapping[str, object] | None = None,
        expect_version: int | None = None,
    ) -> FollowupRecord | None:
        """Record one follow-up and its audit row; optionally change the operation in the same transaction.

        With `operation_changes`, the operation is updated only if its version is
        still `expect_version`; otherwise nothing is written and None is returned.
        """
        async with self.write() as conn:
            if operation_changes and not await _guarded_update(
                conn,
                operation_id,
                operation_changes,
                at=at,
                guard="version = ?",
                guard_params=(expect_version,),
            ):
                return None
            await conn.execute(
                "INSERT INTO followups (followup_id, operation_id, kind, status, approval_id, requested_at, "
                "finished_at, http_status, answer, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (followup_id, operation_id, kind, status, approval_id, at, at, http_status, answer, note),
            )
            if approval_id is not None:
                await conn.execute(
                    "UPDATE approvals SET status = 'applied', note = ? WHERE approval_id = ? AND status = 'approved'",
                    (f"used by {followup_id}", approval_id),
                )
            record = await self._must_fetch(operation_id)
            payload = decision_payload(record, kind=f"{kind}_{status}", outcome=None, note=note)
            payload.update(followup_id=followup_id, http_status=http_status, approval_id=approval_id)
            await self._audit(record, at, f"{kind}_{status}", payload)
        return FollowupRecord(
            followup_id, operation_id, kind, status, approval_id, at, at, http_status, answer, note
        )

    async def list_followups(self, operation_id: str) -> list[FollowupRecord]:
        """The follow-ups of one operation, oldest first."""

        async def work() -> list[FollowupRecord]:
            async with self.conn.execute(
                "SELECT followup_id, operation_id, kind, status, approval_id, requested_at, finished_at, "
                "http_status, answer, note FROM followups WHERE operation_id = ? ORDER BY requested_at, rowid",
                (operation_id,),
            ) as cur:
                rows = await cur.fetchall()
            return [FollowupRecord(*tuple(r)) for r in rows]

        return await self._guard(work)


async def _guarded_update(
    conn: aiosqlite.Connection,
    operation_id: str,
    changes: Mapping[str, object],
    *,
    at: float,
    guard: str,
    guard_params: Sequence[object],
    also: str = "",
) -> bool:
    """Update one operation's columns (bumping its version) only where `guard` holds; True when applied."""
    sets = "".join(f"{column} = ?, " for column in changes)
    cur = await conn.execute(
        f"UPDATE operations SET {sets}{also}version = version + 1, updated_at = ? "
        f"WHERE operation_id = ? AND {guard}",
        [*changes.values(), at, operation_id, *guard_params],
    )
    return cur.rowcount == 1


def decision_payload(
    record: OperationRecord, *, kind: str, outcome: str | None, note: str | None = None
) -> dict[str, object]:
    """The audit payload: every decision field, null where it does not apply."""
    return {
        "decision": kind,
        "outcome": outcome,
        "status": "escalated" if record.status == "escalated" else record.status,
        "state": record.state,
        "category": record.category,
        "stop_reason": record.stop_reason,
        "stop_detail": record.stop_detail,
        "next_check_at": iso(record.next_check_at) if record.status == "waiting" else None,
        "delay_source": record.delay_source if record.status == "waiting" else None,
        "retry_after_seconds": record.retry_after_seconds,
        "status_requests_used": record.status_requests_used,
        "max_status_requests": record.max_status_requests,
        "transport_failures_used": record.transport_failures_used,
        "max_transport_failures": record.max_transport_failures,
        "rate_limited_used": record.rate_limited_used,
        "deadline_at": iso(record.deadline_at),
        "business_deadline_at": iso(record.business_deadline_at),
        "http_status": record.last_http_status,
        "provider_request_id": record.provider_request_id,
        "provider_job_id": record.provider_job_id,
        "rejected_hints": [],
        "note": note,
    }


async def _migrate(conn: aiosqlite.Connection) -> None:
    await conn.execute("BEGIN IMMEDIATE")
    try:
        async with conn.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        current = int(row[0]) if row else 0
        for number, script in enumerate(_MIGRATIONS[current:], start=current + 1):
            for statement in _split_sql(script):
                await conn.execute(statement)
            await conn.execute(f"PRAGMA user_version = {number}")
        await conn.execute("COMMIT")
    except BaseException:
        await conn.execute("ROLLBACK")
        raise


def _split_sql(script: str) -> list[str]:
    # executescript would COMMIT our transaction; run statements one by one instead.
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        stripped = line.split("--", 1)[0] if "--" in line else line
        buffer += stripped
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements


@asynccontextmanager
async def open_store(path: Path, *, audit_key: bytes | None = None) -> AsyncGenerator[Store]:
    """Open (creating and migrating) the database at `path`."""
    if not path.parent.exists():
        raise StoreError(
            f"the directory {path.parent} for the database does not exist; create it, or point --db / "
            "POLLWARDEN_DB at a writable location"
        )
    busy_timeout = busy_timeout_seconds()
    try:
        conn = await aiosqlite.connect(str(path), isolation_level=None, timeout=busy_timeout)
    except sqlite3.Error as exc:
        raise _describe(exc, path) from exc
    try:
        try:
            await conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            async with conn.execute("PRAGMA journal_mode = WAL") as cur:
                await cur.fetchone()
            # FULL: the reservation must be on disk before the request leaves.
            await conn.execute("PRAGMA synchronous = FULL")
            await conn.execute("PRAGMA foreign_keys = ON")
            await _migrate(conn)
        except sqlite3.Error as exc:
            raise _describe(exc, path) from exc
        yield Store(conn, path, audit_key)
    finally:
        await conn.close()
