"""Extensions and operator approvals: recording what a person decided.

Plain functions over the controller, which owns the store, the clock and the
operator caps; the pure clipping and the changes an extension makes live in
`extensions`. An approval is bound to the operation's version when asked, so
it is void if the operation changed in between.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING

from pollwarden.access.approval_policy import channel_of
from pollwarden.access.operator_keys import METHOD_ELICITATION, DecisionFacts, Verdict, authenticate
from pollwarden.access.policy_gate import stored_policy
from pollwarden.access.principals import current_principal
from pollwarden.config import ExtensionCaps
from pollwarden.core.errors import InvalidRequest
from pollwarden.core.records import ApprovalRecord, OperationRecord
from pollwarden.core.timefmt import iso, parse_iso
from pollwarden.core.untrusted import quoted
from pollwarden.core.vocabulary import ApprovalKind, ApprovalStatus, Outcome
from pollwarden.flows.approval_flow import LATE_ANSWER_BY, Approver, No
from pollwarden.ops import observe
from pollwarden.rules import extensions, questions
from pollwarden.rules.business_deadline import business_deadline
from pollwarden.rules.extensions import ExtensionDecision, ExtensionPlan, ExtensionResult, extension_changes
from pollwarden.rules.job_identity import reopen_next_check_at
from pollwarden.store import Store
from pollwarden.surface.views import OperationView, allowed_actions, operation_view, suggested_extension
from pollwarden_providers.table import ProviderTable

if TYPE_CHECKING:
    from pollwarden.flows.controller import Controller


async def plan_extension(
    controller: Controller,
    operation_id: str,
    *,
    extra_seconds: float,
    extra_status_requests: int,
    reason: str,
    new_business_deadline_at: str | None = None,
) -> ExtensionPlan:
    """Clip and explain a request for more time or requests (no side effects)."""

    record = await controller.load(operation_id)
    table = controller.table_for(record.provider)
    if not math.isfinite(extra_seconds) or extra_seconds < 0 or extra_status_requests < 0:
        raise InvalidRequest("extra_seconds and extra_status_requests must be zero or more")
    now = controller.clock.now()
    new_business = (
        business_deadline(new_business_deadline_at, now=now, name="new_business_deadline_at")
        if new_business_deadline_at is not None
        else None
    )
    plan = extensions.plan_extension(
        record,
        table,
        controller.config.caps,
        extra_seconds=extra_seconds,
        extra_status_requests=extra_status_requests,
        reason=reason,
        new_business_deadline_at=new_business,
        now=now,
    )
    if not plan.allowed:
        return plan
    verdict = await ask_verdict(controller.store, record, now=now, tidy=True)
    if verdict.open_approval_id is not None:
        approval = await controller.store.get_approval(verdict.open_approval_id)
        return plan.model_copy(
            update={
                "open_approval_id": verdict.open_approval_id,
                "open_approval_expires_at": approval.expires_at if approval else None,
            }
        )
    if not verdict.allowed:
        return plan.model_copy(update={"allowed": False, "refusal": verdict.refusal})
    return plan


async def ask_verdict(
    store: Store, record: OperationRecord, *, now: float, tidy: bool = False
) -> questions.AskVerdict:
    """Whether a person may be asked about more time for `record` now (`pollwarden.rules.questions`).

    A question asked about the operation as it was is no open question; with `tidy` (asking) it is
    also closed as void. A view only reads.
    """
    asks: list[questions.Ask] = []
    open_questions: list[questions.OpenQuestion] = []
    for approval in await store.list_approvals(operation_id=record.operation_id):
        if approval.kind != ApprovalKind.EXTENSION:
            continue
        declined = approval.status == ApprovalStatus.DENIED or (
            approval.status == ApprovalStatus.APPLIED and approval.note == "denied"
        )
        asks.append(questions.Ask(approval.decided_at or approval.asked_at, declined))
        if approval.status != ApprovalStatus.PENDING:
            continue
        if approval.bound_version != record.version:
            # Asked about the operation as it was: it could no longer apply, so it leaves the pending list.
            if tidy:
                await store.close_approval(
                    approval.approval_id,
                    status=ApprovalStatus.VOID,
                    at=now,
                    note="the operation changed after the question",
                    audit_kind="approval_void",
                )
            continue
        open_questions.append(questions.OpenQuestion(approval.approval_id, approval.expires_at))
    # Questions answered in the chat (elicitation) leave no approval, only their audit rows.
    for row in await store.audit_rows(record.operation_id):
        elicited_yes = row.kind == "extension_approved" and not row.payload_obj.get("note")
        if row.kind in ("extension_denied", "extension_cancelled") or elicited_yes:
            asks.append(questions.Ask(parse_iso(row.at), declined=not elicited_yes))
    return questions.may_ask(asks, open_questions, now=now, last_answer_at=record.last_http_at)


async def offered_view(
    store: Store,
    record: OperationRecord,
    table: ProviderTable | None,
    caps: ExtensionCaps,
    *,
    now: float,
    outcome: Outcome | None = None,
    retry_at: float | None = None,
) -> OperationView:
    """The operation view every door shows (the tools, the resources, the app card, the console).

    The one rule for offering request_extension: it is listed, and offered in the escalation, only when
    the call with the offered arguments would not be refused — inside the operator caps and the table's
    limits (`extensions.offered_extension_refusal`), and when a person may be asked again now (after a
    denial only with something new, at most `questions.MAX_QUESTIONS_PER_OPERATION` times).
    """
    asked = None
    if "request_extension" in allowed_actions(record, table):
        asked = await ask_verdict(store, record, now=now)
    return operation_view(
        record,
        table,
        now=now,
        outcome=outcome,
        suggestion=suggested_extension(caps.max_extra_seconds, caps.max_extra_status_requests),
        retry_at=retry_at,
        extension_check=partial(
            extensions.offered_extension_refusal, table=table, caps=caps, now=now, asked=asked
        ),
    )


async def apply_extension(
    controller: Controller,
    plan: ExtensionPlan,
    *,
    method: str,
    approval_id: str | None = None,
    by: str = "person",
) -> ExtensionResult:
    """Record an approved plan, only if the operation is still as it was when asked.

    `method` is how the decision was authenticated (see `operator_keys`); the audit keeps it.
    """
    record = await controller.load(plan.operation_id)
    table = controller.table_for(record.provider)
    now = controller.clock.now()
    if record.version != plan.bound_version:
        if approval_id is not None:
            await controller.store.close_approval(
                approval_id, status="void", at=now, note="the operation changed after the question"
            )
        return await _extension_result(
            controller,
            record,
            "void",
            "The approval is void: the operation changed (state, counters or deadline) after the person "
            "was asked. Ask again if it is still needed.",
            approval_id=approval_id,
        )
    changes = extension_changes(record, table, plan, now=now)
    updated = await controller.store.apply_extension(
        record.operation_id,
        bound_version=plan.bound_version,
        changes=changes,
        at=now,
        approval_id=approval_id,
        payload_extra={
            "extra_seconds": plan.extra_seconds,
            "extra_status_requests": plan.extra_status_requests,
            # What the person was shown they grant (the question's "Would change" lines), kept beside it.
            "grants": extensions.allowance_changes(record, table, plan),
            "new_business_deadline_at": plan.new_business_deadline_at,
            "approved_by": by,
            "authenticated_by": method,
            "delay_source": "manual_extension",
        },
    )
    if updated is None:
        return await _extension_result(
            controller,
            await controller.load(plan.operation_id),
            "void",
            "The approval is void: the operation changed while it was being recorded.",
            approval_id=approval_id,
        )
    return await _extension_result(
        controller,
        updated,
        "approved",
        f"Approved by {quoted(by)} ({method}): deadline now {iso(updated.deadline_at)}, "
        + (
            f"business deadline now {iso(updated.business_deadline_at)}, "
            if plan.new_business_deadline_at is not None
            else ""
        )
        + f"budget {updated.max_status_requests} "
        f"status requests ({updated.status_requests_used} used). Call check_status; the next check's "
        "delay source is manual_extension.",
        approval_id=approval_id,
        plan=plan,
    )


async def record_answer(
    controller: Controller, plan: ExtensionPlan, decision: str, *, method: str | None = None
) -> ExtensionResult:
    """Audit a person's deny or cancel (with how the answer was authenticated); nothing else changes."""
    record = await controller.load(plan.operation_id)
    kind = "extension_denied" if decision == "denied" else "extension_cancelled"
    await controller.store.audit_event(
        plan.operation_id,
        kind=kind,
        at=controller.clock.now(),
        note=f"asked +{plan.extra_seconds:g} s, +{plan.extra_status_requests} checks",
        extra={"authenticated_by": method} if method else {},
    )
    text = (
        "The person denied the extension"
        if decision == "denied"
        else "The question was dismissed without an answer (cancelled)"
    )
    return _without_asking(
        await _extension_result(
            controller,
            record,
            decision,
            f"{text}; nothing changed. "
            + _after_no(record, await ask_verdict(controller.store, record, now=controller.clock.now())),
        )
    )


