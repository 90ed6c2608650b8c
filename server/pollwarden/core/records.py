"""The record types every engine stores and every caller reads, in one place.

An `OperationRecord` is what is persisted before the first status request;
approvals and follow-ups are records of their own. `CheckStart` is what the
store did for one round of `check_status`. Records are plain frozen
dataclasses: the engines build them from rows, the pure decision code reads
them, nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from pollwarden.core.vocabulary import (
    ApprovalKind,
    ApprovalStatus,
    Category,
    DelaySource,
    FollowupKind,
    FollowupStatus,
    Status,
    StopReason,
    status_for,
)
from pollwarden.rules.gate import GateVerdict

__all__ = [
    "APPROVAL_COLUMNS",
    "FOLLOWUP_COLUMNS",
    "OPERATION_COLUMNS",
    "ApprovalRecord",
    "CheckStart",
    "DelaySource",
    "FollowupRecord",
    "OperationRecord",
    "Status",
    "StopReason",
    "WakeOutcome",
    "WakeResult",
    "new_record",
    "status_for",
]


def _read_words(row: Sequence[Any], words: Sequence[tuple[int, Callable[[Any], object]]]) -> list[Any]:
    """A row's values, with the text columns that hold a word of the vocabulary read back as that word."""
    values = list(row)
    for index, word in words:
        if values[index] is not None:
            values[index] = word(values[index])
    return values


@dataclass(frozen=True)
class OperationRecord:
    """One operation as stored. Times are epoch seconds (UTC)."""

    operation_id: str
    provider: str
    provider_job_id: str | None
    account_context: str
    request_fingerprint: str
    idempotency_key: str | None
    expected_terminal_state: str
    status: Status
    stop_reason: StopReason | None
    stop_detail: str | None
    state: str | None
    category: Category | None
    started_at: float
    deadline_at: float
    business_deadline_at: float | None
    max_status_requests: int
    max_transport_failures: int
    max_rate_limited: int
    status_requests_used: int
    transport_failures_used: int
    rate_limited_used: int
    polls_completed: int
    next_check_at: float
    delay_source: DelaySource
    retry_after_seconds: float | None
    last_http_status: int | None
    last_http_at: float | None
    provider_request_id: str | None
    provider_expires_at: float | None
    error: str | None
    result_json: str | None
    lease_owner: str | None
    lease_expires_at: float | None
    extensions_used: int
    stopped_at: float | None
    submit_payload_json: str | None
    created_at: float
    updated_at: float
    version: int
    fleet_slot_at: float | None
    # The operation that holds this job's budget, when this one may not poll it (pollwarden.rules.job_identity).
    duplicate_of: str | None = None
    # When the last status request was sent; while one is in flight, when it was reserved (fair shares
    # count it served then). `last_http_at`: when its answer came.
    request_sent_at: float | None = None
    # A resubmission of a payload whose earlier operation ended or escalated: that operation's id,
    # and who approved sending it (nothing is sent while this is None).
    resubmission_of: str | None = None
    resubmission_approved_by: str | None = None
    owner: str = "local"  # the principal that started it (issue 19); stdio is `local`
    # When a verified provider webhook last brought next_check_at forward (to this time); see webhooks.py.
    woken_at: float | None = None
    # When the submission request was sent (recorded by the claim that sends it, so a call that dies
    # after sending still leaves it); request_sent_at is the status requests'.
    submit_sent_at: float | None = None
    # The earliest the next status request may go out, whatever path schedules it (an answer, a
    # webhook, an approval, a reopen, fleet pacing): the provider's Retry-After or documented minimum,
    # or a timed-out request's own length again after it. Never moved earlier (pollwarden.rules.schedule).
    not_before_at: float | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> OperationRecord:
        """Build from a row whose columns are `OPERATION_COLUMNS`, in that order."""
        return cls(*_read_words(row, _OPERATION_WORDS))

    @property
    def is_waiting(self) -> bool:
        """True while status requests may still be sent."""
        return self.status == Status.WAITING

    @property
    def held_for_approval(self) -> bool:
        """A resubmission not yet approved by a person: nothing may be sent for it."""
        return (
            self.status == Status.SUBMITTING
            and self.resubmission_of is not None
            and self.resubmission_approved_by is None
        )

    @property
    def woken_by_webhook(self) -> bool:
        """Whether the next allowed check is the one a provider webhook brought forward."""
        return self.is_waiting and self.woken_at is not None and self.woken_at == self.next_check_at

    @property
    def effective_deadline(self) -> float:
        """Whichever of the polling and business deadlines comes first."""
        if self.business_deadline_at is None:
            return self.deadline_at
        return min(self.deadline_at, self.business_deadline_at)

    @property
    def deadline_name(self) -> str:
        """Which deadline `effective_deadline` is."""
        if self.business_deadline_at is not None and self.business_deadline_at < self.deadline_at:
            return "business deadline"
        return "polling deadline"


