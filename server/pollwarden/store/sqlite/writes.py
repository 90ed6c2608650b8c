"""Every other store operation as one transaction: create, submit, extend, approve, follow up, audit.

Each function runs whole in one hop to the database thread, writes with a
guard in SQL and takes the row it wrote from `RETURNING`. Any that changes an
operation or adds to its story first writes the pending summary of refused
calls, so the story stays in time order.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from pollwarden.core.records import ApprovalRecord, OperationRecord
from pollwarden.core.vocabulary import (
    APPROVAL_CLOSABLE_FROM,
    ApprovalKind,
    ApprovalStatus,
)
from pollwarden.store import plans, statements
from pollwarden.store.rows import new_operation_values
from pollwarden.store.sqlite import executor, sql
from pollwarden.store.sqlite.connection import Session


def create_operation(
    session: Session, values: Mapping[str, object], *, kind: str, at: float, key: bytes | None
) -> tuple[OperationRecord, bool]:
    """Insert the record and its first audit row unless the id or the job exists; (record, created).

    When the id exists, that operation is returned. When the job (provider,
    account context, provider job id) is another operation's, or the submission's
    payload (its request fingerprint) is still in flight under another, that
    operation is returned: its `operation_id` differs from the one asked for, and
    nothing is created (pollwarden.rules.job_identity). The first audit row names the account
    context's origin and credential variable.
    """
    values = new_operation_values(values)
    with session.transaction() as conn:
        # BEGIN IMMEDIATE: the id and the job are looked up and the row inserted under the write lock,
        # so two processes starting one job at once get one operation (the unique index is the backstop).
        same_id = executor.fetch(conn, str(values["operation_id"]))
        if same_id is not None:
            return same_id.record, False
        if values["provider_job_id"] is not None:
            owner = _job_owner(
                conn,
                values["provider"],
                values["account_context"],
                values["provider_job_id"],
            )
            if owner is not None:
                return owner, False
        if values["submit_payload_json"] is not None:
            params = {"request_fingerprint": values["request_fingerprint"], "owner": values["owner"]}
            in_flight = executor.returned(conn.execute(statements.SELECT_PAYLOAD_IN_FLIGHT, params))
            if in_flight is not None:
                return in_flight.record, False
        created = executor.returned(conn.execute(sql.INSERT_OPERATION, dict(values)))
        if created is None:
            return executor.must_fetch(conn, str(values["operation_id"])).record, False
        executor.append(conn, plans.opening_event(created.record, kind, at), key)
        return created.record, True


def _job_owner(
    conn: sqlite3.Connection, provider: object, account: object, job_id: object
) -> OperationRecord | None:
    """The operation holding this job, whichever principal started it (one job, one budget), or None."""
    params = {"provider": provider, "account_context": account, "provider_job_id": job_id}
    row = conn.execute(statements.SELECT_JOB_OWNER, params).fetchone()
    return None if row is None else executor.stored(row).record


def finish_submission(
    session: Session,
    operation_id: str,
    *,
    owner: str | None,
    changes: Mapping[str, object],
    kind: str,
    at: float,
    note: str | None,
    payload_extra: Mapping[str, object] | None,
    key: bytes | None,
) -> OperationRecord | None:
    """Record what a submission led to (None: the guard did not hold; `plans.finish_plan`)."""
    with session.transaction() as conn:
        current = executor.must_fetch(conn, operation_id)
        record = current.record
        job_id = changes.get("provider_job_id")
        holder = None
        if job_id is not None:
            holder = _job_owner(conn, record.provider, record.account_context, job_id)
        plan = plans.finish_plan(
            record,
            owner=owner,
            changes=changes,
            kind=kind,
            at=at,
            note=note,
            payload_extra=payload_extra,
            job_holder=holder,
        )
        record = executor.carry_out(conn, current, plan, key)
        return record if plan.applied else None


def open_approval(
    session: Session,
    *,
    approval_id: str,
    record: OperationRecord,
    kind: ApprovalKind,
    request: Mapping[str, object],
    at: float,
    ttl_seconds: float,
    key: bytes | None,
) -> ApprovalRecord:
    """Record a question for a person, bound to the operation as it is now.

    Idempotent: the same operation version and the same request return the
    pending approval already recorded (so a repeated question is not a new one).
    """
    request_json = json.dumps(request, sort_keys=True)
    with session.transaction() as conn:
        params = {
            "approval_id": approval_id,
            "operation_id": record.operation_id,
            "kind": kind,
            "version": record.version,
            "request_json": request_json,
            "at": at,
            "expires_at": at + ttl_seconds,
        }
        existing = conn.execute(statements.FIND_PENDING_APPROVAL, params).fetchone()
        if existing is not None:
            return ApprovalRecord.from_row(existing)
        row = conn.execute(statements.INSERT_APPROVAL, params).fetchone()
        asked = plans.question_plan(record, approval_id=approval_id, kind=kind, request=request, at=at)
        executor.carry_out(conn, executor.must_fetch(conn, record.operation_id), asked, key)
        return ApprovalRecord.from_row(row)


def decide_approval(
    session: Session,
    approval_id: str,
    *,
    approve: bool,
    by: str,
    at: float,
    method: str,
    signature: str | None,
    key: bytes | None,
) -> ApprovalRecord | None:
    """A person's answer to a pending approval (pending → approved/denied; expired when late, void when stale).

    `method` says how the decision was authenticated; it is kept with its
    `signature` so the controller can check it again before applying it.
    """
    with session.transaction() as conn:
        row = conn.execute(statements.SELECT_APPROVAL, {"approval_id": approval_id}).fetchone()
        approval = None if row is None else ApprovalRecord.from_row(row)
        if approval is None or approval.status != ApprovalStatus.PENDING:
            return approval
        current = executor.must_fetch(conn, approval.operation_id)
        status, plan = plans.decision_plan(
            approval, current.record, approve=approve, by=by, at=at, method=method
        )
        decided = {"status": status, "at": at, "by": by, "method": method, "signature": signature}
        row = conn.execute(statements.DECIDE_APPROVAL, {**decided, "approval_id": approval_id}).fetchone()
        executor.carry_out(conn, current, plan, key)
        return ApprovalRecord.from_row(row)


def close_approval(
    session: Session,
    approval_id: str,
    *,
    status: ApprovalStatus,
    at: float,
    note: str,
    audit_kind: str | None,
    key: bytes | None,
) -> ApprovalRecord | None:
    """Mark an approval applied, void or expired; with `audit_kind`, tell it in the operation's story.

    None when it was no longer in a status it may be closed from (another call closed or decided it first).
    """
    with session.transaction() as conn:
        allowed = json.dumps(APPROVAL_CLOSABLE_FROM.get(status, ()))
        row = conn.execute(
            sql.CLOSE_APPROVAL,
            {"status": status, "note": note, "at": at, "approval_id": approval_id, "allowed": allowed},
        ).fetchone()
        if row is None:
            return None
        approval = ApprovalRecord.from_row(row)
        if audit_kind is not None:
            current = executor.must_fetch(conn, approval.operation_id)
            executor.carry_out(
                conn, current, plans.note_plan(current.record, audit_kind, at, note=approval_id), key
            )
        return approval


def flush_refusals(session: Session, operation_id: str | None, key: bytes | None) -> int:
    """Write the pending summaries of refused calls (one operation's, or every one's); how many.

    Looks first without a transaction, so reading the story of a quiet (or
    read-only) database writes nothing.
    """
    conn = session.conn
    if operation_id is None:
        if conn.execute(statements.ANY_PENDING_REFUSALS).fetchone() is None:
            return 0
        with session.transaction():
            return executor.flush_all_refusals(conn, key)
    if conn.execute(statements.ANY_PENDING_REFUSALS_OF, {"operation_id": operation_id}).fetchone() is None:
        return 0
    with session.transaction():
        executor.flush_refusals(conn, operation_id, key)
        return 1