async def record_late_answer(
    controller: Controller,
    *,
    operation_id: str,
    kind: str,
    request: Mapping[str, object],
    approve: bool | None,
    answer: str,
    bound_version: int | None = None,
) -> None:
    """Record an answer that arrived after the client stopped waiting for the tool call.

    An approve or deny becomes the person's decision on an approval, which the
    agent's next call applies as it would an operator's (check_status for an
    extension, cancel_operation for a cancel). No usable answer is audited and
    changes nothing. With `bound_version` (the operation's version the person
    was asked about), an answer to a question about an operation that changed
    since is audited as void and changes nothing: it is not bound to the
    operation as it is now.
    """
    now = controller.clock.now()
    if approve is None:
        await controller.store.audit_event(
            operation_id,
            kind=f"{kind}_unanswered",
            at=now,
            note=f"the client stopped waiting for the answer; {answer}; nothing changed",
            extra={},
        )
        return
    record = await controller.load(operation_id)
    if bound_version is not None and record.version != bound_version:
        await controller.store.audit_event(
            operation_id,
            kind=f"{kind}_void",
            at=now,
            note=(
                f"the person answered after the client stopped waiting and after the operation changed "
                f"(version {bound_version} → {record.version}); nothing changed, ask again if still needed"
            ),
            extra={},
        )
        return
    approval = await open_question(controller, record, kind, request)
    await controller.store.decide_approval(
        approval.approval_id, approve=approve, by=LATE_ANSWER_BY, at=now, method=METHOD_ELICITATION
    )


