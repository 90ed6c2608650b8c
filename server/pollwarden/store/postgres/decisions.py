"""What people decide on PostgreSQL: approvals, extensions, reopening, follow-ups, audit rows.

Each is one transaction on the operation row locked first; the guarantee of each
is stated on it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from pollwarden.audit.entry import (
    event,
)
from pollwarden.core.records import (
    ApprovalRecord,
    OperationRecord,
)
from pollwarden.core.vocabulary import (
    APPROVAL_CLOSABLE_FROM,
    ApprovalKind,
    ApprovalStatus,
)
from pollwarden.store import plans, statements
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.base import PostgresBase
from pollwarden.store.postgres.executor import operation


class Decisions(PostgresBase):
    """Approvals, extensions, reopening, follow-ups and audit rows (that part of `pollwarden.store.Store`)."""

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
            existing = await tx.queue(statements.FIND_PENDING_APPROVAL, params)
            current = operation(await tx.read(cursor), record.operation_id)
            found = await tx.read(existing)
            if found is not None:
                return ApprovalRecord.from_row(found)
            await tx.queue(statements.INSERT_APPROVAL, params)
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
            status, plan = plans.decision_plan(
                approval, current.record, approve=approve, by=by, at=at, method=method
            )
            decided = {"status": status, "at": at, "by": by, "method": method, "signature": signature}
            await tx.queue(statements.DECIDE_APPROVAL, {**decided, "approval_id": approval_id})
            await writer.carry_out(current, plan)
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
                await writer.carry_out(
                    current, plans.note_plan(current.record, audit_kind, at, note=approval_id)
                )
            return approval

    # -- follow-ups and the audit ------------------------------------------------------------------
