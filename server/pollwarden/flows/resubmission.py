"""A resubmission needs a person (README "Stop reasons": Resubmitting): the same payload again after it ended or escalated.

`start_operation(submit=…)` whose request fingerprint (provider, account
context, payload) matches an operation that ended (`failed`, `cancelled`,
`expired`) or escalated is recorded as a *held* operation: stored, with its
idempotency key, before anything is sent, and never claimed for sending
(`resubmission_of` set, `resubmission_approved_by` empty; the SQL claim says
so too) until a person approves. The person is asked like for an extension:
by elicitation in either protocol era, or as a pending approval an operator
decides with `pollwarden approve`, applied by the agent's next
`start_operation` with the same `operation_id`. The question shows the
earlier outcome. A payload whose latest operation is still in flight (or
succeeded) is not a resubmission: it behaves as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from pollwarden.access.operator_keys import METHOD_ELICITATION
from pollwarden.core.records import OperationRecord
from pollwarden.core.timefmt import to_datetime
from pollwarden.core.untrusted import one_line, quoted
from pollwarden.core.vocabulary import ApprovalKind, ApprovalStatus, Status
from pollwarden.flows import approvals
from pollwarden.flows.approval_flow import Answer, Approver, No, settle
from pollwarden.flows.approvals import check_operator_decision, operator_must_decide
from pollwarden.rules.job_identity import account_context_of, fingerprint, payload_in_flight
from pollwarden.store import Store
from pollwarden.surface.views import human_duration

if TYPE_CHECKING:
    from pollwarden.flows.controller import Controller

# An earlier operation in one of these makes the same payload a resubmission that a person approves.
NEEDS_A_PERSON = frozenset({Status.FAILED, Status.CANCELLED, Status.EXPIRED, Status.ESCALATED})


class ResubmitDecision(BaseModel):
    """What the person is asked: a flat, bounded choice."""

    decision: Literal["resubmit", "keep_stopped"] = Field(
        description="resubmit sends the same payload once more as a new job; keep_stopped sends nothing"
    )


class ResubmissionPlan(BaseModel):
    """Whether a start_operation call is a resubmission a person must approve, and the question."""

    needed: bool = False
    operation_id: str | None = None  # the held operation's id (given, or derived from the payload)
    earlier_operation_id: str | None = None
    question: str = ""
    operator_approved: bool = False  # an operator's approval waits to be applied: nobody is asked


async def earlier_outcome(store: Store, fingerprint: str, *, exclude: str | None) -> OperationRecord | None:
    """The latest earlier operation of this payload, if it ended or escalated (a person must approve).

    Held resubmissions and operations that only track a job are skipped (they
    sent nothing: a tracked job's fingerprint can equal a payload's); the latest
    of the rest decides: one still in flight or succeeded is not a reason to ask. Every
    principal's operations count (issue 30): the provider saw that payload fail
    whoever sent it. Another principal's is never named to the caller
    (`another_principal`).
    """
    for record in await store.operations_of_fingerprint(fingerprint):
        if record.operation_id == exclude or record.held_for_approval or record.submit_payload_json is None:
            continue
        return record if record.status in NEEDS_A_PERSON else None
    return None


def another_principal(earlier: OperationRecord | None, owner: str) -> bool:
    """Whether the earlier operation is another principal's: then its id, owner and facts are not shown."""
    return earlier is not None and earlier.owner != owner


# What a principal is told about a payload that failed under another principal's operation (never which).
FAILED_FOR_ANOTHER_PRINCIPAL = (
    "the same payload already ended without success on this server for another principal (its operation is "
    "not shown here)"
)


async def earlier_words(controller: Controller, record: OperationRecord) -> str:
    """How the held `record`'s messages name the payload it resubmits: by the earlier operation, if its own."""
    earlier = await controller.store.get(record.resubmission_of or "")
    if another_principal(earlier, record.owner):
        return "a payload that ended on this server for another principal"
    return f"the payload of {quoted(record.resubmission_of or '?')}"


