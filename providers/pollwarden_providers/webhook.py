"""Reading a provider's webhook event once its signature is verified: its type and the job it names.

Pure functions over a table's `[webhook]` section and a parsed JSON body. They
never decide anything about an operation: the server uses the result only to
bring the next status check forward, and the status request stays the truth.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pollwarden_providers.interpret import get_field, parse_timestamp, truncate_text
from pollwarden_providers.table_webhook import WebhookSpec

__all__ = ["MAX_EVENT_TEXT", "WebhookEvent", "event_time", "read_event"]

# Event types and job ids are stored and shown: longer ones are not real.
MAX_EVENT_TEXT = 512


@dataclass(frozen=True)
class WebhookEvent:
    """What a verified event says: its type, whether the table lets it wake, and the job id (if readable)."""

    event_type: str | None
    wakes: bool
    job_id: str | None
    problem: str | None  # why the type or the job id could not be read, or None


def _text(value: object) -> str | None:
    """A scalar id or type as text (ints included: GitHub's run ids are numbers), or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value and len(value) <= MAX_EVENT_TEXT and value.isprintable():
        return value
    return None


def read_event(spec: WebhookSpec, body: Mapping[str, object], headers: Mapping[str, str]) -> WebhookEvent:
    """The event type and the job id of a verified event, as the table says where to find them.

    `headers` must have lower-case names. The type is the `event_type_header`
    value (if the table names one) and the `event_type_field` value joined by
    "."; the job id is the `job_id_fields` values joined by "/".
    """
    parts: list[str] = []
    if spec.event_type_header is not None:
        header = _text(headers.get(spec.event_type_header.lower()))
        if header is None:
            return WebhookEvent(None, False, None, f"no {spec.event_type_header} header")
        parts.append(header)
    field = _text(get_field(body, spec.event_type_field))
    if field is None:
        return WebhookEvent(None, False, None, f"no event type at {spec.event_type_field!r}")
    parts.append(field)
    event_type = ".".join(parts)
    if event_type not in spec.events:
        return WebhookEvent(event_type, False, None, None)
    pieces: list[str] = []
    for path in spec.job_id_fields:
        piece = _text(get_field(body, path))
        if piece is None:
            shown = truncate_text(repr(get_field(body, path)), 80)
            return WebhookEvent(event_type, True, None, f"no job id at {path!r} (found {shown})")
        pieces.append(piece)
    return WebhookEvent(event_type, True, "/".join(pieces), None)


def event_time(spec: WebhookSpec, body: Mapping[str, object]) -> float | None:
    """The signed time of the event at the table's `timestamp_field` (epoch seconds), or None when unreadable."""
    if spec.timestamp_field is None:
        return None
    when = parse_timestamp(get_field(body, spec.timestamp_field))
    return None if when is None else when.timestamp()
