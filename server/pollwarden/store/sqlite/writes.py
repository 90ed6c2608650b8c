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
from typing import Any

from pollwarden.audit_entry import event
from pollwarden.job_identity import account_parts, duplicate_changes
from pollwarden.records import ApprovalRecord, FollowupRecord, OperationRecord
from pollwarden.store.sqlite import queries, rows
from pollwarden.store.sqlite.connection import Session
from pollwarden.vocabulary import (
    APPROVAL_CLOSABLE_FROM,
    ApprovalKind,
    ApprovalStatus,
    FollowupKind,
    FollowupStatus,
)


def create_operation(
    session: Session, values: Mapping[str, object], *, kind: str, at: float, key: bytes | None
) -> tuple[OperationRecord, bool]:
    """Insert the record and its first audit row unless the id or the job exists; (record, created).

    When the id exists, that operation is returned. When the job (provider,
    account context, provider job id) is another operation's, or the submission's
    payload (its request fingerprint) is still in flight under another, that
    operation is returned: its `operation_id` differs from the one asked for, and
    nothing is created (pollwarden.job_identity). The first audit row names the account
    context's origin and credential variable.
    """
    values = queries.new_operation_values(values)
    with session.transaction() as conn:
        # BEGIN IMMEDIATE: the id and the job are looked up and the row inserted under the write lock,
        # so two processes starting one job at once get one operation (the unique index is the backstop).
        same_id = rows.fetch(conn, str(values["operation_id"]))
        if same_id is not None:
            return same_id.record, False
        if values["provider_job_id"] is not None:
            owner = _job_owner(
                conn,
                values["provider"],
                values["account_context"],
                values["provider_job_id"],
                values["owner"],
            )
            if owner is not None:
                return owner, False
        if values["submit_payload_json"] is not None:
            params = {"request_fingerprint": values["request_fingerprint"], "owner": values["owner"]}
            in_flight = rows.returned(conn.execute(queries.SELECT_PAYLOAD_IN_FLIGHT, params))
            if in_flight is not None:
                return in_flight.record, False
        created = rows.returned(conn.execute(queries.INSERT_OPERATION, dict(values)))
        if created is None:
            return rows.must_fetch(conn, str(values["operation_id"])).record, False
        origin, credential_env = account_parts(created.record.account_context)
        first = {
            "account_origin": origin,
            "account_credential_env": credential_env,
            "expected_terminal_state": created.record.expected_terminal_state,
        }
        rows.append(conn, event(created.record, kind, at, extra=first), key)
        return created.record, True


def _job_owner(
    conn: sqlite3.Connection, provider: object, account: object, job_id: object, principal: object
) -> OperationRecord | None:
    """The operation holding this job for `principal` (one job, one budget), or None."""
    params = {"provider": provider, "account_context": account, "provider_job_id": job_id, "owner": principal}
    row = conn.execute(queries.SELECT_JOB_OWNER, params).fetchone()
    return None if row is None else rows.stored(row).record


# What a submission answer that named another operation's job still records about itself.
_SUBMIT_ANSWER_FACTS = frozenset({"last_http_status", "last_http_at", "provider_request_id"})