async def request_operator_approval(controller: Controller, plan: ExtensionPlan) -> ExtensionResult:
    """Record a pending approval for an operator to decide outside the chat."""
    record = await controller.load(plan.operation_id)
    approval = await open_question(controller, record, ApprovalKind.EXTENSION, plan.model_dump(mode="json"))
    return await _extension_result(
        controller,
        record,
        "pending_approval",
        operator_must_decide(approval.approval_id, approval.expires_at)
        + " Then call check_status once: it applies the decision. Do not poll in between.",
        approval_id=approval.approval_id,
    )


class ExtensionFlow:
    """request_extension through the one approval flow (`approval_flow`); an operator's decision is applied
    by the agent's next check_status (`apply_decided_approvals`), not here."""

    tool = "request_extension"
    schema = ExtensionDecision
    yes = "approve"

    def asks(self, plan: ExtensionPlan) -> bool:
        """A person is asked only about an allowed extension, and not while a question already waits."""
        return plan.allowed and plan.open_approval_id is None

    def question(self, plan: ExtensionPlan) -> str:
        """The plan's facts, clipped to the operator caps."""
        return plan.question

    async def late(
        self, controller: Controller, plan: ExtensionPlan, approve: bool | None, missing: str
    ) -> None:
        """A late answer becomes the person's decision on an approval (applied by the next check_status)."""
        await record_late_answer(
            controller,
            operation_id=plan.operation_id,
            kind=ApprovalKind.EXTENSION,
            request=plan.model_dump(mode="json"),
            approve=approve,
            answer=missing,
        )

    async def settled(self, controller: Controller, plan: ExtensionPlan) -> ExtensionResult | None:
        """A structured refusal when the extension is not allowed; the question already open, if one is."""
        if plan.open_approval_id is not None:
            return await _extension_result(
                controller,
                await controller.load(plan.operation_id),
                "pending_approval",
                questions.open_question_message(plan.open_approval_id, plan.open_approval_expires_at or 0.0),
                approval_id=plan.open_approval_id,
            )
        return (
            None
            if plan.allowed
            else await refused(controller, plan, await controller.load(plan.operation_id))
        )

    async def approve(
        self, controller: Controller, plan: ExtensionPlan, approver: Approver
    ) -> ExtensionResult:
        """Apply the approved plan."""
        observe.approval_decided(approver.method, approve=True)
        return await apply_extension(controller, plan, by=approver.by, method=approver.method)

    async def deny(self, controller: Controller, plan: ExtensionPlan, no: No) -> ExtensionResult:
        """Audit the denial (or dismissal); nothing changes."""
        if no == "denied":
            observe.approval_decided(METHOD_ELICITATION, approve=False)
        return await record_answer(controller, plan, no, method=METHOD_ELICITATION)

    async def ask_operator(self, controller: Controller, plan: ExtensionPlan) -> ExtensionResult:
        """Record a pending approval for an operator."""
        return await request_operator_approval(controller, plan)