def held_operation_id(provider: str, fingerprint: str, earlier: OperationRecord) -> str:
    """The id of a resubmission started without one: the same on every call, so a re-call finds it."""
    digest = hashlib.sha256(f"{fingerprint}:{earlier.operation_id}".encode()).hexdigest()[:12]
    return f"{provider}-resubmit-{digest}"


def question(held_id: str, provider: str, earlier: OperationRecord, *, owner: str = "local") -> str:
    """The facts a person needs, from recorded values only (untrusted ones quoted, one line each).

    `owner` is whose resubmission it is: when the earlier operation is another principal's, the
    question says only that the payload failed here for another principal, and that a person decides.
    """
    if another_principal(earlier, owner):
        return "\n".join(
            [
                f"Approve submitting the same payload to {quoted(provider)} again?",
                f"New operation: {quoted(held_id)}",
                f"Earlier outcome: {FAILED_FOR_ANOTHER_PRINCIPAL}.",
                "A person decides whether it is sent again: it may fail the same way, or duplicate a job "
                "that may still exist at the provider.",
                "Effect: pollwarden sends the payload once more, as a new job with its own budget; the earlier "
                "operation is not touched.",
                "Choices: resubmit or keep_stopped.",
            ]
        )
    ended = earlier.stopped_at if earlier.stopped_at is not None else earlier.updated_at
    lines = [
        f"Approve submitting the same payload to {quoted(provider)} again?",
        f"New operation: {quoted(held_id)}",
        f"It was submitted before as {quoted(earlier.operation_id)}, provider job "
        f"{quoted(earlier.provider_job_id) if earlier.provider_job_id else '(none known)'}",
        f"Earlier outcome: {earlier.status} ({earlier.stop_reason}) at "
        f"{to_datetime(ended).strftime('%Y-%m-%d %H:%M UTC')}, after "
        f"{human_duration(ended - earlier.started_at)}",
        f"Last state: {quoted(earlier.state) if earlier.state else '(none)'}; status requests "
        f"{earlier.status_requests_used} of {earlier.max_status_requests}",
    ]
    if earlier.stop_detail:
        lines.append(f"Detail: {one_line(earlier.stop_detail)}")
    if earlier.error:
        lines.append(f"Provider error (untrusted): {quoted(earlier.error, bare_tokens=False)}")
    if earlier.status == Status.ESCALATED:
        lines.append(
            "The earlier job may still exist at the provider: a second job may duplicate its work "
            "(check the provider's console first)."
        )
    lines.append(
        "Effect: pollwarden sends the payload once more, as a new job with its own budget; the earlier "
        "operation is not touched."
    )
    lines.append("Choices: resubmit or keep_stopped.")
    return "\n".join(lines)


