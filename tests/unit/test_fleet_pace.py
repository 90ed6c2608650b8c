"""The fleet pace's rule (`pollwarden.rules.fleet_pace`), step by step on numbers."""

from __future__ import annotations

from pollwarden.rules.fleet_pace import PaceBucket, decide_pace, slot_hold_seconds

RATE = 5.0  # one slot every 0.2 s
BURST = 1


def test_a_held_slot_is_used_late_without_taking_a_second_slot_from_the_bookings_clock() -> None:
    bucket = PaceBucket(tat=12.0, sent_tat=9.0)  # slots booked up to 12 s; last request at 8.8 s
    verdict = decide_pace(bucket, now=10.4, held_slot=10.0, rate=RATE, burst=BURST)
    assert verdict.send
    assert verdict.bucket == PaceBucket(tat=12.0, sent_tat=10.6)  # the bookings' clock did not move
    assert not verdict.new_booking


def test_a_held_slot_with_no_room_on_the_sends_clock_is_kept_and_moved_to_the_first_moment_with_room() -> (
    None
):
    bucket = PaceBucket(tat=12.0, sent_tat=10.5)  # a request left at 10.3 s
    verdict = decide_pace(bucket, now=10.4, held_slot=10.0, rate=RATE, burst=BURST)
    assert not verdict.send
    assert verdict.at == 10.5
    assert verdict.bucket == bucket
    assert not verdict.new_booking  # still its own slot: no fair share counted, no clock moved


def test_a_slot_whose_agent_does_not_come_within_the_hold_is_released_and_the_agent_books_behind_the_others() -> (
    None
):
    bucket = PaceBucket(tat=20.0, sent_tat=12.0)
    late = 10.0 + slot_hold_seconds(RATE) + 0.01
    verdict = decide_pace(bucket, now=late, held_slot=10.0, rate=RATE, burst=BURST)
    assert not verdict.send
    assert verdict.new_booking
    assert verdict.at == 20.0
    assert verdict.bucket.tat == 20.2


def test_a_newcomer_sends_only_when_both_clocks_have_room() -> None:
    free = decide_pace(PaceBucket(None, None), now=5.0, held_slot=None, rate=RATE, burst=BURST)
    assert free.send
    assert free.bucket == PaceBucket(5.2, 5.2)
    # Bookings' clock free, but late agents just used the sends' clock: booked where it has room.
    busy = decide_pace(PaceBucket(5.0, 5.3), now=5.0, held_slot=None, rate=RATE, burst=BURST)
    assert not busy.send
    assert busy.at == 5.3
    assert busy.new_booking
    assert busy.bucket == PaceBucket(5.2, 5.3)


def test_an_agent_early_for_its_slot_keeps_it_and_waits() -> None:
    bucket = PaceBucket(12.0, 9.0)
    verdict = decide_pace(bucket, now=9.5, held_slot=10.0, rate=RATE, burst=BURST)
    assert (verdict.send, verdict.at, verdict.bucket, verdict.new_booking) == (False, 10.0, bucket, False)
