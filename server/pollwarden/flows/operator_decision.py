"""One decision path for a person deciding outside the MCP client.

`pollwarden approve`/`deny` and the operator console both call `decide`: it
records the answer on a pending approval (signed with the operator key when
there is one) and says what happens next, or why nothing was decided. The
store's guarded transaction decides each approval at most once and voids an
approval whose operation changed since the person was asked; the controller
authenticates the decision again before it applies it (`operator_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pollwarden.access.operator_keys import OperatorKey
from pollwarden.core.records import ApprovalRecord
from pollwarden.core.timefmt import iso
from pollwarden.core.untrusted import quoted
from pollwarden.core.vocabulary import ApprovalStatus
from pollwarden.flows.approvals import decision_facts, describe_request, what_happens_next
from pollwarden.ops import observe
from pollwarden.store import Store

__all__ = ["Decision", "decide", "header", "refusal"]


@dataclass(frozen=True)
class Decision:
    """What `decide` did: `ok` when this call decided; `message` says what happens next or why not."""

    ok: bool
    approval: ApprovalRecord | None
    message: str


def header(approval: ApprovalRecord) -> str:
    """One line naming an approval: id, status, operation, what it asks, when asked and until when."""
    return (
        f"{quoted(approval.approval_id)}  {approval.status:<8} {quoted(approval.operation_id)}  "
        f"{describe_request(approval)}  (asked {iso(approval.asked_at)}, expires {iso(approval.expires_at)})"
    )


def refusal(approval: ApprovalRecord) -> str:
    """Why an approval that is no longer pending was not decided now."""
    approval_id = quoted(approval.approval_id)
    if approval.status == ApprovalStatus.EXPIRED:
        return f"{approval_id} had expired at {iso(approval.expires_at)}; nothing was approved"
    if approval.status == ApprovalStatus.VOID:
        return (
            f"{approval_id} is void: operation {quoted(approval.operation_id)} changed (state, counters "
            "or deadline) after the person was asked; nothing was approved — the agent must ask again"
        )
    return f"{approval_id} is already {quoted(approval.status)}; nothing changed"


def not_found(approval_id: str) -> str:
    """The message for an approval id that does not exist."""
    return f"no approval {quoted(approval_id)}; `pollwarden approvals list` shows the pending ones"


async def decide(
    store: Store,
    approval_id: str,
    *,
    approve: bool,
    by: str,
    at: float,
    method: str,
    key: OperatorKey | None = None,
) -> Decision:
    """Record a person's approve or deny on a pending approval, once.

    `method` is how the person was authenticated (``tty``, ``console``); with
    `key` the decision is signed and recorded as ``operator-key:<id>`` instead.
    A second decision on the same approval, an expired approval, and an
    approval whose operation changed since it was asked are refused with the
    reason; nothing else changes.
    """
    approval = await store.get_approval(approval_id)
    if approval is None:
        return Decision(False, None, not_found(approval_id))
    if approval.status != ApprovalStatus.PENDING:
        return Decision(False, approval, refusal(approval))
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
    recorded_method = key.method if key is not None else method
    facts = replace(decision_facts(approval), decision=status, decided_at=at, decided_by=by)
    decided = await store.decide_approval(
        approval_id,
        approve=approve,
        by=by,
        at=at,
        method=recorded_method,
        signature=facts.sign(key) if key is not None else None,
    )
    mine = (
        decided is not None
        and decided.status == status
        and decided.decided_at == at
        and decided.decided_by == by
        and decided.decided_method == recorded_method
    )
    if decided is None or not mine:
        # Expired or void now, or another decision got there first: the store kept the first one.
        return Decision(False, decided or approval, refusal(decided or approval))
    observe.approval_decided(method, approve=approve)  # the channel, never the key's id
    return Decision(
        True,
        decided,
        f"{quoted(approval_id)} {decided.status} for {quoted(decided.operation_id)} by {quoted(by)} "
        f"({recorded_method}): {what_happens_next(decided)}",
    )