class ResubmissionFlow:
    """A held resubmission through the one approval flow (`approval_flow`): asked about with the
    `ResubmissionPlan` start_operation resolves, settled on the held record it writes."""

    tool = "start_operation"
    schema = ResubmitDecision
    yes = "resubmit"

    def asks(self, plan: ResubmissionPlan) -> bool:
        """Asked only for a resubmission that no operator approved yet."""
        return plan.needed and not plan.operator_approved

    def question(self, plan: ResubmissionPlan) -> str:
        """The earlier outcome and what resubmitting sends."""
        return plan.question

    async def late(
        self, controller: Controller, plan: ResubmissionPlan, approve: bool | None, missing: str
    ) -> None:
        """See `record_late_answer`."""
        await record_late_answer(controller, plan, approve, missing)

    async def settled(self, controller: Controller, record: OperationRecord) -> OperationRecord | None:
        """Nothing is settled before the person or an operator decides."""
        return None

    async def approve(
        self, controller: Controller, record: OperationRecord, approver: Approver
    ) -> OperationRecord:
        """Record the approval; the caller then sends it."""
        return await _approve(controller, record, approver.by, approver.method)

    async def deny(self, controller: Controller, record: OperationRecord, no: No) -> OperationRecord:
        """Keep it held, saying who decided; nothing is sent."""
        word = "denied" if no == "denied" else "dismissed without an answer (cancelled)"
        return await _keep_held(
            controller,
            record,
            kind=f"resubmission_{no}",
            detail=f"the person {word} resubmitting {await earlier_words(controller, record)}; nothing was sent",
            extra={"authenticated_by": METHOD_ELICITATION},
        )

    async def ask_operator(self, controller: Controller, record: OperationRecord) -> OperationRecord:
        """Apply an operator's verified decision; expire a stale question; else ask one (once)."""
        now = controller.clock.now()
        asked = [
            a
            for a in await controller.store.list_approvals(operation_id=record.operation_id)
            if a.kind == ApprovalKind.RESUBMISSION
        ]
        for approval in asked:
            if await approvals.expire_stale(controller, approval, now):
                continue
            if approval.status == ApprovalStatus.PENDING:
                return record  # asked already; still waiting for the operator
            elif approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
                verdict = await check_operator_decision(controller, approval)
                if not verdict.ok:
                    continue
                if approval.status == ApprovalStatus.APPROVED:
                    return await _approve(
                        controller,
                        record,
                        approval.decided_by or "operator",
                        verdict.method,
                        approval_id=approval.approval_id,
                    )
                await controller.store.close_approval(
                    approval.approval_id, status=ApprovalStatus.APPLIED, at=now, note="denied"
                )
                return await _keep_held(
                    controller,
                    record,
                    kind="resubmission_denied",
                    detail=f"an operator ({quoted(approval.decided_by or 'operator')}) denied resubmitting "
                    f"{await earlier_words(controller, record)}; nothing was sent",
                    extra={"authenticated_by": verdict.method, "approval_id": approval.approval_id},
                )
        return await _ask_operator(controller, record)


RESUBMISSION = ResubmissionFlow()


async def clear(controller: Controller, record: OperationRecord, answer: Answer) -> OperationRecord:
    """Approve a held resubmission if a person did; otherwise keep it held, saying why and who decides.

    Returns the record: still `held_for_approval` means nothing may be sent.
    """
    return await settle(RESUBMISSION, controller, record, answer)


async def _ask_operator(controller: Controller, record: OperationRecord) -> OperationRecord:
    """Record a pending approval for an operator (this client cannot ask a person)."""
    now = controller.clock.now()
    approval_id = approvals.new_approval_id()
    expires_at = now + controller.config.approval_ttl_seconds
    held = await _keep_held(
        controller,
        record,
        kind="resubmission_held",
        detail=operator_must_decide(approval_id, expires_at)
        + " Nothing is sent before that; then call start_operation once more with the same operation_id: "
        "an approved resubmission is sent then, once",
        extra={},
    )
    earlier = await controller.store.get(record.resubmission_of or "")
    text = (
        question(record.operation_id, record.provider, earlier, owner=record.owner)
        if earlier is not None
        else ""
    )
    # Bound to the held record as it is now (after its detail was written), so an approval stays valid.
    await controller.store.open_approval(
        approval_id=approval_id,
        record=held,
        kind=ApprovalKind.RESUBMISSION,
        request={
            "question": text,
            "operation_id": record.operation_id,
            "resubmission_of": record.resubmission_of,
        },
        at=now,
        ttl_seconds=controller.config.approval_ttl_seconds,
    )
    return held


async def _keep_held(
    controller: Controller, record: OperationRecord, *, kind: str, detail: str, extra: dict[str, object]
) -> OperationRecord:
    updated = await controller.store.finish_submission(
        record.operation_id,
        owner=None,
        changes={"stop_detail": detail},
        kind=kind,
        at=controller.clock.now(),
        note=detail,
        payload_extra={"resubmission_of": record.resubmission_of, **extra},
    )
    return updated or await controller.load(record.operation_id)


