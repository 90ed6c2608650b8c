"""One typed vocabulary: the words the records, the decisions, the views and the SQL share.

Each is a `StrEnum`, so a value is its own string in JSON, in SQLite and in
messages, the tools' output schemas list the allowed values, and a typo is a
type error. The SQL `CHECK` constraints in the migrations spell the same values
out (frozen, as a migration must be); a test compares the two.
`Category` comes from the providers package, which never imports pollwarden.
"""

from __future__ import annotations

from enum import StrEnum

from pollwarden_providers.category import CATEGORIES, Category

__all__ = [
    "CATEGORIES",
    "ApprovalKind",
    "ApprovalStatus",
    "Category",
    "DelaySource",
    "FollowupKind",
    "FollowupStatus",
    "Outcome",
    "Status",
    "StopReason",
    "status_for",
]


class Status(StrEnum):
    """Where an operation is: being submitted, waiting, finished, or escalated to a person."""

    SUBMITTING = "submitting"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    ESCALATED = "escalated"


class Outcome(StrEnum):
    """What one check_status call did: sent one request, or refused (too early, or already stopped)."""

    POLLED = "polled"
    NOT_YET = "not_yet"
    STOPPED = "stopped"


class StopReason(StrEnum):
    """Why waiting stopped (machine-readable, exactly these names)."""

    SUCCEEDED = "succeeded"
    PROVIDER_FAILURE = "provider_failure"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    REQUEST_BUDGET_EXHAUSTED = "request_budget_exhausted"
    DELIVERY_AMBIGUOUS = "delivery_ambiguous"
    RATE_LIMITED = "rate_limited"
    UNKNOWN_STATE = "unknown_state"
    AWAITING_REVIEW = "awaiting_review"
    AUTHORIZATION_DENIED = "authorization_denied"
    INTEGRATION_FAILURE = "integration_failure"
    # The table's origin or credential variable is no longer the one recorded at start.
    ACCOUNT_CONTEXT_CHANGED = "account_context_changed"
    # The job is another operation's: its budget and deadline are the job's (pollwarden.rules.job_identity).
    JOB_ALREADY_TRACKED = "job_already_tracked"


class DelaySource(StrEnum):
    """Why the next status request may go out when it may."""

    LOCAL_BACKOFF = "local_backoff"
    PROVIDER_RETRY_AFTER = "provider_retry_after"
    PROVIDER_POLL_HINT = "provider_poll_hint"
    MANUAL_EXTENSION = "manual_extension"
    FLEET_PACING = "fleet_pacing"
    # Shown (views, audit), never stored: a webhook's wake-up is the `woken_at` column, so the
    # stored delay_source still says what the schedule was (and its CHECK needs no table rebuild).
    PROVIDER_WEBHOOK = "provider_webhook"


class ApprovalKind(StrEnum):
    """What a person is asked to approve."""

    EXTENSION = "extension"
    CANCEL = "cancel"
    REOPEN = "reopen"  # an operator's reopen, applied by the server only once it verified who decided
    RESUBMISSION = "resubmission"
    STATUS_REQUEST = "status_request"


class ApprovalStatus(StrEnum):
    """Where a question to a person is: asked, answered, used, or no longer valid."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    VOID = "void"
    APPLIED = "applied"


class FollowupKind(StrEnum):
    """A follow-up operation with its own record."""

    FETCH_RESULT = "fetch_result"
    CANCEL = "cancel"


class FollowupStatus(StrEnum):
    """How a follow-up ended."""

    DONE = "done"
    REFUSED = "refused"
    SENT = "sent"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"


_TERMINAL_STATUS: dict[StopReason, Status] = {
    StopReason.SUCCEEDED: Status.SUCCEEDED,
    StopReason.PROVIDER_FAILURE: Status.FAILED,
    StopReason.CANCELLED: Status.CANCELLED,
    StopReason.EXPIRED: Status.EXPIRED,
}


def status_for(stop_reason: StopReason) -> Status:
    """The operation status a stop reason leads to: terminal, or escalated to a person."""
    return _TERMINAL_STATUS.get(StopReason(stop_reason), Status.ESCALATED)


APPROVAL_CLOSABLE_FROM: dict[str, tuple[str, ...]] = {
    "expired": ("pending",),
    "void": ("pending", "approved", "denied"),
    "applied": ("pending", "approved", "denied"),
}
"""The statuses an approval may be closed from, by target: an applied one is never voided, a decided one
never expired (a late or concurrent close changes nothing)."""
