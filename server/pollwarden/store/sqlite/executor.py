"""The SQLite executor: flows and plans carried out inside a transaction the caller already opened.

Plain functions over a `sqlite3.Connection`, run in the database thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from datetime import datetime

from pollwarden.audit.entry import (
    NO_REFUSALS,
    REFUSALS_PER_SUMMARY,
    AuditEvent,
    ChainHead,
    ChainRow,
    PendingRefusals,
    chain_row,
    link,
    refusal_summary,
)
from pollwarden.core.errors import StoreError
from pollwarden.core.records import OperationRecord
from pollwarden.core.vocabulary import Outcome
from pollwarden.store import statements
from pollwarden.store.planned import T
from pollwarden.store.plans import Append, CountRefusal, Execute, Flush, HandSlot, Plan, Update
from pollwarden.store.rows import StoredOperation, stored, writable
from pollwarden.store.sqlite import sql
from pollwarden.store.transactions import AboutTheChain, CarryOut, Flow, Locked, Query, Queue, Request, drive


def fetch(conn: sqlite3.Connection, operation_id: str) -> StoredOperation | None:
    """The operation, or None."""
    row = conn.execute(statements.SELECT_OPERATION, {"operation_id": operation_id}).fetchone()
    return None if row is None else stored(row)


def must_fetch(conn: sqlite3.Connection, operation_id: str) -> StoredOperation:
    """The operation; rows are never deleted, so a missing one is a programming error."""
    found = fetch(conn, operation_id)
    if found is None:
        raise StoreError(f"operation {operation_id!r} vanished from the database")
    return found


class StaleRow(StoreError):
    """A plan's guarded write found the operation changed since it was read: nothing may be committed."""


def carry_out(
    conn: sqlite3.Connection,
    current: StoredOperation,
    plan: Plan,
    key: bytes | None,
    *,
    durable: bool = True,
    fresh: bool = True,
) -> OperationRecord:
    """Carry out `plan`, made from `current`, in the caller's open transaction; the record it leaves.

    `fresh`: `current` was read under this transaction's write lock (its refusal counters are exact);
    otherwise they are read again before a summary is written. Raises `StaleRow` when an `Update`'s
    version guard (or a count's) did not hold: the caller rolls the transaction back.
    """
    op_id = current.record.operation_id
    for write in plan.writes:
        if isinstance(write, Flush):
            if not fresh:
                flush_refusals(conn, op_id, key)
            elif current.refusals.count:
                _write_summary(conn, current, key)
                current = StoredOperation(current.record, NO_REFUSALS)
        elif isinstance(write, Update):
            params = {f"c_{column}": value for column, value in write.changes.items()}
            params.update(at=write.at, operation_id=op_id, version=current.record.version)
            if conn.execute(sql.update_operation(writable(tuple(write.changes))), params).fetchone() is None:
                raise StaleRow(f"operation {op_id!r} changed since it was read")
        elif isinstance(write, Append):
            append(conn, write.entry, key)
        elif isinstance(write, CountRefusal):
            if count_refusal(conn, current, write.outcome, write.at, key, durable=durable) is None:
                raise StaleRow(f"operation {op_id!r} changed since it was read")
        elif isinstance(write, Execute):
            conn.execute(write.statement, dict(write.params))
        elif isinstance(write, HandSlot):
            statement = sql.HAND_SLOT if write.after is None else sql.HAND_SLOT_AFTER
            if conn.execute(statement, write.params()).fetchone() is not None:
                conn.execute(sql.SET_FLEET_BOOKINGS, write.params())
        else:  # SetPace
            conn.execute(
                sql.UPSERT_FLEET_TAT,
                {"provider": write.provider, "tat": write.tat, "sent_tat": write.sent_tat},
            )
    return plan.record


