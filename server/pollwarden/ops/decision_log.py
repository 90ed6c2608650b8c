"""Logs for machines: JSON lines on request (``--log-format json``), one event per decision.

Each decision event carries the fields of the audit row's decision payload
(`pollwarden.audit.entry.decision_payload`) that the answer shows, the
operation and provider, and the principal (added to every record by
`pollwarden.access.principals.PrincipalLogFilter`). Values come from the answer the
agent got, which the provider client has already redacted; the HTTP libraries'
logs keep passing through its redacting filter whatever the format.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from pollwarden.surface.views import OperationView

__all__ = ["DECISION_FIELDS", "JsonLinesFormatter", "decided", "decision_fields", "use_json"]

log = logging.getLogger("pollwarden.decisions")

# The audit payload's names for what the answer shows (audit name → view field).
DECISION_FIELDS: dict[str, str] = {
    "operation_id": "operation_id",
    "provider": "provider",
    "outcome": "outcome",
    "status": "status",
    "state": "state",
    "category": "category",
    "stop_reason": "stop_reason",
    "stop_detail": "stop_detail",
    "next_check_at": "next_check_at",
    "delay_source": "delay_source",
    "retry_after_seconds": "retry_after_seconds",
    "status_requests_used": "status_requests_used",
    "max_status_requests": "max_status_requests",
    "transport_failures_used": "transport_failures_used",
    "max_transport_failures": "max_transport_failures",
    "rate_limited_used": "rate_limited_used",
    "deadline_at": "deadline_at",
    "business_deadline_at": "business_deadline_at",
    "http_status": "last_http_status",
    "request_sent_at": "request_sent_at",
    "submit_sent_at": "submit_sent_at",
    "answered_at": "last_http_at",
    "provider_request_id": "provider_request_id",
    "provider_job_id": "provider_job_id",
}

# Text logs keep a decision per check at DEBUG (-v); JSON logs are for collectors and carry every one.
_level = logging.DEBUG


def use_json(enabled: bool) -> None:
    """Whether decision events go out at INFO (JSON logs) or DEBUG (text logs)."""
    global _level
    _level = logging.INFO if enabled else logging.DEBUG


def decision_fields(tool: str, view: OperationView) -> dict[str, object]:
    """The event of one decision: the tool, then the audit payload's fields as the answer shows them."""
    shown = view.model_dump(mode="json")
    return {"decision": tool, **{name: shown.get(field) for name, field in DECISION_FIELDS.items()}}


def decided(tool: str, view: OperationView) -> None:
    """Log one decision (an event with its fields; in text logs, one short line)."""
    if not log.isEnabledFor(_level):
        return
    log.log(
        _level,
        "%s %s: %s (%s)",
        tool,
        view.operation_id,
        view.outcome or view.status,
        view.stop_reason or view.delay_source or view.status,
        extra={"event": decision_fields(tool, view)},
    )


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, principal, message, and a decision's fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (newlines in values are escaped by JSON itself)."""
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "principal": getattr(record, "principal", None),
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if isinstance(event, dict):
            out.update({str(k): v for k, v in event.items()})  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)
