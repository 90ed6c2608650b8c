"""A business deadline given by an agent or a person: a real time after now, within the horizon."""

from __future__ import annotations

from pollwarden.core.errors import InvalidRequest
from pollwarden.core.timefmt import iso, parse_iso
from pollwarden.core.untrusted import shown

YEAR_SECONDS = 365.25 * 86_400
# A business deadline further out than this is a typo (year 9999), not a plan.
MAX_BUSINESS_HORIZON_SECONDS = 10 * YEAR_SECONDS


def business_deadline(value: str, *, now: float, name: str = "business_deadline_at") -> float:
    """`business_deadline_at` (or the argument `name`) as epoch seconds, if a real time after now within the horizon."""
    latest = now + MAX_BUSINESS_HORIZON_SECONDS
    accepted = (
        f"give an RFC 3339 time with an offset between now ({iso(now)}) and "
        f"{MAX_BUSINESS_HORIZON_SECONDS / YEAR_SECONDS:g} years ahead ({iso(latest)}), or omit it"
    )
    try:
        at = parse_iso(value)
    except (ValueError, OverflowError) as exc:
        raise InvalidRequest(f"{name}: {exc}; {accepted}") from exc
    if at <= now:
        raise InvalidRequest(
            f"{name} {shown(value)} has already passed (now is {iso(now)}); "
            f"a future time is needed: {accepted}"
        )
    if at > latest:
        raise InvalidRequest(f"{name} {shown(value)} is too far ahead; {accepted}")
    return at
