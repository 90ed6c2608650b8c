"""Approval by consequence: a person approves every status request of a high-privilege status API.

By default routine polls inside approved bounds need no click (README "Approvals").
A provider table with `[approval] every_status_request = true` (a status API
that exposes sensitive job metadata) makes each status request a decision:
before check_status sends one, the person is asked by elicitation (either
protocol era); a client that cannot ask gets a pending approval that an
operator decides with `pollwarden approve`, used by the agent's next
check_status for one request. A refusal, a dismissed question or no answer
sends nothing. The gate enforces it (`Verdict.NEEDS_PERSON`): without an
approval in this call, no request for such a provider is reserved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from pollwarden.core.records import OperationRecord
from pollwarden.core.timefmt import iso
from pollwarden.core.untrusted import quoted
from pollwarden.core.vocabulary import ApprovalKind, ApprovalStatus
from pollwarden.flows.approval_flow import ELICITATION, Approver, No
from pollwarden.flows.approvals import check_operator_decision, open_question, operator_must_decide
from pollwarden.rules.gate import Verdict, gate_verdict

if TYPE_CHECKING:
    from pollwarden.flows.controller import Controller


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


def requires_person(controller: Controller, record: OperationRecord) -> bool:
    """Whether the operation's provider table requires a person for every status request."""
    table = controller.tables.get(record.provider)
    return table is not None and table.approval.every_status_request


async def plan(controller: Controller, operation_id: str, *, wait_seconds: float) -> StatusRequestPlan:
    """Ask only when a request would really go out in this call (now, or within its wait)."""
    record = await controller.store.get(operation_id)
    if record is None or not requires_person(controller, record):
        return StatusRequestPlan()
    now = controller.clock.now()
    decision = gate_verdict(
        record, now=now, wait_until=now + wait_seconds, has_table=True, approvals_due=False
    )
    if decision.kind not in (Verdict.RESERVE, Verdict.WAIT):
        return StatusRequestPlan()
    if decision.kind == Verdict.WAIT and (decision.allowed_at or now) > now + wait_seconds:
        return (
            StatusRequestPlan()
        )  # the call waits, but its request is not due within the wait: nobody is asked
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


@dataclass(frozen=True)
class Permission:
    """Whether this call may send its one status request; if not, what the agent is told."""

    granted: bool
    refusal: str | None = None


_NOT_NEEDED = Permission(granted=False)


def _refused(word: str) -> Permission:
    return Permission(
        False,
        f"Nothing was sent: this provider requires a person to approve every status request, and the "
        f"person {word}. Call check_status again to ask again.",
    )


class StatusRequestFlow:
    """One status request through the one approval flow (`approval_flow`); every decision is audited."""

    tool = "check_status"
    schema = SendDecision
    yes = "send"

    def asks(self, plan: StatusRequestPlan) -> bool:
        """Asked only where a request would go out and no operator approved one."""
        return plan.needed and plan.operator_approval_id is None

    def question(self, plan: StatusRequestPlan) -> str:
        """The facts of the one request."""
        return plan.question

    async def late(
        self, controller: Controller, plan: StatusRequestPlan, approve: bool | None, missing: str
    ) -> None:
        """Too late to send with this call: told in the story, nothing sent (the next call asks again)."""
        said = {True: "the person answered send", False: "the person answered skip", None: missing}[approve]
        await controller.store.audit_event(
            plan.operation_id,
            kind="status_request_unanswered",
            at=controller.clock.now(),
            note=f"the answer came after the client stopped waiting ({said}); nothing was sent",
            extra={},
        )

    async def settled(self, controller: Controller, plan: StatusRequestPlan) -> Permission | None:
        """No person is needed in this call: nothing to grant."""
        return None if plan.needed else _NOT_NEEDED

    async def approve(
        self, controller: Controller, plan: StatusRequestPlan, approver: Approver
    ) -> Permission:
        """Audited; the call may send its one request."""
        await _audit(controller, plan.operation_id, "status_request_approved", approver.by, approver.method)
        return Permission(True)

    async def deny(self, controller: Controller, plan: StatusRequestPlan, no: No) -> Permission:
        """Audited; nothing is sent."""
        kind = "status_request_denied" if no == "denied" else "status_request_unanswered"
        await _audit(controller, plan.operation_id, kind, ELICITATION.by, ELICITATION.method)
        return _refused("denied it" if no == "denied" else "dismissed the question without an answer")

    async def ask_operator(self, controller: Controller, plan: StatusRequestPlan) -> Permission:
        """Use an operator's approval of one request, or record a question for one."""
        now = controller.clock.now()
        op = plan.operation_id
        if plan.operator_approval_id is not None:
            approval = await controller.store.get_approval(plan.operator_approval_id)
            if approval is not None and approval.status == ApprovalStatus.APPROVED:
                verdict = await check_operator_decision(controller, approval)
                # The close is the claim: of two calls that read the same approval, only the one
                # whose close changed the row may send (None: another call used it first).
                if verdict.ok and (
                    await controller.store.close_approval(
                        approval.approval_id,
                        status=ApprovalStatus.APPLIED,
                        at=now,
                        note="used by one status request",
                    )
                    is not None
                ):
                    by = approval.decided_by or "operator"
                    await _audit(controller, op, "status_request_approved", by, verdict.method)
                    return Permission(True)
        pending = [
            a
            for a in await controller.store.list_approvals(operation_id=op, status=ApprovalStatus.PENDING)
            if a.kind == ApprovalKind.STATUS_REQUEST and a.expires_at > now
        ]
        if pending:
            approval_id, expires_at = pending[0].approval_id, pending[0].expires_at
        else:
            request = {"question": plan.question, "operation_id": op}
            opened = await open_question(
                controller, await controller.load(op), ApprovalKind.STATUS_REQUEST, request
            )
            approval_id, expires_at = opened.approval_id, opened.expires_at
        return Permission(
            False,
            "Nothing was sent: this provider requires a person to approve every status request. "
            + operator_must_decide(approval_id, expires_at)
            + " Then call check_status once: an approved request is sent then.",
        )


STATUS_REQUEST = StatusRequestFlow()


async def _audit(controller: Controller, operation_id: str, kind: str, by: str, method: str) -> None:
    await controller.store.audit_event(
        operation_id,
        kind=kind,
        at=controller.clock.now(),
        note=f"one status request, by {by}",
        extra={"authenticated_by": method, "decided_by": by},
    )
