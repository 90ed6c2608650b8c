"""More time or more requests: a new authorization, planned here as pure functions.

`plan_extension` clips what the agent asked for to the operator's caps and the
provider table's limits and writes the question a person sees, using only
recorded facts (so a repeated question reads the same). `extension_changes`
turns an approved plan into the columns to update. Counters are never reset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, Field

from pollwarden.config import ExtensionCaps
from pollwarden.core.records import OperationRecord
from pollwarden.core.timefmt import iso, parse_iso, to_datetime
from pollwarden.core.untrusted import quoted
from pollwarden.rules.job_identity import REOPENABLE
from pollwarden.rules.questions import AskVerdict
from pollwarden.surface.views import (
    OperationView,
    allowed_actions,
    business_deadline_passed,
    elapsed_until_stop,
    human_duration,
)
from pollwarden_providers.table import ProviderTable

EXTENDABLE = (
    "deadline_exceeded",
    "request_budget_exhausted",
    "rate_limited",
    "unknown_state",
    "delivery_ambiguous",
    "awaiting_review",  # a person acted at the provider: wait again on the same budget
)


class ExtensionDecision(BaseModel):
    """What the person is asked: a flat, bounded choice."""

    decision: Literal["approve", "deny"] = Field(description="approve the stated addition, or deny it")


class ExtensionPlan(BaseModel):
    """The clipped request and the question for a person."""

    operation_id: str
    allowed: bool
    refusal: str | None = None
    stop_reason: str | None = None
    requested_seconds: float = 0
    requested_status_requests: int = 0
    extra_seconds: float = 0
    extra_status_requests: int = 0
    clipped: list[str] = Field(default_factory=list[str])
    bound_version: int = 0
    question: str = ""
    reason: str = ""
    # A new business deadline (epoch seconds) a person sets with the approval: the way forward once the
    # old one passed (README "Stop reasons"); None keeps the recorded one.
    new_business_deadline_at: float | None = None
    # A question about this operation already waits for an operator (pollwarden.rules.questions): answered with it.
    open_approval_id: str | None = None
    open_approval_expires_at: float | None = None


def _hhmm(at: float) -> str:
    return to_datetime(at).strftime("%H:%M UTC")


def plan_extension(
    record: OperationRecord,
    table: ProviderTable,
    caps: ExtensionCaps,
    *,
    extra_seconds: float,
    extra_status_requests: int,
    reason: str,
    new_business_deadline_at: float | None = None,
    now: float | None = None,
) -> ExtensionPlan:
    """Clip the request to the caps and explain it; `allowed=False` names why not.

    Once the business deadline has passed (at the stop, or by `now`), more waiting
    cannot meet it: only a request that sets `new_business_deadline_at` (a person
    decides the result is still worth having) is allowed.
    """
    base = ExtensionPlan(
        operation_id=record.operation_id,
        allowed=False,
        stop_reason=record.stop_reason,
        requested_seconds=extra_seconds,
        requested_status_requests=extra_status_requests,
        bound_version=record.version,
        reason=reason[:300],
        new_business_deadline_at=new_business_deadline_at,
    )
    if record.status == "waiting":
        return base.model_copy(
            update={
                "refusal": "the operation is still waiting inside its approved bounds; an extension is asked "
                "for at the escalation boundary, not in advance — keep calling check_status"
            }
        )
    if "request_extension" not in allowed_actions(record, table):
        return base.model_copy(
            update={
                "refusal": f"request_extension is not allowed after {record.stop_reason or record.status}; "
                f"allowed actions: {allowed_actions(record, table) or 'none'}"
                + (
                    " — a person must fix the cause (the credentials, the provider table or the account) and an "
                    "operator must reopen this operation at their own terminal; until then nothing is sent for "
                    "this job under any operation id, and an identical request would fail again"
                    if record.stop_reason in REOPENABLE
                    else ""
                )
            }
        )
    if record.extensions_used >= caps.max_extensions_per_operation:
        return base.model_copy(
            update={
                "refusal": f"this operation already had {record.extensions_used} extension(s), the operator's "
                f"limit ({caps.max_extensions_per_operation}); a new operation for the same job gets this one back, so a "
                "person decides at the provider's console"
            }
        )
    if business_deadline_passed(record, now) and new_business_deadline_at is None:
        return base.model_copy(update={"refusal": business_deadline_refusal(record)})
    clipped: list[str] = []
    seconds = max(0.0, float(extra_seconds))
    if seconds > caps.max_extra_seconds:
        clipped.append(f"extra_seconds {seconds:g} clipped to the operator cap {caps.max_extra_seconds:g}")
        seconds = caps.max_extra_seconds
    room_seconds = max(0.0, table.limits.max_deadline_seconds - (record.deadline_at - record.started_at))
    if seconds > room_seconds:
        clipped.append(
            f"extra_seconds clipped to {room_seconds:g}: the table's max_deadline_seconds is "
            f"{table.limits.max_deadline_seconds:g}"
        )
        seconds = room_seconds
    requests = max(0, int(extra_status_requests))
    if record.stop_reason == "unknown_state":
        requests = max(1, requests)
    if requests > caps.max_extra_status_requests:
        clipped.append(
            f"extra_status_requests {requests} clipped to the operator cap {caps.max_extra_status_requests}"
        )
        requests = caps.max_extra_status_requests
    room_requests = max(0, table.limits.max_status_requests - record.max_status_requests)
    if requests > room_requests:
        clipped.append(
            f"extra_status_requests clipped to {room_requests}: the table's max_status_requests is "
            f"{table.limits.max_status_requests}"
        )
        requests = room_requests
    budget_left = record.max_status_requests - record.status_requests_used
    if budget_left + requests <= 0:
        return base.model_copy(
            update={
                "clipped": clipped,
                "refusal": "no status requests are left under the caps to extend with",
            }
        )
    if seconds <= 0 and record.stopped_at is not None and record.stopped_at >= record.deadline_at:
        return base.model_copy(
            update={
                "clipped": clipped,
                "refusal": "no time is left under the caps to extend the deadline with",
            }
        )
    plan = base.model_copy(
        update={
            "allowed": True,
            "extra_seconds": seconds,
            "extra_status_requests": requests,
            "clipped": clipped,
        }
    )
    return plan.model_copy(update={"question": extension_question(record, table, plan)})


def offered_extension_refusal(
    record: OperationRecord,
    arguments: Mapping[str, object],
    *,
    table: ProviderTable | None,
    caps: ExtensionCaps,
    now: float,
    asked: AskVerdict | None = None,
) -> str | None:
    """Why request_extension with the escalation's `arguments` would be refused now, or None (`views.ExtensionCheck`).

    `asked`: whether a person may be asked again now (`approvals.ask_verdict`); after a denial a view then
    leaves request_extension out until something new allows asking (`pollwarden.rules.questions`).
    """
    if table is None:
        return None  # nothing is decided without the table: the call names the loaded ones
    seconds, requests = arguments.get("extra_seconds"), arguments.get("extra_status_requests")
    business = arguments.get("new_business_deadline_at")
    plan = plan_extension(
        record,
        table,
        caps,
        extra_seconds=float(seconds) if isinstance(seconds, int | float) else 0.0,
        extra_status_requests=requests if isinstance(requests, int) else 0,
        reason="",
        new_business_deadline_at=parse_iso(business) if isinstance(business, str) else None,
        now=now,
    )
    if not plan.allowed:
        return plan.refusal
    return asked.refusal if asked is not None and not asked.allowed else None


def business_deadline_refusal(record: OperationRecord) -> str:
    """Why more waiting alone is refused after the business deadline, and the one way forward."""
    return (
        f"the business deadline {iso(record.business_deadline_at)} has passed, so more waiting cannot meet it. "
        "If the result is still worth having, ask for a new business deadline: request_extension with "
        "new_business_deadline_at (an RFC 3339 time after now) and the time and checks it needs; a person "
        "approves it like any extension"
    )


def _deadline_if_approved(record: OperationRecord, table: ProviderTable, plan: ExtensionPlan) -> str:
    """The polling deadline an approval sets, as `extension_changes` computes it, in words a person checks."""
    stopped = record.stopped_at if record.stopped_at is not None else record.updated_at
    cap = record.started_at + table.limits.max_deadline_seconds
    extra = human_duration(plan.extra_seconds)
    if record.stop_reason == "unknown_state":
        return (
            f"the later of the current deadline {_hhmm(record.deadline_at)} and "
            f"{human_duration(table.schedule.max_delay_seconds)} after the pause ends"
        )
    if record.deadline_at > stopped:
        # Counted from the current deadline while it is ahead: approved before it, the person grants more
        # than "extra after approval".
        until = min(cap, record.deadline_at + plan.extra_seconds)
        return (
            f"{_hhmm(until)} ({extra} after the current deadline {_hhmm(record.deadline_at)}) if approved "
            f"before {_hhmm(record.deadline_at)}; approved later, {extra} after approval"
            + (f", never past {_hhmm(cap)} (the table's max_deadline_seconds)" if until >= cap else "")
        )
    return f"{extra} after approval (at the earliest {_hhmm(min(cap, stopped + plan.extra_seconds))})"


def allowance_changes(record: OperationRecord, table: ProviderTable, plan: ExtensionPlan) -> list[str]:
    """Every limit an approval of `plan` changes ("Resulting …", one line each): what the question, the
    operator views and the audit show (the same lines, so a person is never granted more than they read)."""
    lines = [
        f"Resulting budget: {record.max_status_requests + plan.extra_status_requests} status requests "
        f"({record.status_requests_used} used)",
        f"Resulting deadline: {_deadline_if_approved(record, table, plan)}",
    ]
    if plan.new_business_deadline_at is not None:
        was = iso(record.business_deadline_at) if record.business_deadline_at is not None else "none"
        lines.append(f"Resulting business deadline: {iso(plan.new_business_deadline_at)} (was {was})")
    if record.stop_reason == "delivery_ambiguous":
        lines.append(
            f"Resulting transport failures allowed: {record.transport_failures_used + table.limits.max_transport_failures} "
            f"({record.transport_failures_used} of {record.max_transport_failures} used; "
            f"{table.limits.max_transport_failures} more)"
        )
    if record.stop_reason == "rate_limited":
        lines.append(
            f"Resulting rate-limited answers allowed: {record.rate_limited_used + table.limits.max_rate_limited} "
            f"({record.rate_limited_used} of {record.max_rate_limited} used; {table.limits.max_rate_limited} more); "
            f"the first check waits at least {table.schedule.base_delay_seconds:g} s after approval"
        )
    return lines


def extension_question(record: OperationRecord, table: ProviderTable, plan: ExtensionPlan) -> str:
    """The facts a person needs, from recorded values only."""
    stopped = record.stopped_at if record.stopped_at is not None else record.updated_at
    earliest_deadline = max(record.deadline_at, stopped) + plan.extra_seconds
    business = plan.new_business_deadline_at or record.business_deadline_at
    if record.stop_reason == "unknown_state":
        addition = (
            f"a pause of {human_duration(plan.extra_seconds)}, then {plan.extra_status_requests} more check(s) "
            f"of the unknown state {quoted(record.state, bare_tokens=False)}"
        )
    else:
        addition = f"{human_duration(plan.extra_seconds)} more and {plan.extra_status_requests} more status request(s)"
    # Every value an agent or a provider supplied is rendered on one line and quoted
    # (untrusted.quoted), so none of them can add a line to the question.
    lines = [
        f"Approve more waiting for {quoted(record.operation_id)}?",
        f"Provider job: {quoted(record.provider_job_id)} ({quoted(record.provider)})",
        f"State: {quoted(record.state) if record.state else '(none)'}; stopped because {record.stop_reason}",
        f"Elapsed: {human_duration(elapsed_until_stop(record, stopped))}",
        f"Status requests used: {record.status_requests_used} of {record.max_status_requests}",
        f"Would add: {addition}",
        *allowance_changes(record, table, plan),
    ]
    if business is not None:
        if earliest_deadline > business:
            lines.append(
                f"Impact: the new deadline falls after the business deadline {_hhmm(business)}; "
                "waiting stops at the business deadline"
            )
        else:
            lines.append(f"Impact: still before the business deadline {_hhmm(business)}")
    if plan.clipped:
        lines.append("Clipped: " + "; ".join(plan.clipped))
    if plan.reason:
        lines.append(f"Agent's reason (untrusted): {quoted(plan.reason, limit=300, bare_tokens=False)}")
    lines.append("Choices: approve or deny. Counters are kept; nothing is resubmitted.")
    return "\n".join(lines)


def earliest_next_request(record: OperationRecord, table: ProviderTable, *, now: float) -> tuple[float, bool]:
    """The earliest a status request may follow an approval, and whether a Retry-After decides it.

    Never before `now`, never before the operation's earliest allowed request
    (`not_before_at`: a `Retry-After` still in force, a timed-out request), and
    never sooner than the table's base delay after the last request: an
    approval grants more requests, not a faster pace.
    """
    earliest = now
    last = record.last_http_at
    if last is not None:
        earliest = max(earliest, last + table.schedule.base_delay_seconds)
    provider_says = record.not_before_at
    if provider_says is not None and provider_says >= earliest:
        return provider_says, True
    return earliest, False


def extension_changes(
    record: OperationRecord, table: ProviderTable, plan: ExtensionPlan, *, now: float
) -> dict[str, object]:
    """The columns an approved plan changes. Counters are kept; only limits and the schedule move.

    New deadline = max(old deadline, approval time) + extra (within the table's
    max_deadline_seconds); budget = old + extra; the next request waits for
    `earliest_next_request` (its delay source is provider_retry_after when a
    Retry-After decides it, manual_extension otherwise).
    """
    start_from = max(record.deadline_at, now)
    max_deadline = record.started_at + table.limits.max_deadline_seconds
    next_at, by_provider = earliest_next_request(record, table, now=now)
    changes: dict[str, object] = {
        "status": "waiting",
        "stop_reason": None,
        "stop_detail": None,
        "stopped_at": None,
        "max_status_requests": record.max_status_requests + plan.extra_status_requests,
        "delay_source": "provider_retry_after" if by_provider else "manual_extension",
        "next_check_at": next_at,
    }
    if record.stop_reason == "unknown_state":
        # A bounded pause: no check before it ends, then the granted checks.
        pause_end = max(next_at, now + plan.extra_seconds)
        changes["next_check_at"] = pause_end
        changes["delay_source"] = "manual_extension" if pause_end > next_at else changes["delay_source"]
        changes["deadline_at"] = min(
            max_deadline, max(record.deadline_at, pause_end + table.schedule.max_delay_seconds)
        )
    else:
        changes["deadline_at"] = min(max_deadline, start_from + plan.extra_seconds)
    if plan.new_business_deadline_at is not None:
        changes["business_deadline_at"] = plan.new_business_deadline_at
    if record.stop_reason == "delivery_ambiguous":
        changes["max_transport_failures"] = (
            record.transport_failures_used + table.limits.max_transport_failures
        )
    if record.stop_reason == "rate_limited":
        changes["max_rate_limited"] = record.rate_limited_used + table.limits.max_rate_limited
        # The provider asked us to slow down: the first check after approval waits a base delay.
        slowed = now + table.schedule.base_delay_seconds
        if slowed > next_at:
            changes["next_check_at"] = slowed
            changes["delay_source"] = "manual_extension"
    return changes


ExtensionOutcome = Literal[
    "approved", "denied", "cancelled", "refused", "pending_approval", "void", "expired"
]


class ExtensionResult(BaseModel):
    """What became of a request for more time or requests."""

    operation_id: str
    decision: ExtensionOutcome = Field(
        description="approved (new limits recorded), denied/cancelled (nothing changed), refused (not allowed "
        "here), pending_approval (a person must decide outside the chat), void/expired (the approval no "
        "longer applies)."
    )
    message: str
    approval_id: str | None = None
    granted_extra_seconds: float = 0
    granted_extra_status_requests: int = 0
    clipped: list[str] = Field(default_factory=list[str])
    operation: OperationView