def claim_submission(
    session: Session,
    operation_id: str,
    *,
    owner: str,
    now: float,
    lease_seconds: float,
    allow_stale: bool,
    note: str,
    key: bytes | None,
) -> OperationRecord | None:
    """Take the submission lease before the submit request is sent (None: not free)."""
    sql = queries.CLAIM_SUBMISSION_TAKING_OVER if allow_stale else queries.CLAIM_SUBMISSION
    params = {
        "owner": owner,
        "lease_expires_at": now + lease_seconds,
        "now": now,
        "operation_id": operation_id,
    }
    with session.transaction() as conn:
        rows.flush_refusals(conn, operation_id, key)
        claimed = rows.returned(conn.execute(sql, params))
        if claimed is None:
            return None
        rows.append(conn, event(claimed.record, "submit_sending", now, note=note), key)
        return claimed.record


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
    """Record what a submission led to (None: the guard did not hold).

    With `owner`, only while that call holds the submission lease, which is
    released; without one, only while the operation is still submitting (a
    stop decided with nothing in flight), and a stale lease is cleared too.
    """
    released: dict[str, object] = {**changes, "lease_owner": None, "lease_expires_at": None}
    with session.transaction() as conn:
        rows.flush_refusals(conn, operation_id, key)
        job_id = changes.get("provider_job_id")
        if job_id is not None:
            # The provider named a job another operation holds: this submission adopts nothing.
            current = rows.must_fetch(conn, operation_id).record
            holder = _job_owner(conn, current.provider, current.account_context, job_id, current.owner)
            if holder is not None and holder.operation_id != operation_id:
                kept = {k: v for k, v in changes.items() if k in _SUBMIT_ANSWER_FACTS}
                other = holder.owner != current.owner
                released = {
                    **kept,
                    **duplicate_changes(holder.operation_id, str(job_id), at=at, another_principal=other),
                }
                released["provider_job_id"] = job_id
                kind, note = "stopped", str(released["stop_detail"])
        if owner is not None:
            record = rows.update_operation(
                conn, operation_id, released, queries.Guard.SUBMISSION_LEASE_HELD, at=at, guard_owner=owner
            )
        else:
            record = rows.update_operation(conn, operation_id, released, queries.Guard.SUBMITTING, at=at)
        if record is None:
            return None
        rows.append(conn, event(record, kind, at, note=note, extra=payload_extra), key)
        return record


def apply_extension(
    session: Session,
    operation_id: str,
    *,
    bound_version: int,
    changes: Mapping[str, object],
    at: float,
    approval_id: str | None,
    payload_extra: Mapping[str, object],
    key: bytes | None,
) -> OperationRecord | None:
    """Grant a new authorization, only if the operation is still as it was when the person was asked."""
    with session.transaction() as conn:
        rows.flush_refusals(conn, operation_id, key)
        record = rows.update_operation(
            conn,
            operation_id,
            changes,
            queries.Guard.ESCALATED_AS_ASKED,
            at=at,
            guard_version=bound_version,
        )
        if record is None:
            return None
        if approval_id is not None:
            conn.execute(queries.MARK_APPROVAL_APPLIED, (approval_id,))
        rows.append(conn, event(record, "extension_approved", at, note=approval_id, extra=payload_extra), key)
        return record


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
        existing = conn.execute(
            queries.FIND_PENDING_APPROVAL, (record.operation_id, kind, record.version, request_json, at)
        ).fetchone()
        if existing is not None:
            return ApprovalRecord.from_row(existing)
        row = conn.execute(
            queries.INSERT_APPROVAL,
            (approval_id, record.operation_id, kind, request_json, record.version, at, at + ttl_seconds),
        ).fetchone()
        rows.flush_refusals(conn, record.operation_id, key)
        rows.append(
            conn,
            event(
                record,
                "approval_pending",
                at,
                note=approval_id,
                extra={"request": dict(request), "approval_kind": str(kind)},
            ),
            key,
        )
        return ApprovalRecord.from_row(row)


_DECIDED_KIND = {
    ApprovalStatus.APPROVED: "approval_granted",
    ApprovalStatus.EXPIRED: "approval_expired",
    ApprovalStatus.VOID: "approval_void",
}


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
        row = conn.execute(queries.SELECT_APPROVAL, (approval_id,)).fetchone()
        approval = None if row is None else ApprovalRecord.from_row(row)
        if approval is None or approval.status != ApprovalStatus.PENDING:
            return approval
        current = rows.must_fetch(conn, approval.operation_id).record
        if at >= approval.expires_at:
            status = ApprovalStatus.EXPIRED
        elif approve and current.version != approval.bound_version:
            status = ApprovalStatus.VOID  # the operation changed since the person was asked
        else:
            status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
        decided = ApprovalRecord.from_row(
            conn.execute(queries.DECIDE_APPROVAL, (status, at, by, method, signature, approval_id)).fetchone()
        )
        kind = _DECIDED_KIND.get(status, f"{approval.kind}_denied")
        rows.flush_refusals(conn, approval.operation_id, key)
        authenticated = {"authenticated_by": method}
        rows.append(conn, event(current, kind, at, note=f"{approval_id} by {by}", extra=authenticated), key)
        return decided


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
        row = conn.execute(queries.CLOSE_APPROVAL, (status, note, at, approval_id, allowed)).fetchone()
        if row is None:
            return None
        approval = ApprovalRecord.from_row(row)
        if audit_kind is not None:
            rows.flush_refusals(conn, approval.operation_id, key)
            record = rows.must_fetch(conn, approval.operation_id).record
            rows.append(conn, event(record, audit_kind, at, note=approval_id), key)
        return approval