EXTENSION = ExtensionFlow()


def new_approval_id() -> str:
    """A fresh approval id (``ap-`` and ten hex digits)."""
    return f"ap-{uuid.uuid4().hex[:10]}"


async def open_question(
    controller: Controller, record: OperationRecord, kind: str, request: Mapping[str, object]
) -> ApprovalRecord:
    """Record a pending approval bound to `record` as it is now, for an operator to decide before its TTL."""
    return await controller.store.open_approval(
        approval_id=new_approval_id(),
        record=record,
        kind=kind,
        request=request,
        at=controller.clock.now(),
        ttl_seconds=controller.config.approval_ttl_seconds,
    )


def operator_must_decide(approval_id: str, expires_at: float) -> str:
    """What the agent is told when a person must decide outside the chat: who, where and why, never a command."""
    why = (
        "on this server an operator decides every approval (an agent's own client never answers one)"
        if current_principal().authenticated
        else "this client cannot show them the question"
    )
    return (
        f"A person must decide, and {why}. It waits as approval "
        f"{approval_id} for an operator, who reads it and decides at the operator's own terminal or console "
        f"(not in this chat, and not by an agent) before {iso(expires_at)}."
    )


async def expire_stale(controller: Controller, approval: ApprovalRecord, now: float) -> bool:
    """Close a question nobody decided before its TTL as expired (audited); whether it was one."""
    if approval.status != ApprovalStatus.PENDING or now < approval.expires_at:
        return False
    await controller.store.close_approval(
        approval.approval_id,
        status=ApprovalStatus.EXPIRED,
        at=now,
        note="nobody decided in time",
        audit_kind="approval_expired",
    )
    return True


def decision_facts(approval: ApprovalRecord) -> DecisionFacts:
    """What an operator's signature on this decision covers."""
    return DecisionFacts(
        approval_id=approval.approval_id,
        operation_id=approval.operation_id,
        kind=approval.kind,
        bound_version=approval.bound_version,
        request_json=approval.request_json,
        decision=approval.status,
        decided_at=approval.decided_at or 0.0,
        decided_by=approval.decided_by or "",
    )