def run_flow(
    conn: sqlite3.Connection,
    flow: Flow[T],
    operation_id: str | None,
    key: bytes | None,
    *,
    durable: bool = True,
    fresh: bool = True,
) -> T:
    """Run a flow of `pollwarden.store.planned` in the caller's open transaction (the write lock held:
    every row it reads stays as read, and the locks it asks for are held already); its result.

    `durable`, `fresh`: as `carry_out`'s (a check guarded by the version it read outside the lock)."""

    def answer(request: Request) -> object:
        if isinstance(request, Locked):
            assert operation_id is not None, "a flow read the locked row of a transaction that locks none"
            return must_fetch(conn, operation_id)
        if isinstance(request, Query):
            cursor = conn.execute(request.statement, dict(request.params))
            return cursor.fetchall() if request.every else cursor.fetchone()
        if isinstance(request, Queue):
            conn.execute(request.statement, dict(request.params)).fetchall()
        elif isinstance(request, CarryOut):
            return carry_out(conn, request.current, request.plan, key, durable=durable, fresh=fresh)
        elif isinstance(request, AboutTheChain):
            append(conn, request.entry, key)
        return None  # LockPayload, LockHead: the write lock serialises them already

    return drive(flow, answer)


def append(conn: sqlite3.Connection, entry: AuditEvent, key: bytes | None) -> int:
    """Append one decision to the chain (head read and insert in this transaction); its seq."""
    row = link(_head(conn), entry, key=key)
    _insert(conn, row)
    return row.position


def append_audit(
    conn: sqlite3.Connection,
    *,
    operation_id: str,
    at: datetime,
    kind: str,
    payload: Mapping[str, object],
    key: bytes | None,
) -> int:
    """Append one row to the chain inside the caller's open write transaction; return its seq.

    For tools and tests that build a chain without operations. Raises
    RuntimeError when no transaction is open (the head read and the insert
    must be atomic across processes, or the chain could fork), ValueError for
    a naive `at`, and `AuditKeyError` when the head is keyed and `key` is None.
    """
    if not conn.in_transaction:
        raise RuntimeError("append_audit must run inside an open write transaction (BEGIN IMMEDIATE)")
    row = chain_row(_head(conn), operation_id=operation_id, at=at, kind=kind, payload=payload, key=key)
    _insert(conn, row)
    return row.position


def _head(conn: sqlite3.Connection) -> ChainHead | None:
    head = conn.execute(sql.AUDIT_HEAD).fetchone()
    return None if head is None else ChainHead(int(head[0]), str(head[1]), bool(head[2]))


def _insert(conn: sqlite3.Connection, row: ChainRow) -> None:
    # A SQLite row's place in the chain is its seq: every row is a chain row.
    conn.execute(sql.INSERT_AUDIT_ROW, vars(row))


def flush_refusals(conn: sqlite3.Connection, operation_id: str, key: bytes | None) -> None:
    """Write the pending summary of refused calls (if any) and reset the counters.

    Called first by every transaction that changes the operation or appends to
    its story, so the summary lands before the decision that follows it.
    """
    row = conn.execute(sql.SELECT_PENDING_REFUSALS, {"operation_id": operation_id}).fetchone()
    if row is not None:
        _write_summary(conn, stored(row), key)


def _write_summary(conn: sqlite3.Connection, pending: StoredOperation, key: bytes | None) -> None:
    append(conn, refusal_summary(pending.record, pending.refusals), key)
    conn.execute(statements.RESET_REFUSALS, {"operation_id": pending.record.operation_id})


def count_refusal(
    conn: sqlite3.Connection,
    current: StoredOperation,
    outcome: Outcome,
    at: float,
    key: bytes | None,
    *,
    durable: bool,
) -> StoredOperation | None:
    """Count one refused call on the operation as `current` shows it; None when it changed since.

    A pending run of the other kind is written first, so each summary tells one
    kind; a run that reaches `REFUSALS_PER_SUMMARY` is written at once. Audit
    rows are only ever written durably: in a `durable=False` transaction a
    count that would write one gives None too (the caller decides again, durably).
    """
    if current.refusals.must_flush_before(outcome):
        if not durable:
            return None
        _write_summary(conn, current, key)
    counted = conn.execute(
        sql.COUNT_REFUSAL,
        {
            "outcome": outcome,
            "at": at,
            "operation_id": current.record.operation_id,
            "version": current.record.version,
        },
    ).fetchone()
    if counted is None:
        return None
    # The version guard held, so the record is as read: only the counters moved.
    count, _, first_at, last_at = counted
    after = StoredOperation(current.record, PendingRefusals(int(count), outcome, first_at, last_at))
    if after.refusals.count < REFUSALS_PER_SUMMARY:
        return after
    if not durable:
        return None
    _write_summary(conn, after, key)
    return StoredOperation(after.record, NO_REFUSALS)
