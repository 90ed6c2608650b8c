"""When waiting must stop: each stop condition in one place (modelled on tenacity's ``stop.py``).

Every condition is one small function of the record (and the time, or the
answer's status code) that returns a `Stop` — the reason and the detail a
person reads — or None. The callers ask these and nothing else: the gate
before a request (`pollwarden.rules.gate`), the decisions after a status or a
submit answer (`pollwarden.rules.status_answer`), and the submission's checks before it
sends. The store's SQL guards state the same conditions from the fragments at
the bottom of this module (`deadline_open_sql`, `BUDGET_LEFT_SQL`);
tests/integration/test_stop_policy_agrees_with_sql.py proves the two agree.

The stop reasons that read the provider's body (succeeded, provider_failure,
cancelled, expired, unknown_state, awaiting_review and most integration
failures) are the state table's verdict, decided in `pollwarden.rules.status_answer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from pollwarden.core.timefmt import iso
from pollwarden.core.vocabulary import Status, StopReason, status_for
from pollwarden.rules.job_identity import account_changed_detail, duplicate_detail

if TYPE_CHECKING:
    from pollwarden.core.records import OperationRecord


@dataclass(frozen=True)
class Stop:
    """Why waiting stops: the machine-readable reason and the detail a person reads."""

    reason: StopReason
    detail: str

    @property
    def status(self) -> Status:
        """The status the operation takes: terminal, or escalated to a person."""
        return status_for(self.reason)


# -- the record's own limits ---------------------------------------------------------------------


def reaches_deadline(record: OperationRecord, at: float) -> bool:
    """Whether `at` is at or after the operation's effective deadline (the earlier of the two)."""
    return at >= record.effective_deadline


def deadline_passed(record: OperationRecord, now: float, *, before: str) -> Stop | None:
    """deadline_exceeded: the deadline passed before `before` (this check, an accepted submission)."""
    if not reaches_deadline(record, now):
        return None
    return Stop(
        StopReason.DEADLINE_EXCEEDED,
        f"the {record.deadline_name} {iso(record.effective_deadline)} passed before {before}",
    )


def no_check_fits(record: OperationRecord, now: float, next_at: float, *, mandatory: bool) -> Stop | None:
    """deadline_exceeded: the next allowed check (`next_at`; a Retry-After when `mandatory`) is too late."""
    if not reaches_deadline(record, next_at):
        return None
    why = "the provider's Retry-After" if mandatory else "the next allowed check"
    return Stop(
        StopReason.DEADLINE_EXCEEDED,
        f"{why} ends {next_at - now:.0f} s from now, after the {record.deadline_name}; "
        "no further status request fits inside it",
    )


def budget_used(record: OperationRecord, *, unfinished: bool = False) -> Stop | None:
    """request_budget_exhausted: every status request is used (`unfinished`: and the job is not done)."""
    if record.status_requests_used < record.max_status_requests:
        return None
    tail = " and the job is not finished" if unfinished else ""
    return Stop(
        StopReason.REQUEST_BUDGET_EXHAUSTED,
        f"all {record.max_status_requests} status requests are used{tail}",
    )


def transport_failures_counted(record: OperationRecord) -> int:
    """The transport failures counting the one being decided (the record does not hold it yet)."""
    return record.transport_failures_used + 1


def transport_failures_note(record: OperationRecord) -> str:
    """ "transport failures N of M", counting the one being decided."""
    return f"transport failures {transport_failures_counted(record)} of {record.max_transport_failures}"


def last_transport_failure(record: OperationRecord) -> bool:
    """Whether the failure being decided uses the last one allowed."""
    return transport_failures_counted(record) >= record.max_transport_failures


# A status request only reads: whatever became of it, nothing was submitted and the job is unaffected.
STATUS_READ_ONLY_OBSERVES = (
    "A status request only observes the job: nothing was submitted or changed at the provider, "
    "only the job's current state is unknown"
)


class StatusReadFailure(StrEnum):
    """How a status request failed to be answered: the three cases a person acts on differently."""

    UNREACHABLE = "unreachable"  # the request provably never left (connection refused, DNS, connect timeout)
    NO_ANSWER = "no_answer"  # it left, and no complete answer came (timeout, dropped connection)
    SERVER_ERROR = "server_error"  # the provider answered 5xx


_STATUS_READ_FAILURE_WORDS: dict[StatusReadFailure, str] = {
    StatusReadFailure.UNREACHABLE: "the provider could not be reached",
    StatusReadFailure.NO_ANSWER: "the provider gave no complete answer",
    StatusReadFailure.SERVER_ERROR: "the provider answered with a server error (5xx)",
}


def transport_failures_used_up(record: OperationRecord, what: str, failure: StatusReadFailure) -> Stop | None:
    """delivery_ambiguous: a status request's failure `what` (no answer, a 5xx) is the last one allowed.

    The stop reason keeps its contract name (DESIGN §1.11), but for status
    requests the detail says truthfully what happened: an outage or a failing
    provider, not an ambiguous delivery (nothing was submitted).
    """
    if not last_transport_failure(record):
        return None
    return Stop(
        StopReason.DELIVERY_AMBIGUOUS,
        f"{_STATUS_READ_FAILURE_WORDS[failure]} for status requests (last: {what}); "
        f"{transport_failures_note(record)}. {STATUS_READ_ONLY_OBSERVES}. Check that the provider is up (its status page or console) before "
        "a person allows more transport failures",
    )