async def check_operator_decision(controller: Controller, approval: ApprovalRecord) -> Verdict:
    """Authenticate a decision recorded outside the client before it is used; void and audit a refused one."""
    config, stored = await stored_policy(controller.store, controller.config)  # as the database says now
    verdict = authenticate(
        decision_facts(approval),
        approval.decided_method,
        approval.decision_signature,
        config.operator,
    )
    if verdict.ok and (channel := channel_of(approval.decided_method or "")) not in stored.channels:
        verdict = Verdict(
            False, verdict.method, f"the database's approval policy does not count the {channel} channel"
        )
    if not verdict.ok:
        now = controller.clock.now()
        await controller.store.close_approval(
            approval.approval_id, status=ApprovalStatus.VOID, at=now, note=f"refused: {verdict.reason}"
        )
        await controller.store.audit_event(
            approval.operation_id,
            kind="approval_refused",
            at=now,
            note=f"{approval.approval_id} ({approval.status} by {approval.decided_by}, {verdict.method}) "
            f"refused: {verdict.reason}",
            extra={"authenticated_by": verdict.method},
        )
    return verdict


async def apply_decided_approvals(controller: Controller, record: OperationRecord) -> OperationRecord:
    """Apply an operator's CLI decision on the agent's next check; expire or void stale ones.

    A decision is applied only after `check_operator_decision` accepts how it was
    authenticated (a signature that does not verify, or an unsigned decision when
    the operator requires a key, voids the approval and is audited).
    """
    approvals = await controller.store.list_approvals(operation_id=record.operation_id)
    now = controller.clock.now()
    for approval in approvals:
        if approval.kind == ApprovalKind.REOPEN:
            if approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
                await _apply_reopen(controller, approval)
            continue
        if approval.kind != ApprovalKind.EXTENSION:
            continue  # a cancel approval is used by the next cancel_operation call
        if await expire_stale(controller, approval, now):
            continue
        if approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
            verdict = await check_operator_decision(controller, approval)
            if not verdict.ok:
                continue
            if approval.status == ApprovalStatus.DENIED:
                await controller.store.close_approval(
                    approval.approval_id, status=ApprovalStatus.APPLIED, at=now, note="denied"
                )
                continue
            plan = ExtensionPlan.model_validate(approval.request)
            await apply_extension(
                controller,
                plan,
                method=verdict.method,
                approval_id=approval.approval_id,
                by=approval.decided_by or "operator",
            )
    return await controller.load(record.operation_id)


async def _apply_reopen(controller: Controller, approval: ApprovalRecord) -> None:
    """An operator's recorded reopen takes effect only once this server verified who decided it."""
    verdict = await check_operator_decision(controller, approval)
    if not verdict.ok:
        return  # voided and audited as approval_refused
    now = controller.clock.now()
    record = await controller.load(approval.operation_id)
    request = approval.request
    reopened = None
    if approval.status == ApprovalStatus.APPROVED:
        reopened = await controller.store.reopen(
            approval.operation_id,
            bound_version=approval.bound_version,
            next_check_at=reopen_next_check_at(record, now),
            at=now,
            extra={
                "reason": request.get("reason"),
                "reopened_by": approval.decided_by,
                "authenticated_by": verdict.method,
                "approval_id": approval.approval_id,
                "signature": approval.decision_signature,
                "signed_request": approval.request_json,
                "stop_reason_before": request.get("stop_reason"),
                "bound_version": approval.bound_version,
                "decided_at": approval.decided_at,
            },
        )
    await controller.store.close_approval(
        approval.approval_id,
        status=ApprovalStatus.APPLIED if reopened is not None else ApprovalStatus.VOID,
        at=now,
        note="reopened" if reopened is not None else "the operation changed after the reopen was decided",
    )


async def _extension_result(
    controller: Controller,
    record: OperationRecord,
    decision: str,
    message: str,
    *,
    approval_id: str | None = None,
    plan: ExtensionPlan | None = None,
) -> ExtensionResult:
    return ExtensionResult(
        operation_id=record.operation_id,
        decision=decision,  # type: ignore[arg-type]
        message=message,
        approval_id=approval_id,
        granted_extra_seconds=plan.extra_seconds if plan else 0,
        granted_extra_status_requests=plan.extra_status_requests if plan else 0,
        clipped=plan.clipped if plan else [],
        operation=await controller.view(record),
    )


