"""What the console says about time and state, as a person reads it: pure functions of a record and `now`.

"next check in 12 s", "due 3 min ago — the agent has not checked", "deadline
passed 8 s ago", "expires in 3 min", and one sentence summing an operation up.
Times are rounded the way people say them (seconds under two minutes, then
minutes, then hours and minutes, then days).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pollwarden.core.records import ApprovalRecord, OperationRecord
from pollwarden.core.untrusted import quoted

__all__ = [
    "Needs",
    "approval_action",
    "deadline_words",
    "expires_words",
    "needs_person",
    "next_check_words",
    "relative",
    "span",
    "summary",
]


def span(seconds: float) -> str:
    """A duration as people say it: ``12 s``, ``3 min``, ``2 h 5 min``, ``3 d 4 h``."""
    s = round(abs(seconds))
    if s < 120:
        return f"{s} s"
    minutes = s // 60
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def relative(at: float, now: float) -> str:
    """``in 12 s``, ``3 min ago``, or ``now`` (within half a second)."""
    delta = at - now
    if abs(delta) < 0.5:
        return "now"
    return f"in {span(delta)}" if delta > 0 else f"{span(delta)} ago"


def next_check_words(record: OperationRecord, now: float) -> str | None:
    """When the agent may check next, and whether it is late; None when nothing is planned."""
    if not record.is_waiting:
        return None
    if record.next_check_at > now + 0.5:
        return f"next check {relative(record.next_check_at, now)}"
    if now - record.next_check_at < 5:
        return "next check due now"
    return f"due {span(now - record.next_check_at)} ago — the agent has not checked"


def deadline_words(record: OperationRecord, now: float) -> str:
    """``deadline in 4 min``, or ``deadline passed 8 s ago`` while it still waits (the next check stops it)."""
    if record.is_waiting and now >= record.deadline_at:
        return f"deadline passed {span(now - record.deadline_at)} ago"
    return f"deadline {relative(record.deadline_at, now)}" if record.is_waiting else "—"


def expires_words(approval: ApprovalRecord, now: float) -> str:
    """``expires in 3 min`` or ``expired 2 min ago``."""
    if now >= approval.expires_at:
        return f"expired {span(now - approval.expires_at)} ago"
    return f"expires in {span(approval.expires_at - now)}"


def approval_action(approval: ApprovalRecord, approve: bool) -> str:
    """What a decision's button says it decides (its visible words; the operation is named beside it)."""
    if approval.kind == "cancel":
        return "Cancel job at provider" if approve else "Keep job"
    what = str(approval.kind).replace("_", " ")
    return f"{'Approve' if approve else 'Deny'} {what}"


@dataclass(frozen=True)
class Needs:
    """Why an operation needs a person now (None in `needs_person` when it does not)."""

    why: str
    approval: ApprovalRecord | None = None


def needs_person(
    record: OperationRecord, open_approvals: Sequence[ApprovalRecord], now: float
) -> Needs | None:
    """An approval still decidable (the soonest to expire first), or a job awaiting review; else None."""
    live = sorted((a for a in open_approvals if a.expires_at > now), key=lambda a: a.expires_at)
    if live:
        first = live[0]
        kind = str(first.kind).replace("_", " ")
        return Needs(f"{kind} waiting for your decision, {expires_words(first, now)}", first)
    if record.stop_reason == "awaiting_review":
        return Needs("the provider is waiting for a person to review the job")
    return None


def summary(record: OperationRecord, needs: Needs | None, now: float, *, may_extend: bool = False) -> str:
    """One sentence for a person: where the operation is, what happens next, and whether they are needed.

    `may_extend`: whether the agent's view offers request_extension now (`approvals.offered_view`); the
    sentence says the agent may ask for more only then.
    """
    job_id = record.provider_job_id
    job = (
        f"{record.provider} job {quoted(job_id, limit=40)}"
        if job_id
        else f"{record.provider} (no job id yet)"
    )
    used = f"{record.status_requests_used} of {record.max_status_requests} status requests used"
    if record.is_waiting:
        state = f" (last state {quoted(record.state, limit=30)})" if record.state else ""
        parts = [
            f"Waiting on {job}{state}",
            next_check_words(record, now) or "",
            deadline_words(record, now),
            used,
        ]
        text = "; ".join(p for p in parts if p) + "."
        if now >= record.deadline_at:
            text += " Its polling deadline has passed: the agent's next check stops it."
        return text
    stopped = record.stopped_at if record.stopped_at is not None else record.updated_at
    reason = (record.stop_reason or record.status).replace("_", " ")
    text = f"{str(record.status).capitalize()} {relative(stopped, now)} ({reason}) after {used}; {job}."
    if needs is not None:
        text += f" Needs you: {needs.why}."
    elif record.status == "escalated" and may_extend:
        text += " Nothing is waiting for a decision: the agent may ask for more, or stop."
    elif record.status == "escalated":
        text += " Nothing is waiting for a decision, and the agent may not ask for more now (see Escalation)."
    return text
