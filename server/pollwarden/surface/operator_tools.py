"""Deciding approvals over authenticated HTTP: the ``pollwarden:operator`` scope's own tools.

The local operator decides at a terminal (`pollwarden approve`); a team's
operator may instead call `list_approvals` and `decide_approval` with a token
carrying ``pollwarden:operator``. Nobody decides a request about an operation
they own: an agent (even one holding the operator scope, even with a client that
approves every tool call) never approves its own extension or cancel. Over
stdio the caller is the agent itself, so these tools refuse it too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from pollwarden.access.operator_keys import METHOD_HTTP_OPERATOR, REQUIRE_ENV
from pollwarden.access.policy_gate import stored_policy
from pollwarden.access.principals import SCOPE_OPERATOR, Principal
from pollwarden.core.errors import InvalidRequest
from pollwarden.core.records import ApprovalRecord
from pollwarden.core.timefmt import iso
from pollwarden.core.untrusted import shown
from pollwarden.flows.approvals import describe_request, what_happens_next
from pollwarden.flows.controller import Controller
from pollwarden.flows.operator_decision import decide

__all__ = ["ApprovalList", "ApprovalSummary", "DecisionResult", "decide_approval", "list_approvals"]


class ApprovalSummary(BaseModel):
    """One approval as an operator reads it."""

    approval_id: str
    operation_id: str
    owner: str
    kind: str
    status: str
    request: str
    asked_at: str
    expires_at: str


class ApprovalList(BaseModel):
    """Approvals, newest first."""

    approvals: list[ApprovalSummary]
    count: int


class DecisionResult(BaseModel):
    """What an operator's decision did."""

    approval_id: str
    operation_id: str
    status: str
    decided_by: str
    next: str


def _require_operator(principal: Principal, tool: str) -> None:
    if not (principal.authenticated and principal.operator):
        raise InvalidRequest(
            f"{tool} is for operators (a bearer token with the {SCOPE_OPERATOR} scope over HTTP); an agent "
            "does not decide approvals. A person decides outside this chat: in the operator console, or with "
            "the operator's own command line at their own terminal"
        )


async def _summary(controller: Controller, approval: ApprovalRecord) -> ApprovalSummary:
    record = await controller.store.get(approval.operation_id)
    return ApprovalSummary(
        approval_id=approval.approval_id,
        operation_id=approval.operation_id,
        owner=record.owner if record is not None else "unknown",
        kind=approval.kind,
        status=approval.status,
        request=describe_request(approval),
        asked_at=iso(approval.asked_at) or "",
        expires_at=iso(approval.expires_at) or "",
    )


async def list_approvals(controller: Controller, principal: Principal, *, everything: bool) -> ApprovalList:
    """Pending approvals (every one with `everything`), for an operator."""
    _require_operator(principal, "list_approvals")
    approvals = await controller.store.list_approvals(status=None if everything else "pending")
    summaries = [await _summary(controller, a) for a in approvals]
    return ApprovalList(approvals=summaries, count=len(summaries))


async def decide_approval(
    controller: Controller, principal: Principal, approval_id: str, decision: Literal["approve", "deny"]
) -> DecisionResult:
    """Approve or deny a pending approval as an authenticated operator who does not own the operation.

    The decision goes through `operator_decision.decide`, the guarded, audited path
    `pollwarden approve` and the console use: recorded once, by the principal's
    name, authenticated as ``http-operator``; the controller checks it again
    before applying it.
    """
    _require_operator(principal, "decide_approval")
    approval = await controller.store.get_approval(approval_id)
    if approval is None:
        raise InvalidRequest(f"no approval {shown(approval_id)}; list_approvals shows the pending ones")
    record = await controller.store.get(approval.operation_id)
    if record is not None and record.owner == principal.name:
        raise InvalidRequest(
            f"approval {shown(approval_id)} is about your own operation: another operator must decide it "
            "(nobody approves their own extension or cancel)"
        )
    if (await stored_policy(controller.store, controller.config))[0].operator.require_key:
        raise InvalidRequest(
            f"this server requires every decision to be signed with an operator key ({REQUIRE_ENV}), which a "
            "bearer token is not; decide with the operator's command line and the operator key, or in a console "
            "started with it. Nothing was decided"
        )
    decided = await decide(
        controller.store,
        approval_id,
        approve=decision == "approve",
        by=principal.name,
        at=controller.clock.now(),
        method=METHOD_HTTP_OPERATOR,
    )
    if not decided.ok or decided.approval is None:
        raise InvalidRequest(decided.message)
    return DecisionResult(
        approval_id=approval_id,
        operation_id=decided.approval.operation_id,
        status=decided.approval.status,
        decided_by=principal.name,
        next=what_happens_next(decided.approval),
    )