async def _approve(
    controller: Controller,
    record: OperationRecord,
    by: str,
    method: str,
    *,
    approval_id: str | None = None,
) -> OperationRecord:
    """Record the person's approval (audited as a resubmission approval); the caller then sends it."""
    now = controller.clock.now()
    updated = await controller.store.finish_submission(
        record.operation_id,
        owner=None,
        changes={"resubmission_approved_by": by, "stop_detail": None},
        kind="resubmission_approved",
        at=now,
        note=f"resubmitting {await earlier_words(controller, record)}, approved by {by} ({method})",
        payload_extra={
            "resubmission_of": record.resubmission_of,
            "approved_by": by,
            "authenticated_by": method,
            "approval_id": approval_id,
        },
    )
    if approval_id is not None:
        await controller.store.close_approval(
            approval_id, status=ApprovalStatus.APPLIED, at=now, note="resubmission sent"
        )
    return updated or await controller.load(record.operation_id)


async def plan(
    controller: Controller,
    *,
    provider: str,
    operation_id: str | None,
    submit: Mapping[str, Any] | None,
    owner: str = "local",
) -> ResubmissionPlan:
    """Whether `owner`'s start_operation call is a resubmission a person must approve (no side effects).

    Wrong arguments are not judged here: the call itself refuses them with its own words.
    """
    table = controller.tables.get(provider)
    if submit is None or table is None or table.submit is None:
        return ResubmissionPlan()
    try:
        payload_fingerprint = fingerprint(provider, account_context_of(table), dict(submit))
    except (TypeError, ValueError):
        return ResubmissionPlan()
    in_flight = payload_in_flight(
        await controller.store.operations_of_fingerprint(payload_fingerprint), exclude=None, owner=owner
    )
    if in_flight is not None:
        if operation_id not in (None, in_flight.operation_id) or not in_flight.held_for_approval:
            return ResubmissionPlan()  # the call is answered with the operation in flight: nobody is asked
        operation_id = in_flight.operation_id  # the call reaches the held one: the question is its own
    held: OperationRecord | None = None
    if operation_id is not None:
        held = await controller.store.get(operation_id)
        if held is not None and not held.held_for_approval:
            return ResubmissionPlan()  # the same operation again: returned as it is, never submitted twice
    earlier: OperationRecord | None = None
    if held is not None:
        earlier = await controller.store.get(held.resubmission_of or "")
    else:
        earlier = await earlier_outcome(controller.store, payload_fingerprint, exclude=operation_id)
        if earlier is not None and operation_id is None:
            derived = held_operation_id(provider, payload_fingerprint, earlier)
            held = await controller.store.get(derived)
            if held is not None and not held.held_for_approval:
                return ResubmissionPlan()
            operation_id = derived
    if earlier is None or operation_id is None:
        return ResubmissionPlan()
    operator_approved = held is not None and any(
        a.kind == ApprovalKind.RESUBMISSION and a.status == ApprovalStatus.APPROVED
        for a in await controller.store.list_approvals(operation_id=held.operation_id)
    )
    return ResubmissionPlan(
        needed=True,
        operation_id=operation_id,
        earlier_operation_id=earlier.operation_id,
        question=question(operation_id, provider, earlier, owner=owner),
        operator_approved=operator_approved,
    )


async def record_late_answer(
    controller: Controller, plan: ResubmissionPlan, approve: bool | None, missing: str
) -> None:
    """A person's answer that came after the client stopped waiting (2025-11-25 era).

    On a held operation already recorded it becomes the person's decision on an
    approval, which the agent's next start_operation applies; before the held
    operation exists, it is told in the earlier operation's story and changes
    nothing (the next call asks again).
    """
    held = await controller.store.get(plan.operation_id or "")
    if held is not None and held.held_for_approval:
        await approvals.record_late_answer(
            controller,
            operation_id=held.operation_id,
            kind=ApprovalKind.RESUBMISSION,
            request={
                "question": plan.question,
                "operation_id": held.operation_id,
                "resubmission_of": held.resubmission_of,
            },
            approve=approve,
            answer=missing,
        )
        return
    if plan.earlier_operation_id is not None:
        await controller.store.audit_event(
            plan.earlier_operation_id,
            kind="resubmission_unanswered",
            at=controller.clock.now(),
            note="a person's answer about resubmitting this payload came after the client stopped waiting; "
            "nothing was recorded or sent (the next start_operation asks again)",
            extra={},
        )
