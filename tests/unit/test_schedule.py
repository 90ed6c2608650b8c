"""The polling schedule as pure functions: exponential backoff with a floored jitter, and hints."""

from __future__ import annotations

import itertools
import math
import random
from datetime import UTC, datetime

import pytest

from harness import SteppedRandom
from pollwarden.rules.schedule import (
    HINT_FLOOR_FRACTION,
    first_check_at,
    jittered_delay,
    local_backoff,
    plan_next_check,
    raw_delay,
)

BASE = 5.0
MAXIMUM = 120.0
NOW = datetime(2025, 4, 18, 10, 20, 0, tzinfo=UTC).timestamp()


def at(hh: int, mm: int, ss: float) -> float:
    """Epoch seconds of a time on the source document's example day."""
    whole = int(ss)
    micro = round((ss - whole) * 1_000_000)
    return datetime(2025, 4, 18, hh, mm, whole, micro, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("attempt", range(12))
def test_the_raw_delay_doubles_from_the_base_and_is_capped_at_the_maximum(attempt: int) -> None:
    assert raw_delay(attempt, BASE, MAXIMUM) == min(MAXIMUM, BASE * 2**attempt)


def test_the_raw_delay_sequence_is_5_10_20_40_80_then_the_maximum() -> None:
    assert [raw_delay(a, BASE, MAXIMUM) for a in range(7)] == [5, 10, 20, 40, 80, 120, 120]


def test_every_actual_delay_lies_between_half_the_raw_delay_and_the_raw_delay() -> None:
    rng = random.Random(20250418)
    for _ in range(5000):
        attempt = rng.randrange(0, 12)
        raw = raw_delay(attempt, BASE, MAXIMUM)
        actual = local_backoff(attempt, BASE, MAXIMUM, rng)
        assert 0.5 * raw <= actual <= raw, (attempt, actual)


def test_the_jitter_reaches_both_ends_of_its_range_and_never_below_half() -> None:
    assert jittered_delay(40.0, SteppedRandom(0.0)) == 20.0
    assert jittered_delay(40.0, SteppedRandom(0.999999)) == pytest.approx(40.0, abs=1e-4)
    assert jittered_delay(40.0, SteppedRandom(0.5)) == 30.0


def test_draws_spread_over_the_whole_jitter_range_rather_than_clumping() -> None:
    rng = random.Random(7)
    draws = [local_backoff(3, BASE, MAXIMUM, rng) for _ in range(2000)]
    # [20, 40] split into four quarters: each gets a fair share of the draws.
    quarters = [sum(1 for d in draws if 20 + 5 * q <= d < 25 + 5 * q) for q in range(4)]
    assert all(count > 350 for count in quarters), quarters


def test_two_random_sources_do_not_produce_the_deterministic_5_10_20_40_sequence() -> None:
    deterministic = [5.0, 10.0, 20.0, 40.0]
    first = [local_backoff(a, BASE, MAXIMUM, random.Random(1)) for a in range(4)]
    second = [local_backoff(a, BASE, MAXIMUM, random.Random(2)) for a in range(4)]
    assert first != deterministic
    assert second != deterministic
    assert first != second
    # Two clients started together spread apart at every step instead of polling in lockstep.
    assert all(a != b for a, b in zip(first, second, strict=True))


def test_many_operations_started_together_get_many_different_first_checks() -> None:
    rng = random.Random(99)
    firsts = {round(first_check_at(NOW, BASE, MAXIMUM, rng), 6) for _ in range(200)}
    assert len(firsts) > 190


def test_retry_after_is_a_minimum_even_when_the_backoff_would_be_shorter() -> None:
    rng = random.Random(3)
    for attempt in range(8):
        for retry_after in (0.0, 1.0, 7.5, 30.0, 119.0, 600.0):
            plan = plan_next_check(
                now=NOW, attempt=attempt, base=BASE, maximum=MAXIMUM, rng=rng, retry_after=retry_after
            )
            assert plan.at >= NOW + retry_after, (attempt, retry_after, plan)


def test_a_retry_after_longer_than_the_backoff_decides_the_time_and_cannot_be_shortened() -> None:
    plan = plan_next_check(
        now=NOW, attempt=0, base=BASE, maximum=MAXIMUM, rng=SteppedRandom(1.0), retry_after=120.0
    )
    assert plan.at == NOW + 120.0
    assert plan.delay_source == "provider_retry_after"
    assert plan.mandatory is True


def test_a_retry_after_shorter_than_the_backoff_leaves_the_longer_backoff_in_place() -> None:
    plan = plan_next_check(
        now=NOW, attempt=3, base=BASE, maximum=MAXIMUM, rng=SteppedRandom(1.0), retry_after=2.0
    )
    assert plan.at == NOW + 40.0
    assert plan.delay_source == "local_backoff"
    assert plan.mandatory is False


def test_retry_after_stays_a_minimum_over_a_shorter_poll_hint() -> None:
    plan = plan_next_check(
        now=NOW,
        attempt=0,
        base=BASE,
        maximum=MAXIMUM,
        rng=SteppedRandom(1.0),
        retry_after=60.0,
        poll_hint=3.0,
    )
    assert plan.at == NOW + 60.0
    assert plan.delay_source == "provider_retry_after"


def test_a_poll_hint_replaces_the_backoff_whether_shorter_or_longer() -> None:
    shorter = plan_next_check(
        now=NOW, attempt=4, base=BASE, maximum=MAXIMUM, rng=SteppedRandom(1.0), poll_hint=12.0
    )
    assert shorter.at == NOW + 12.0  # the backoff alone would be 80 s
    assert shorter.delay_source == "provider_poll_hint"
    assert shorter.mandatory is False
    longer = plan_next_check(
        now=NOW, attempt=0, base=BASE, maximum=MAXIMUM, rng=SteppedRandom(1.0), poll_hint=300.0
    )
    assert longer.at == NOW + 300.0
    assert longer.delay_source == "provider_poll_hint"


@pytest.mark.parametrize("hint", [0.0, 0.1, 1.0])
def test_a_poll_hint_never_goes_below_its_floor(hint: float) -> None:
    floor = HINT_FLOOR_FRACTION * BASE
    plan = plan_next_check(
        now=NOW, attempt=0, base=BASE, maximum=MAXIMUM, rng=SteppedRandom(1.0), poll_hint=hint
    )
    assert plan.at == NOW + max(hint, floor)
    assert plan.at - NOW >= floor > 0
    assert plan.delay_source == "provider_poll_hint"


def test_without_hints_the_plan_is_the_local_backoff() -> None:
    plan = plan_next_check(now=NOW, attempt=2, base=BASE, maximum=MAXIMUM, rng=SteppedRandom(0.0))
    assert plan.at == NOW + 10.0  # raw 20, lowest jitter
    assert plan.delay_source == "local_backoff"
    assert plan.mandatory is False


@pytest.mark.parametrize("attempt", [0, 1, 2, 5, 10])
def test_a_429_without_guidance_backs_off_markedly_further_than_any_ordinary_delay(attempt: int) -> None:
    rng = random.Random(attempt)
    ordinary = [
        plan_next_check(now=NOW, attempt=attempt, base=BASE, maximum=MAXIMUM, rng=rng).at - NOW
        for _ in range(300)
    ]
    limited = [
        plan_next_check(
            now=NOW, attempt=attempt, base=BASE, maximum=MAXIMUM, rng=rng, rate_limited_without_guidance=True
        ).at
        - NOW
        for _ in range(300)
    ]
    # Not a little longer: the shortest rate-limited wait is at least twice the longest ordinary one.
    assert min(limited) >= 2 * max(ordinary)
    assert max(ordinary) <= raw_delay(attempt, BASE, MAXIMUM)


def test_the_same_draw_after_a_429_without_guidance_waits_four_times_as_long() -> None:
    ordinary = plan_next_check(now=NOW, attempt=1, base=BASE, maximum=MAXIMUM, rng=SteppedRandom(0.3))
    limited = plan_next_check(
        now=NOW,
        attempt=1,
        base=BASE,
        maximum=MAXIMUM,
        rng=SteppedRandom(0.3),
        rate_limited_without_guidance=True,
    )
    assert limited.at - NOW == pytest.approx(4 * (ordinary.at - NOW))
    assert limited.delay_source == "local_backoff"


@pytest.mark.parametrize("attempt", [62, 63, 64, 65, 1_000, 10**6, 10**18])
def test_huge_attempt_numbers_give_the_maximum_without_overflow(attempt: int) -> None:
    assert raw_delay(attempt, BASE, MAXIMUM) == MAXIMUM
    delay = local_backoff(attempt, BASE, MAXIMUM, random.Random(attempt))
    assert math.isfinite(delay)
    assert 0.5 * MAXIMUM <= delay <= MAXIMUM
    plan = plan_next_check(
        now=NOW,
        attempt=attempt,
        base=BASE,
        maximum=MAXIMUM,
        rng=random.Random(attempt),
        rate_limited_without_guidance=True,
    )
    assert math.isfinite(plan.at)
    assert NOW < plan.at <= NOW + 4 * MAXIMUM


def test_the_first_check_uses_the_attempt_0_delay_as_in_the_source_document() -> None:
    # Submitted 10:20:00: the first status request is allowed in [10:20:02.5, 10:20:05].
    started = at(10, 20, 0)
    rng = random.Random(12345)
    for _ in range(2000):
        first = first_check_at(started, BASE, MAXIMUM, rng)
        assert at(10, 20, 2.5) <= first <= at(10, 20, 5)
    assert first_check_at(started, BASE, MAXIMUM, SteppedRandom(0.0)) == at(10, 20, 2.5)
    assert first_check_at(started, BASE, MAXIMUM, SteppedRandom(0.999999)) == pytest.approx(
        at(10, 20, 5), abs=1e-3
    )


def test_the_source_documents_timeline_is_one_the_schedule_can_produce() -> None:
    # Submitted 10:20:00, polled 10:20:05, 10:20:14, 10:20:31: each gap fits its attempt's range.
    polls = [at(10, 20, 0), at(10, 20, 5), at(10, 20, 14), at(10, 20, 31)]
    for attempt, (before, after) in enumerate(itertools.pairwise(polls)):
        raw = raw_delay(attempt, BASE, MAXIMUM)
        assert 0.5 * raw <= after - before <= raw, (attempt, after - before)
