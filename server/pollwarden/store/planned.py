"""The store's writes that are one plan on one operation, written once for both engines.

Each engine provides `_carry_out_on`: its transaction on the operation row
(SQLite: one hop, under its write lock; PostgreSQL: the row locked `FOR
UPDATE`), where the plan is made from the row as read and carried out by the
engine's executor. What each write does is its plan's (`pollwarden.store.plans`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pollwarden.access.approval_policy import ApprovalPolicy
from pollwarden.core.records import FollowupRecord, OperationRecord
from pollwarden.core.vocabulary import FollowupKind, FollowupStatus
from pollwarden.store import plans
from pollwarden.store.plans import Plan
from pollwarden.store.reads import StoreReads


class PlannedWrites(StoreReads):
    """Claiming a submission, extensions, reopening, follow-ups and audit rows (of `pollwarden.store.Store`)."""

    async def _carry_out_on(self, operation_id: str, plan_of: Callable[[OperationRecord], Plan]) -> Plan:
        """One transaction on the operation: `plan_of` the row as read, carried out; the plan.

        Each engine overrides it with its own transaction mechanism.
        """
        raise NotImplementedError  # the engine class defines it; PlannedWrites alone is never used

    async def claim_submission(
        self, operation_id: str, *, owner: str, now: float, lease_seconds: float, allow_stale: bool, note: str
    ) -> OperationRecord | None:
        """Take the submission lease before the submit request is sent (None: not free); committed first."""
        plan = await self._carry_out_on(
            operation_id,
            lambda record: plans.claim_plan(
                record, owner=owner, now=now, lease_seconds=lease_seconds, allow_stale=allow_stale, note=note
            ),
        )
        return plan.record if plan.applied else None

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
        plan = await self._carry_out_on(
            operation_id,
            lambda record: plans.extension_plan(
                record,
                bound_version=bound_version,
                changes=changes,
                at=at,
                approval_id=approval_id,
                payload_extra=payload_extra,
            ),
        )
        return plan.record if plan.applied else None

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
        plan = await self._carry_out_on(
            operation_id,
            lambda record: plans.reopen_plan(
                record, bound_version=bound_version, next_check_at=next_check_at, at=at, extra=extra
            ),
        )
        return plan.record if plan.applied else None

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
        plan = await self._carry_out_on(
            operation_id,
            lambda record: plans.followup_plan(
                record, followup, operation_changes=operation_changes, expect_version=expect_version
            ),
        )
        return followup if plan.applied else None

    async def audit_event(
        self, operation_id: str, *, kind: str, at: float, note: str | None, extra: Mapping[str, object]
    ) -> None:
        """Append one audit row about an operation."""
        await self._carry_out_on(
            operation_id, lambda record: plans.note_plan(record, kind, at, note=note, extra=extra)
        )


def approval_policy_params(
    policy: ApprovalPolicy, *, at: float, by: str, only_raising_to_a_key: bool
) -> dict[str, object]:
    """The parameters of `statements.WRITE_APPROVAL_POLICY` (each engine runs it in one statement)."""
    return {
        "require": policy.require_operator_key,
        "channels": ",".join(sorted(policy.channels)),
        "keys": policy.key_lines(),
        "at": at,
        "by": by,
        "only_raising": only_raising_to_a_key,
    }
