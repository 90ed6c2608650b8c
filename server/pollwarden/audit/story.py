"""The audit as a story: one human-readable line per audit row (the source document's style).

Values an agent or a provider supplied are shown escaped and quoted
(`pollwarden.core.untrusted`), so every row stays one line a person can trust.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import cast

from pollwarden.audit.chain import AuditRow, as_object_dict
from pollwarden.core.untrusted import one_line, quoted
from pollwarden.core.vocabulary import ApprovalKind

__all__ = ["render_story"]

_DELAY_SOURCE_WORDS = {
    "local_backoff": "local backoff",
    "provider_retry_after": "provider guidance",
    "provider_poll_hint": "provider hint",
    "manual_extension": "manual extension",
    "fleet_pacing": "fleet pacing",
    "provider_webhook": "provider webhook",
}


def _value(value: object) -> str:
    """An untrusted value (job id, state, hint): one line, escaped, capped, quoted unless a plain token."""
    return quoted(value)


def _note(value: object) -> str:
    """pollwarden's own note, which may embed stored text: one line, escaped, capped."""
    return one_line(value)


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _hms(value: object) -> str:
    moment = _parse_time(value)
    if moment is None:
        return _value(value) if value is not None else "?"
    return moment.strftime("%H:%M:%S")


def _number(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else str(round(value, 3))
    return _value(value)


def _words(value: object) -> str:
    text = _value(value)
    return text.replace("_", " ") if text == value else text


def _delay_source(value: object) -> str:
    if isinstance(value, str) and value in _DELAY_SOURCE_WORDS:
        return _DELAY_SOURCE_WORDS[value]
    return _words(value)


def _next_poll(p: Mapping[str, object]) -> str:
    next_at = p.get("next_check_at")
    if next_at is None:
        return ""
    text = f", next poll {_hms(next_at)}"
    source = p.get("delay_source")
    if source is not None:
        text += f" from {_delay_source(source)}"
    return text


def _ending(p: Mapping[str, object]) -> str:
    """Either where waiting goes next, or why it stopped."""
    status = p.get("status")
    if status == "waiting" or status is None:
        return _next_poll(p)
    reason = p.get("stop_reason")
    text = f", {_words(reason if reason is not None else status)}"
    if status == "escalated":
        text += ", escalated"
    return text


def _rejected_hints(p: Mapping[str, object]) -> str:
    hints = p.get("rejected_hints")
    if not isinstance(hints, list):
        return ""
    parts: list[str] = []
    for hint in cast("list[object]", hints):
        h = as_object_dict(hint)
        if h is not None:
            value = h.get("value")
            value_text = _number(value) if isinstance(value, int | float) else _value(value)
            parts.append(f" (ignored hint: {_value(h.get('source'))} {value_text}: {_note(h.get('reason'))})")
    return "".join(parts)


def _limits(p: Mapping[str, object]) -> str:
    text = ""
    if p.get("deadline_at") is not None:
        text += f", deadline {_hms(p.get('deadline_at'))}"
    if p.get("max_status_requests") is not None:
        text += f", budget {_number(p.get('max_status_requests'))}"
    return text


def _start_line(verb: str, p: Mapping[str, object]) -> str:
    job = p.get("provider_job_id")
    text = f"{verb} job {_value(job) if job is not None else '(no id yet)'}"
    if p.get("deadline_at") is not None:
        text += f", deadline {_hms(p.get('deadline_at'))}"
    if p.get("max_status_requests") is not None:
        text += f", budget {_number(p.get('max_status_requests'))}"
    principal = p.get("principal")
    if principal is not None and principal != "local":  # stdio stories read as before
        text += f", for {_value(principal)}"
    return text


def _polled_line(p: Mapping[str, object]) -> str:
    http_status = p.get("http_status")
    if http_status is None:
        note = p.get("note")
        text = f"no response ({_note(note)})" if note else "no response"
    elif isinstance(http_status, int) and 200 <= http_status < 300:
        text = f"polled, state {_value(p.get('state'))}"
    else:
        text = f"received {_number(http_status)}"
        if p.get("retry_after_seconds") is not None:
            text += f", Retry-After {_number(p.get('retry_after_seconds'))}"
    return text + _ending(p) + _rejected_hints(p)


def _plural(count: object, one: str, many: str) -> str:
    return one if count == 1 else many


def _refusals_line(row: AuditRow, one: str, many: str, outcome: str) -> str:
    """A run of refused calls: when, how many, and what the agent was told."""
    p = row.payload_obj
    count = p.get("count", 1)
    first = _hms(p.get("first_at") if p.get("first_at") is not None else row.at)
    last = _hms(p.get("last_at")) if p.get("last_at") is not None else first
    span = first if count == 1 or last == first else f"{first}–{last}"
    return f"{span} refused {_number(count)} {_plural(count, one, many)} ({outcome})"


def _story_line(row: AuditRow) -> str:
    p = row.payload_obj
    at = _hms(row.at)
    kind = row.kind
    if kind in ("submitted", "tracking"):
        return f"{at} {_start_line(kind, p)}"
    if kind == "submission_recorded":
        return f"{at} recorded the submission before sending it" + _limits(p)
    if kind == "submit_sending":
        note = p.get("note")
        return f"{at} sending the submission" + (f" ({_note(note)})" if note else "")
    if kind == "polled":
        return f"{at} {_polled_line(p)}"
    if kind == "stopped":
        reason = p.get("stop_reason")
        if reason is None:
            note = p.get("note")
            return f"{at} stopped" + (f": {_note(note)}" if note else "")
        escalated = ", escalated" if p.get("status") == "escalated" else ""
        if p.get("provider_job_id") is None and p.get("submit_sent_at") is not None:
            # A submission that was sent and ended here: say what came back, not "before polling".
            http = p.get("http_status")
            came = (
                f"submission answered {_value(http)}"
                if http is not None
                else "submission sent, no usable answer"
            )
            note = p.get("note")
            return f"{at} {came}: {_words(reason)}{escalated}" + (f" ({_note(note)})" if note else "")
        return f"{at} {_words(reason)} before polling{escalated}"
    if kind == "not_yet_summary":
        return _refusals_line(row, "early check", "early checks", "not yet")
    if kind == "stopped_summary":
        return _refusals_line(row, "check after it stopped", "checks after it stopped", "stopped")
    if kind == "not_yet":
        return f"{at} refused 1 early check (not yet){_next_poll(p)}"
    if kind == "extension_approved":
        parts = ["extension approved:"]
        details: list[str] = []
        if p.get("extra_seconds") is not None:
            details.append(f"+{_number(p.get('extra_seconds'))} s")
        if p.get("extra_status_requests") is not None:
            extra = p.get("extra_status_requests")
            details.append(f"+{_number(extra)} {_plural(extra, 'check', 'checks')}")
        if p.get("deadline_at") is not None:
            details.append(f"deadline {_hms(p.get('deadline_at'))}")
        if p.get("max_status_requests") is not None:
            details.append(f"budget {_number(p.get('max_status_requests'))}")
        text = f"{at} " + " ".join(parts) + (" " + ", ".join(details) if details else "")
        by = p.get("approved_by")
        return text + (f" by {_value(by)}" if by else "") + _how(p)
    if kind == "woken_by_webhook":
        what = f"{_value(p.get('event_type'))} (event {_value(p.get('event_id'))})"
        return f"{at} woken by webhook {what}{_next_poll(p)}"
    if kind == "extension_denied":
        note = p.get("note")
        return f"{at} extension denied" + (f": {_note(note)}" if note else "") + _how(p)
    if kind == "approval_pending":
        note = p.get("note")
        request = as_object_dict(p.get("request")) or {}
        what = _pending_kind(p.get("approval_kind"), request)
        return f"{at} {what} awaiting operator approval" + (f" {_note(note)}" if note else "")
    detail = p.get("note") or p.get("decision")
    return f"{at} {_value(kind)}" + (f": {_note(detail)}" if detail else "") + _how(p)


def _how(p: Mapping[str, object]) -> str:
    """How a person's decision was authenticated (tty, console, operator-key:…), when the row says."""
    method = p.get("authenticated_by")
    return f", authenticated by {_value(method)}" if method else ""


def _pending_kind(recorded: object, request: Mapping[str, object]) -> str:
    """What a pending approval asks for: the kind recorded with it, else guessed from rows written before it was."""
    if isinstance(recorded, str) and recorded in set(ApprovalKind):
        return recorded.replace("_", " ")
    if "extra_seconds" in request or not request:
        return "extension"
    return "reopen" if "stop_reason" in request else "cancel"


def render_story(rows: Sequence[AuditRow]) -> list[str]:
    """One human-readable line per audit row, times as ``HH:MM:SS`` UTC.

    Follows the source document's style, e.g.::

        10:20:00 submitted job exp_71c, deadline 11:00:00, budget 12
        10:20:05 polled, state queued, next poll 10:20:14 from local backoff
        10:20:31 received 503, Retry-After 120, next poll 10:22:31 from provider guidance
        10:58:00 polled, state running, request budget exhausted, escalated

    Values an agent or a provider supplied (job ids, states, hints) are rendered
    with :func:`pollwarden.core.untrusted.quoted` and notes with
    :func:`pollwarden.core.untrusted.one_line`: every row stays on one line, control
    characters and terminal escapes are shown escaped, and long values are cut
    visibly.
    """
    return [_story_line(row) for row in rows]
