"""The operation record: what is persisted before the first status request."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields
from typing import Any, Literal

Status = Literal["submitting", "waiting", "succeeded", "failed", "cancelled", "expired", "escalated"]
StopReason = Literal[
    "succeeded",
    "provider_failure",
    "cancelled",
    "expired",
    "deadline_exceeded",
    "request_budget_exhausted",
    "delivery_ambiguous",
    "rate_limited",
    "unknown_state",
    "awaiting_review",
    "authorization_denied",
    "integration_failure",
]
DelaySource = Literal[
    "start", "local_backoff", "provider_retry_after", "provider_poll_hint", "manual_extension", "fleet_pacing"
]

TERMINAL_STATUS: dict[str, Status] = {
    "succeeded": "succeeded",
    "provider_failure": "failed",
    "cancelled": "cancelled",
    "expired": "expired",
}


def status_for(stop_reason: str) -> Status:
    """The operation status a stop reason leads to: terminal, or escalated to a person."""
    return TERMINAL_STATUS.get(stop_reason, "escalated")


@dataclass(frozen=True)
class OperationRecord:
    """One row of `operations`. Times are epoch seconds (UTC)."""

    operation_id: str
    provider: str
    provider_job_id: str | None
    account_context: str
    request_fingerprint: str
    idempotency_key: str | None
    expected_terminal_state: str
    status: str
    stop_reason: str | None
    stop_detail: str | None
    state: str | None
    category: str | None
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
    delay_source: str
    retry_after_seconds: float | None
    last_http_status: int | None
    last_http_at: float | None
    provider_request_id: str | None
    provider_expires_at: float | None
    error: str | None
    result_json: str | None
    lease_owner: str | None
    lease_expires_at: float | None
    not_yet_count: int
    not_yet_first_at: float | None
    not_yet_last_at: float | None
    extensions_used: int
    stopped_at: float | None
    submit_payload_json: str | None
    created_at: float
    updated_at: float
    version: int
    fleet_slot_at: float | None

    @classmethod
    def from_row(cls, row: sqlite3.Row | tuple[Any, ...], columns: list[str]) -> OperationRecord:
        """Build from a row whose column names are `columns`."""
        data = dict(zip(columns, tuple(row), strict=True))
        return cls(**{f.name: data[f.name] for f in fields(cls)})

    @property
    def is_waiting(self) -> bool:
        """True while status requests may still be sent."""
        return self.status == "waiting"

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


OPERATION_COLUMNS: list[str] = [f.name for f in fields(OperationRecord)]