OPERATION_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(OperationRecord))
"""The operation's stored columns, in record order."""

# What a new operation's row holds besides the columns its start gives: the schema's defaults.
_NEW_ROW_DEFAULTS: Mapping[str, object] = {
    "status_requests_used": 0,
    "transport_failures_used": 0,
    "rate_limited_used": 0,
    "polls_completed": 0,
    "extensions_used": 0,
    "version": 1,
    "owner": "local",
}


def new_record(values: Mapping[str, object]) -> OperationRecord:
    """The record a new operation's row holds: `values` (its start's columns), the rest as the schema has them.

    For writing the row's first audit row in the statement that inserts it (PostgreSQL).
    """
    return OperationRecord.from_row([values.get(c, _NEW_ROW_DEFAULTS.get(c)) for c in OPERATION_COLUMNS])


# Columns stored as text that hold a word of the vocabulary: read back as that word.
_OPERATION_WORDS: tuple[tuple[int, Callable[[Any], object]], ...] = tuple(
    (OPERATION_COLUMNS.index(name), word)
    for name, word in (
        ("status", Status),
        ("stop_reason", StopReason),
        ("category", Category),
        ("delay_source", DelaySource),
    )
)


@dataclass(frozen=True)
class ApprovalRecord:
    """One question to a person, bound to the operation's version when asked."""

    approval_id: str
    operation_id: str
    kind: ApprovalKind
    status: ApprovalStatus
    request_json: str
    bound_version: int
    asked_at: float
    expires_at: float
    decided_at: float | None
    decided_by: str | None
    note: str | None
    decided_method: str | None = None  # how the decision was authenticated (operator_keys)
    decision_signature: str | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ApprovalRecord:
        """Build from a row whose columns are `APPROVAL_COLUMNS`, in that order."""
        return cls(*_read_words(row, ((2, ApprovalKind), (3, ApprovalStatus))))

    @property
    def request(self) -> dict[str, Any]:
        """The recorded request (what would be added)."""
        value: dict[str, Any] = json.loads(self.request_json)
        return value


APPROVAL_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ApprovalRecord))


@dataclass(frozen=True)
class FollowupRecord:
    """One follow-up operation (fetch_result, cancel) with its own record."""

    followup_id: str
    operation_id: str
    kind: FollowupKind
    status: FollowupStatus
    approval_id: str | None
    requested_at: float
    finished_at: float | None
    http_status: int | None
    answer: str | None
    note: str | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> FollowupRecord:
        """Build from a row whose columns are `FOLLOWUP_COLUMNS`, in that order."""
        return cls(*_read_words(row, ((2, FollowupKind), (3, FollowupStatus))))


FOLLOWUP_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(FollowupRecord))


@dataclass(frozen=True)
class CheckStart:
    """What the store decided and wrote for one round of check_status, in one transaction.

    `decision` is the pure gate's verdict on `record` as it was under the write
    lock; `record` is the operation after what that verdict wrote (a counted
    reservation, a booked fleet slot, a counted refusal, a stop) or as read
    when it writes nothing (wait, apply approvals).
    """

    record: OperationRecord
    decision: GateVerdict


class WakeOutcome(StrEnum):
    """What one verified webhook did."""

    WOKEN = "woken"  # at least one waiting operation's next check moved to now
    NOT_WOKEN = "not_woken"  # the job is known, but no operation could be brought forward
    REPLAYED = "replayed"  # the event id was seen before: nothing changed
    UNKNOWN_JOB = "unknown_job"  # no operation tracks this job: nothing stored


@dataclass(frozen=True)
class WakeResult:
    """The outcome of one webhook and the operations it woke."""

    outcome: WakeOutcome
    woken: tuple[str, ...]