def rate_limits_counted(record: OperationRecord) -> int:
    """The rate-limited answers counting the one being decided."""
    return record.rate_limited_used + 1


def rate_limits_used_up(record: OperationRecord, code: int, *, on_submission: bool = False) -> Stop | None:
    """rate_limited: this rate-limited answer (HTTP `code`) is the last one allowed."""
    used = rate_limits_counted(record)
    if used < record.max_rate_limited:
        return None
    if on_submission:
        detail = (
            f"HTTP {code} on submission {used} times (limit {record.max_rate_limited}); nothing was created"
        )
    else:
        detail = f"rate limited {used} times, the last with HTTP {code} (limit {record.max_rate_limited})"
    return Stop(StopReason.RATE_LIMITED, detail)


# -- whose job, under which account ---------------------------------------------------------------


def job_already_tracked(record: OperationRecord) -> Stop | None:
    """job_already_tracked: the job is another operation's (one job, one budget)."""
    if record.duplicate_of is None:
        return None
    return Stop(StopReason.JOB_ALREADY_TRACKED, duplicate_detail(record))


def account_context_changed(record: OperationRecord, account_context: str | None) -> Stop | None:
    """account_context_changed: the table's account (None: not compared) is not the one recorded."""
    if account_context is None or account_context == record.account_context:
        return None
    return Stop(
        StopReason.ACCOUNT_CONTEXT_CHANGED, account_changed_detail(record.account_context, account_context)
    )


# -- what a status or submit answer's status code alone decides -----------------------------------


def credentials_refused(code: int, *, where: str = "") -> Stop:
    """authorization_denied: HTTP 401 or 403 that is not a rate limit (`where`: " on submission")."""
    return Stop(
        StopReason.AUTHORIZATION_DENIED,
        f"HTTP {code}{where}: the provider refused these credentials; a person must check access",
    )


def redirected(code: int, *, origin: str, location: str | None, where: str = "") -> Stop:
    """integration_failure: a 3xx is never followed (requests go to the table's origin only)."""
    return Stop(
        StopReason.INTEGRATION_FAILURE,
        f"HTTP {code} redirect{where}, not followed (requests go to {origin} only); "
        f"Location {location or '(none)'}",
    )


# -- a submission whose fate is unknown ------------------------------------------------------------

SUBMISSION_NEVER_RESENT = (
    "the provider has no idempotency, so the job may or may not exist and it is never resubmitted"
)


def interrupted_without_key(*, interrupted: bool, has_key: bool) -> Stop | None:
    """delivery_ambiguous: a call stopped after (perhaps) sending a submission that has no idempotency key."""
    if not interrupted or has_key:
        return None
    return Stop(
        StopReason.DELIVERY_AMBIGUOUS,
        "a call sent (or was about to send) the submission and stopped before recording the answer; "
        f"{SUBMISSION_NEVER_RESENT}. A person checks the provider's console",
    )


def submission_unanswered(
    record: OperationRecord, *, detail: str, sent: bool, has_key: bool, origin: str
) -> Stop | None:
    """Whether a submit request without a usable answer stops, and why; None: it may be sent again.

    Sent without idempotency the job may exist: delivery_ambiguous at once. Otherwise
    the last transport failure allowed stops it: delivery_ambiguous when it may have
    arrived (sent, or an idempotency key recorded), integration_failure when it never left.
    """
    budget = transport_failures_note(record)
    if sent and not has_key:
        return Stop(
            StopReason.DELIVERY_AMBIGUOUS,
            f"the submission was sent and got no usable answer ({detail}); {SUBMISSION_NEVER_RESENT}. "
            f"A person checks the provider's console ({budget})",
        )
    if not last_transport_failure(record):
        return None
    failures = transport_failures_counted(record)
    if sent or has_key:
        return Stop(
            StopReason.DELIVERY_AMBIGUOUS,
            f"no usable answer to {failures} submission attempts (last: {detail}); the job may exist "
            "under the recorded idempotency key. Never resubmitted: a person checks the provider's console "
            f"({budget})",
        )
    return Stop(
        StopReason.INTEGRATION_FAILURE,
        f"the provider at {origin} could not be reached for {failures} submission attempts "
        f"(last: {detail}); nothing was delivered, no job exists. Check that the provider is "
        f"reachable, then start a new operation ({budget})",
    )


# -- the same conditions as the store's SQL guards state them (open side: waiting may go on) --------


def deadline_open_sql(now: str) -> str:
    """SQL true while `now` (a placeholder) is before both deadlines: not `reaches_deadline`."""
    return f"{now} < deadline_at AND (business_deadline_at IS NULL OR {now} < business_deadline_at)"


# SQL true while a status request is left: not `budget_used`.
BUDGET_LEFT_SQL = "status_requests_used < max_status_requests"
