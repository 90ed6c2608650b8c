"""Approval by consequence: a person approves every status request of a high-privilege status API.

By default routine polls inside approved bounds need no click (README "Approvals").
A provider table with `[approval] every_status_request = true` (a status API
that exposes sensitive job metadata) makes each status request a decision:
before check_status sends one, the person is asked by elicitation (either
protocol era); a client that cannot ask gets a pending approval that an
operator decides with `pollwarden approve`, used by the agent's next
check_status for one request. A refusal, a dismissed question or no answer
sends nothing. The gate enforces it (`Step.NEEDS_PERSON`): without an
approval in this call, no request for such a provider is reserved.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field

from pollwarden.approvals import ApprovalParts, check_operator_decision, operator_must_decide
from pollwarden.gate import Step, decide_check
from pollwarden.operator_keys import METHOD_ELICITATION, METHOD_TOOL_CONFIRMATION
from pollwarden.records import OperationRecord
from pollwarden.timefmt import iso
from pollwarden.untrusted import quoted
from pollwarden.vocabulary import ApprovalKind, ApprovalStatus


class SendDecision(BaseModel):
    """What the person is asked: a flat, bounded choice."""

    decision: Literal["send", "skip"] = Field(
        description="send lets pollwarden send this one status request; skip sends nothing"
    )


class StatusRequestPlan(BaseModel):
    """Whether this check_status call would send a request a person must approve, and the question."""

    needed: bool = False
    operation_id: str = ""
    question: str = ""
    operator_approval_id: str | None = None  # an operator's approval for one request, waiting to be used


def requires_person(controller: ApprovalParts, record: OperationRecord) -> bool:
    """Whether the operation's provider table requires a person for every status request."""
    table = controller.tables.get(record.provider)
    return table is not None and table.approval.every_status_request


async def plan(controller: ApprovalParts, operation_id: str, *, wait_seconds: float) -> StatusRequestPlan:
    """Ask only when a request would really go out in this call (now, or within its wait)."""
    record = await controller.store.get(operation_id)
    if record is None or not requires_person(controller, record):
        return StatusRequestPlan()
    now = controller.clock.now()
    decision = decide_check(
        record, now=now, wait_until=now + wait_seconds, has_table=True, approvals_due=False
    )
    if decision.step not in (Step.RESERVE, Step.WAIT):
        return StatusRequestPlan()
    approved = [
        a
        for a in await controller.store.list_approvals(
            operation_id=operation_id, status=ApprovalStatus.APPROVED
        )
        if a.kind == ApprovalKind.STATUS_REQUEST
    ]
    return StatusRequestPlan(
        needed=True,
        operation_id=operation_id,
        question=question(record),
        operator_approval_id=approved[0].approval_id if approved else None,
    )


def question(record: OperationRecord) -> str:
    """The facts a person needs for one status request (untrusted values quoted, one line each)."""
    return "\n".join(
        [
            f"Approve one status request to {quoted(record.provider)}?",
            f"Operation: {quoted(record.operation_id)}; provider job: {quoted(record.provider_job_id or '')}",
            f"Last state: {quoted(record.state) if record.state else '(none yet)'}",
            f"Status requests: {record.status_requests_used} of {record.max_status_requests} used; this would be "
            f"number {record.status_requests_used + 1}",
            f"Deadline: {iso(record.deadline_at)}",
            "Why you are asked: this provider's table requires a person for every status request "
            "(a high-privilege status API).",
            "Choices: send or skip. Skip sends nothing.",
        ]
    )


async def permission(
    controller: ApprovalParts,
    plan: StatusRequestPlan,
    answer: bool | None,
    *,
    asked: bool,
    operator_only: bool = False,
) -> str | None:
    """Whether this call may send its one request: None if a person approved, else what the agent is told.

    Every decision is audited on the operation with how it was authenticated.
    With `operator_only` (an authenticated HTTP agent) the client's tool
    confirmation counts for nothing: only an operator's decision does.
    """
    now = controller.clock.now()
    op = plan.operation_id
    if controller.config.approval_mode == "tool-confirmation" and not operator_only:
        await _audit(
            controller, op, "status_request_approved", "client tool confirmation", METHOD_TOOL_CONFIRMATION
        )
        return None
    if asked:
        if answer:
            await _audit(
                controller, op, "status_request_approved", "person (elicitation)", METHOD_ELICITATION
            )
            return None
        word = "denied it" if answer is False else "dismissed the question without an answer"
        await _audit(
            controller,
            op,
            "status_request_denied" if answer is False else "status_request_unanswered",
            "person (elicitation)",
            METHOD_ELICITATION,
        )
        return (
            f"Nothing was sent: this provider requires a person to approve every status request, and the "
            f"person {word}. Call check_status again to ask again."
        )
    if plan.operator_approval_id is not None:
        approval = await controller.store.get_approval(plan.operator_approval_id)
        if approval is not None and approval.status == ApprovalStatus.APPROVED:
            verdict = await check_operator_decision(controller, approval)
            if verdict.ok:
                await controller.store.close_approval(
                    approval.approval_id,
                    status=ApprovalStatus.APPLIED,
                    at=now,
                    note="used by one status request",
                )
                await _audit(
                    controller,
                    op,
                    "status_request_approved",
                    approval.decided_by or "operator",
                    verdict.method,
                )
                return None
    record = await controller.load(op)
    pending = [
        a
        for a in await controller.store.list_approvals(operation_id=op, status=ApprovalStatus.PENDING)
        if a.kind == ApprovalKind.STATUS_REQUEST and a.expires_at > now
    ]
    if pending:
        approval_id, expires_at = pending[0].approval_id, pending[0].expires_at
    else:
        opened = await controller.store.open_approval(
            approval_id=f"ap-{uuid.uuid4().hex[:10]}",
            record=record,
            kind=ApprovalKind.STATUS_REQUEST,
            request={"question": plan.question, "operation_id": op},
            at=now,
            ttl_seconds=controller.config.approval_ttl_seconds,
        )
        approval_id, expires_at = opened.approval_id, opened.expires_at
    return (
        "Nothing was sent: this provider requires a person to approve every status request. "
        + operator_must_decide(approval_id, expires_at)
        + " Then call check_status once: an approved request is sent then."
    )


async def _audit(controller: ApprovalParts, operation_id: str, kind: str, by: str, method: str) -> None:
    await controller.store.audit_event(
        operation_id,
        kind=kind,
        at=controller.clock.now(),
        note=f"one status request, by {by}",
        extra={"authenticated_by": method, "decided_by": by},
    )