def record_followup(
    session: Session,
    *,
    followup_id: str,
    operation_id: str,
    kind: FollowupKind,
    status: FollowupStatus,
    at: float,
    approval_id: str | None,
    http_status: int | None,
    answer: str | None,
    note: str | None,
    operation_changes: Mapping[str, object] | None,
    expect_version: int | None,
    key: bytes | None,
) -> FollowupRecord | None:
    """Record one follow-up and its audit row; optionally change the operation in the same transaction.

    With `operation_changes`, the operation is updated only if its version is
    still `expect_version`; otherwise nothing is written and None is returned.
    """
    with session.transaction() as conn:
        rows.flush_refusals(conn, operation_id, key)
        if operation_changes:
            record = rows.update_operation(
                conn,
                operation_id,
                operation_changes,
                queries.Guard.UNCHANGED,
                at=at,
                guard_version=expect_version,
            )
            if record is None:
                return None
        else:
            record = rows.must_fetch(conn, operation_id).record
        followup = FollowupRecord.from_row(
            conn.execute(
                queries.INSERT_FOLLOWUP,
                (followup_id, operation_id, kind, status, approval_id, at, at, http_status, answer, note),
            ).fetchone()
        )
        if approval_id is not None:
            conn.execute(queries.MARK_APPROVAL_USED, (f"used by {followup_id}", approval_id))
        audit_kind = f"{kind}_{status}"
        extra: dict[str, Any] = {
            "followup_id": followup_id,
            "http_status": http_status,
            "approval_id": approval_id,
        }
        rows.append(conn, event(record, audit_kind, at, note=note, extra=extra), key)
        return followup


def audit_event(
    session: Session,
    operation_id: str,
    *,
    kind: str,
    at: float,
    note: str | None,
    extra: Mapping[str, object],
    key: bytes | None,
) -> None:
    """Append one audit row about an operation (follow-ups, answers that matter)."""
    with session.transaction() as conn:
        rows.flush_refusals(conn, operation_id, key)
        record = rows.must_fetch(conn, operation_id).record
        rows.append(conn, event(record, kind, at, note=note, extra=extra), key)


def flush_refusals(session: Session, operation_id: str | None, key: bytes | None) -> int:
    """Write the pending summaries of refused calls (one operation's, or every one's); how many.

    Looks first without a transaction, so reading the story of a quiet (or
    read-only) database writes nothing.
    """
    conn = session.conn
    if operation_id is None:
        if conn.execute(queries.ANY_PENDING_REFUSALS).fetchone() is None:
            return 0
        with session.transaction():
            return rows.flush_all_refusals(conn, key)
    if conn.execute(queries.ANY_PENDING_REFUSALS_OF, (operation_id,)).fetchone() is None:
        return 0
    with session.transaction():
        rows.flush_refusals(conn, operation_id, key)
        return 1


def reopen(
    session: Session,
    operation_id: str,
    *,
    bound_version: int,
    next_check_at: float,
    at: float,
    extra: Mapping[str, object],
    key: bytes | None,
) -> OperationRecord | None:
    """An operator's reopen: back to waiting, same budget and deadline, only as it was shown (None: it changed)."""
    with session.transaction() as conn:
        rows.flush_refusals(conn, operation_id, key)
        params = {
            "operation_id": operation_id,
            "version": bound_version,
            "next_check_at": next_check_at,
            "at": at,
        }
        reopened = rows.returned(conn.execute(queries.REOPEN, params))
        if reopened is None:
            return None
        rows.append(
            conn, event(reopened.record, "reopened", at, note=str(extra.get("reason")), extra=extra), key
        )
        return reopened.record
