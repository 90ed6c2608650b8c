"""RFC 3339 formatting and parsing of epoch seconds (always UTC)."""

from __future__ import annotations

from datetime import UTC, datetime


def to_datetime(at: float) -> datetime:
    """Epoch seconds as an aware UTC datetime."""
    return datetime.fromtimestamp(at, UTC)


def rfc3339(moment: datetime) -> str:
    """RFC 3339 UTC with a ``Z`` and millisecond precision, e.g. ``2025-04-18T10:20:00.000Z``.

    Naive datetimes are refused (``ValueError``): a recorded time must be unambiguous.
    """
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("timestamps must be timezone-aware (use datetime.now(UTC))")
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso(at: float | None) -> str | None:
    """Epoch seconds as RFC 3339 UTC with a 'Z' and millisecond precision, or None."""
    if at is None:
        return None
    return rfc3339(to_datetime(at))


def hms(at: float) -> str:
    """`HH:MM:SS` in UTC."""
    return to_datetime(at).strftime("%H:%M:%S")


def parse_iso(value: str) -> float:
    """Parse an RFC 3339 timestamp with an offset into epoch seconds; ValueError names the fix."""
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an RFC 3339 timestamp, e.g. 2026-11-30T18:00:00Z") from exc
    if when.tzinfo is None:
        raise ValueError(f"{value!r} has no UTC offset; add 'Z' or '+00:00'")
    return when.timestamp()
