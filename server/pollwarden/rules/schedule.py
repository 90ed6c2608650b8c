"""The polling schedule: exponential backoff with a floored jitter, and provider hints.

Small pure policies in the style of tenacity: each takes numbers and a random
source and returns a number, so they are tested and simulated without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass

from pollwarden.core.clock import RandomSource
from pollwarden.core.vocabulary import DelaySource

# A 429 without guidance skips this many doublings: "increase the delay markedly".
RATE_LIMIT_EXTRA_DOUBLINGS = 2
# A poll hint is a suggestion, but never below this fraction of the base delay,
# so a provider answering "poll again in 0 s" cannot start a storm.
HINT_FLOOR_FRACTION = 0.5


def raw_delay(attempt: int, base: float, maximum: float) -> float:
    """`min(maximum, base * 2**attempt)`, safe for any attempt count."""
    if attempt >= 64:  # 2**64 · base is past any maximum; avoid float overflow
        return maximum
    return min(maximum, base * (2.0 ** max(0, attempt)))


def jittered_delay(raw: float, rng: RandomSource) -> float:
    """A uniform draw in [0.5·raw, raw]: spread out, but never near zero."""
    return raw * (0.5 + 0.5 * rng.random())


def local_backoff(attempt: int, base: float, maximum: float, rng: RandomSource) -> float:
    """The local delay before the next status request after `attempt` completed polls."""
    return jittered_delay(raw_delay(attempt, base, maximum), rng)


@dataclass(frozen=True)
class PlannedCheck:
    """When the next status request may go out, and why then."""

    at: float
    delay_source: DelaySource
    # True when the wait is a provider minimum (Retry-After) that may not be shortened.
    mandatory: bool
    # True when a poll hint ending after the deadline was honoured up to the deadline: `at` is the
    # deadline, where waiting stops unless something (a webhook, an extension) moves the check earlier.
    until_deadline: bool = False


def plan_next_check(
    *,
    now: float,
    attempt: int,
    base: float,
    maximum: float,
    rng: RandomSource,
    retry_after: float | None = None,
    poll_hint: float | None = None,
    rate_limited_without_guidance: bool = False,
    deadline: float | None = None,
    timed_out_after: float | None = None,
) -> PlannedCheck:
    """Choose the next check time from the local backoff and the provider's hints.

    `Retry-After` is a minimum: the result is never earlier (one ending after `deadline` is planned as
    it is, so that waiting stops). A poll hint is a
    suggestion that replaces the local backoff (with a floor), honoured up to
    `deadline` (DESIGN §1.7): a hint ending after it plans the next check at the
    deadline, never an earlier local backoff. A 429 without guidance backs off
    markedly further. After a request that timed out after `timed_out_after`
    seconds, the local backoff starts only that long again after it (`after_timeout`).
    """
    extra = RATE_LIMIT_EXTRA_DOUBLINGS if rate_limited_without_guidance else 0
    local = local_backoff(attempt + extra, base, maximum * (2**extra), rng) + after_timeout(timed_out_after)
    if poll_hint is not None:
        suggested, source = max(poll_hint, HINT_FLOOR_FRACTION * base), DelaySource.PROVIDER_POLL_HINT
    else:
        suggested, source = local, DelaySource.LOCAL_BACKOFF
    # A Retry-After ending at or after the deadline is planned as it is, whatever the hint: no request
    # fits before it, so the caller stops at once.
    past_deadline = retry_after is not None and deadline is not None and now + retry_after >= deadline
    if retry_after is not None and (retry_after >= suggested or past_deadline):
        return PlannedCheck(now + retry_after, DelaySource.PROVIDER_RETRY_AFTER, mandatory=True)
    if poll_hint is not None and deadline is not None and now + suggested >= deadline:
        return PlannedCheck(max(now, deadline), source, mandatory=False, until_deadline=True)
    return PlannedCheck(now + suggested, source, mandatory=False)


def after_timeout(timed_out_after: float | None) -> float:
    """How long to hold the next request back after one that timed out, on top of the local backoff.

    A request abandoned after `timed_out_after` seconds may still be in work at
    the provider: one request in flight means waiting at least as long again.
    """
    return max(0.0, timed_out_after or 0.0)


def earliest_allowed(
    previous: float | None,
    *,
    received_at: float,
    retry_after: float | None = None,
    timed_out_after: float | None = None,
) -> float | None:
    """The operation's earliest allowed request time after one answer (its `not_before_at`).

    The latest of the time already kept, the provider's minimum (`Retry-After`
    or a documented minimum, counted from the answer) and a timed-out
    request's length again after it. It only ever moves later, so no path that
    schedules a request (webhook, approval, reopen, pacing) can go before it.
    """
    candidates = [t for t in (previous,) if t is not None]
    if retry_after is not None:
        candidates.append(received_at + retry_after)
    if timed_out_after:
        candidates.append(received_at + timed_out_after)
    return max(candidates) if candidates else None


def not_before(next_check_at: float, not_before_at: float | None) -> float:
    """When a request planned for `next_check_at` may really go out: never before `not_before_at`."""
    return next_check_at if not_before_at is None else max(next_check_at, not_before_at)


def first_check_at(start: float, base: float, maximum: float, rng: RandomSource) -> float:
    """The first status request is allowed after the attempt-0 delay from the start."""
    return start + local_backoff(0, base, maximum, rng)


def latest_first_check_seconds(base: float, maximum: float) -> float:
    """How long after the start the first status request may be allowed at the latest (the raw attempt-0 delay)."""
    return raw_delay(0, base, maximum)


def deadline_too_short(name: str, seconds: float, *, base: float, maximum: float) -> str | None:
    """Why a deadline `seconds` from the start could pass before the first check may go out, or None.

    Refused rather than squeezing the first check in earlier: the schedule stays the
    table's, and a deadline that could never be polled is a mistake to name, not hide.
    """
    first = latest_first_check_seconds(base, maximum)
    if seconds > first:
        return None
    return (
        f"{name} is {seconds:g} s from now, but the first status request may go out up to {first:g} s after "
        f"the start (the table's base_delay_seconds), so it could end before anything is ever sent; "
        f"give more than {first:g} s"
    )


# The TypeScript SDK's default request timeout is 60 s, and progress notifications
# do not extend it by default. A whole check_status call (its wait, one provider
# request and the database work around it) ends within CALL_BUDGET_SECONDS.
CLIENT_REQUEST_TIMEOUT_SECONDS = 60.0
CALL_BUDGET_SECONDS = 55.0
# What a call spends besides waiting and the provider request: reserving and
# recording in the database (each normally milliseconds), progress messages.
CALL_MARGIN_SECONDS = 5.0


def wait_bound(requested: float, *, max_wait: float, request_timeout: float) -> float:
    """How long one check_status call may wait for its allowed time before it must send or answer not_yet.

    `wait + request_timeout + CALL_MARGIN_SECONDS <= CALL_BUDGET_SECONDS`: a request
    is only started while it can still finish inside the call's budget. With the
    default 20 s request cap that is 30 s of waiting, whatever the caller asked.
    """
    room = CALL_BUDGET_SECONDS - request_timeout - CALL_MARGIN_SECONDS
    return max(0.0, min(requested, max_wait, room))


@dataclass(frozen=True)
class PacingStep:
    """One fleet-pacing step (GCRA): admitted now, or a booked slot later."""

    admitted: bool
    slot_at: float  # when this request may go out (== now when admitted)
    next_tat: float  # the bucket's new theoretical arrival time


def pace(tat: float | None, *, now: float, rate: float, burst: int) -> PacingStep:
    """Admit or book one request against a shared rate (the generic cell rate algorithm).

    `tat` is the bucket's theoretical arrival time. Up to `burst` requests pass
    at once; after that each request is booked the next free slot, one every
    1/rate seconds, in the order they arrive at the gate, so none starves.
    """
    interval = 1.0 / rate
    tolerance = (burst - 1) * interval
    current = now if tat is None else max(tat, now)
    earliest = current - tolerance
    if earliest <= now:
        return PacingStep(True, now, current + interval)
    return PacingStep(False, earliest, current + interval)
