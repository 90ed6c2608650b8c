"""What people decide on PostgreSQL: approvals, extensions, reopening, follow-ups, audit rows.

Each is one transaction on the operation row locked first; the guarantee of each
is stated on it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from pollwarden.audit_entry import (
    event,
)
from pollwarden.job_identity import REOPENABLE
from pollwarden.records import (
    ApprovalRecord,
    FollowupRecord,
    OperationRecord,
)
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.base import PostgresBase
from pollwarden.store.postgres.writer import operation
from pollwarden.vocabulary import (
    APPROVAL_CLOSABLE_FROM,
    ApprovalKind,
    ApprovalStatus,
    DelaySource,
    FollowupKind,
    FollowupStatus,
    Status,
)

_DECIDED_KIND = {
    ApprovalStatus.APPROVED: "approval_granted",
    ApprovalStatus.EXPIRED: "approval_expired",
    ApprovalStatus.VOID: "approval_void",
}


class Decisions(PostgresBase):
    """Approvals, extensions, reopening, follow-ups and audit rows (that part of `pollwarden.store.Store`)."""

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
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            record = current.record
            await writer.flush(current)
            if record.version != bound_version or record.status != Status.ESCALATED:
                return None
            granted = await writer.write(
                current, {**changes, "extensions_used": record.extensions_used + 1}, at=at
            )
            if approval_id is not None:
                await tx.queue(sql.MARK_APPROVAL_APPLIED, {"approval_id": approval_id})
            await writer.append(
                event(granted, "extension_approved", at, note=approval_id, extra=payload_extra), on=current
            )
            return granted

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
        """Record a question for a person, bound to the operation as it is now (idempotent)."""
        request_json = json.dumps(request, sort_keys=True)
        params = {
            "approval_id": approval_id,
            "operation_id": record.operation_id,
            "kind": ApprovalKind(kind),
            "version": record.version,
            "request_json": request_json,
            "at": at,
            "expires_at": at + ttl_seconds,
        }
        async with self._locked(record.operation_id) as (writer, tx, cursor):
            existing = await tx.queue(sql.FIND_PENDING_APPROVAL, params)
            current = operation(await tx.read(cursor), record.operation_id)
            found = await tx.read(existing)
            if found is not None:
                return ApprovalRecord.from_row(found)
            await tx.queue(sql.INSERT_APPROVAL, params)
            await writer.flush(current)
            await writer.append(
                event(
                    record,
                    "approval_pending",
                    at,
                    note=approval_id,
                    extra={"request": dict(request), "approval_kind": str(kind)},
                ),
                on=current,
            )
            return ApprovalRecord(
                approval_id,
                record.operation_id,
                ApprovalKind(kind),
                ApprovalStatus.PENDING,
                request_json,
                record.version,
                at,
                at + ttl_seconds,
                None,
                None,
                None,
            )

    async def decide_approval(
        self,
        approval_id: str,
        *,
        approve: bool,
        by: str,
        at: float,
        method: str,
        signature: str | None = None,
    ) -> ApprovalRecord | None:
        """A person's answer to a pending approval (pending → approved/denied; expired when late).

        Guarantee: decided once — the operation row, then the approval row, are
        locked, and only a pending approval is decided.
        """
        first = await self.get_approval(approval_id)
        if first is None:
            return None
        async with self._locked(first.operation_id) as (writer, tx, cursor):
            approval_cursor = await tx.queue(sql.LOCK_APPROVAL, {"approval_id": approval_id})
            current = operation(await tx.read(cursor), first.operation_id)
            row = await tx.read(approval_cursor)
            approval = None if row is None else ApprovalRecord.from_row(row)
            if approval is None or approval.status != ApprovalStatus.PENDING:
                return approval
            if at >= approval.expires_at:
                status = ApprovalStatus.EXPIRED
            elif approve and current.record.version != approval.bound_version:
                status = ApprovalStatus.VOID  # the operation changed since the person was asked
            else:
                status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
            decided = {"status": status, "at": at, "by": by, "method": method, "signature": signature}
            await tx.queue(sql.DECIDE_APPROVAL, {**decided, "approval_id": approval_id})
            await writer.flush(current)
            kind = _DECIDED_KIND.get(status, f"{approval.kind}_denied")
            note = f"{approval_id} by {by}"
            await writer.append(
                event(current.record, kind, at, note=note, extra={"authenticated_by": method}), on=current
            )
            return dataclasses.replace(
                approval,
                status=status,
                decided_at=at,
                decided_by=by,
                decided_method=method,
                decision_signature=signature,
            )

    async def close_approval(
        self, approval_id: str, *, status: str, at: float, note: str, audit_kind: str | None = None
    ) -> ApprovalRecord | None:
        """Mark an approval applied, void or expired; with `audit_kind`, tell it in the operation's story.

        Guarded as on SQLite: None when it is no longer in a status it may be closed from.
        """
        first = await self.get_approval(approval_id)
        if first is None:
            return None
        async with self._locked(first.operation_id, audit=audit_kind is not None) as (writer, tx, cursor):
            allowed = list(APPROVAL_CLOSABLE_FROM.get(status, ()))
            params = {
                "status": ApprovalStatus(status),
                "note": note,
                "at": at,
                "approval_id": approval_id,
                "allowed": allowed,
            }
            closed = await tx.queue(sql.CLOSE_APPROVAL, params)
            current = operation(await tx.read(cursor), first.operation_id)
            row = await tx.read(closed)
            if row is None:
                return None
            approval = ApprovalRecord.from_row(row)
            if audit_kind is not None:
                await writer.flush(current)
                await writer.append(event(current.record, audit_kind, at, note=approval_id), on=current)
            return approval

    # -- follow-ups and the audit ------------------------------------------------------------------

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
        """Record one follow-up and its audit row; optionally change the operation (if still `expect_version`)."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            record = current.record
            await writer.flush(current)
            if operation_changes:
                if record.version != expect_version:
                    return None
                record = await writer.write(current, operation_changes, at=at)
            followup = FollowupRecord(
                followup_id,
                operation_id,
                FollowupKind(kind),
                FollowupStatus(status),
                approval_id,
                at,
                at,
                http_status,
                answer,
                note,
            )
            await tx.queue(sql.INSERT_FOLLOWUP, followup.__dict__)
            if approval_id is not None:
                await tx.queue(
                    sql.MARK_APPROVAL_USED, {"note": f"used by {followup_id}", "approval_id": approval_id}
                )
            extra = {"followup_id": followup_id, "http_status": http_status, "approval_id": approval_id}
            await writer.append(event(record, f"{kind}_{status}", at, note=note, extra=extra), on=current)
            return followup

    async def audit_event(
        self, operation_id: str, *, kind: str, at: float, note: str | None, extra: Mapping[str, object]
    ) -> None:
        """Append one audit row about an operation."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            await writer.flush(current)
            await writer.append(event(current.record, kind, at, note=note, extra=extra), on=current)

    async def reopen(
        self,
        operation_id: str,
        *,
        bound_version: int,
        next_check_at: float,
        at: float,
        extra: Mapping[str, object],
    ) -> OperationRecord | None:
        """An operator's reopen after a refusal, only if the operation is still as shown (None otherwise)."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            record = current.record
            await writer.flush(current)
            if (
                record.version != bound_version
                or record.status != Status.ESCALATED
                or record.stop_reason not in REOPENABLE
                or record.provider_job_id is None
                or record.duplicate_of is not None
            ):
                return None
            changes = {
                "status": Status.WAITING,
                "stop_reason": None,
                "stop_detail": None,
                "stopped_at": None,
                "next_check_at": next_check_at,
                "delay_source": DelaySource.MANUAL_EXTENSION,
                "fleet_slot_at": None,
                "lease_owner": None,
                "lease_expires_at": None,
            }
            reopened = await writer.write(current, changes, at=at)
            await writer.append(
                event(reopened, "reopened", at, note=str(extra.get("reason")), extra=extra), on=current
            )
            return reopened