async def refused(controller: Controller, plan: ExtensionPlan, record: OperationRecord) -> ExtensionResult:
    """A structured refusal naming why and what is allowed (never request_extension while it is refused)."""
    return _without_asking(
        await _extension_result(controller, record, "refused", f"Refused: {plan.refusal}.")
    )


def _without_asking(result: ExtensionResult) -> ExtensionResult:
    """`result` with request_extension left out of its allowed actions: asking again now would be refused."""
    allowed = [a for a in result.operation.allowed_actions if a != "request_extension"]
    return result.model_copy(
        update={"operation": result.operation.model_copy(update={"allowed_actions": allowed})}
    )


def _after_no(record: OperationRecord, asked: questions.AskVerdict) -> str:
    """After a denial: what may come next; request_extension only with something new (`pollwarden.rules.questions`).

    `asked` is whether a person may be asked again, the denial counted: once the bound is reached, it
    says no more questions are asked rather than when to ask again.
    """
    others = [a for a in record_allowed(record) if a != "request_extension"]
    text = "Allowed next: " + (", ".join(others) or "nothing; a person takes over") + "."
    if "request_extension" not in record_allowed(record):
        return text
    if not asked.allowed and asked.again_at is None:
        return text + f" A denial is an answer, and {asked.refusal}."
    again = f"from {iso(asked.again_at)}" if asked.again_at is not None else "later"
    return text + (
        f" A denial is an answer: request_extension again only with something new — a new answer from the "
        f"provider, or {again} — and at most {questions.MAX_QUESTIONS_PER_OPERATION} questions per operation."
    )


def record_allowed(record: OperationRecord) -> list[str]:
    """Allowed actions without a table (for messages)."""
    return allowed_actions(record, None)


# -- what an operator reads ------------------------------------------------------------------------


def describe_request(approval: ApprovalRecord) -> str:
    """What the approval asks for, in a few words (a cancel is described as a cancel)."""
    if approval.kind == "cancel":
        return "asks to cancel the job at the provider (one cancel call; the job's work is lost)"
    if approval.kind == ApprovalKind.RESUBMISSION:
        return (
            f"asks to resubmit the payload of {quoted(approval.request.get('resubmission_of', '?'))} "
            "as a new job (one submission)"
        )
    if approval.kind == ApprovalKind.STATUS_REQUEST:
        return "asks to send one status request (the provider table requires a person for each)"
    request = approval.request
    if approval.kind == ApprovalKind.REOPEN:
        return f"asks to reopen it after {request.get('stop_reason')} (reason: {quoted(str(request.get('reason')))})"
    return (
        f"asks +{float(request.get('extra_seconds', 0)):g} s, "
        f"+{int(request.get('extra_status_requests', 0))} status requests"
    )


def what_happens_next(approval: ApprovalRecord) -> str:
    """After a decision: what happens, and when, for this kind of approval."""
    if approval.kind == ApprovalKind.REOPEN:
        return (
            "the agent's next check_status reopens it once the server verified who decided (inside the same "
            "budget and deadline); nothing is sent before that call"
        )
    if approval.kind == "cancel":
        if approval.status == "approved":
            return (
                "the agent's next cancel_operation call sends the provider's documented cancel call, once "
                "(never retried, nothing resubmitted); nothing is sent before that call"
            )
        return "the job is kept; no cancel call is sent"
    if approval.kind == ApprovalKind.RESUBMISSION:
        if approval.status == "approved":
            return (
                "the agent's next start_operation with the same operation_id submits the payload, once; "
                "nothing is sent before that call"
            )
        return "nothing is submitted; the held operation stays unsent"
    if approval.kind == ApprovalKind.STATUS_REQUEST:
        if approval.status == "approved":
            return "the agent's next check_status sends one status request (when the schedule allows)"
        return "no status request is sent"
    if approval.status == "approved":
        return (
            f"the agent's next check_status applies it ({describe_request(approval).removeprefix('asks ')}; "
            "counters are kept); nothing changes before that call"
        )
    return "nothing changes; the agent's next check_status still answers stopped and sees the denial"
