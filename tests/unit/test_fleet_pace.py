"""The fleet pace's rule (`pollwarden.rules.fleet_pace`), step by step on numbers."""

from __future__ import annotations

import pytest

from pollwarden.rules.fleet_pace import (
    PaceBucket,
    ahead_usable,
    book_ahead,
    busy_turn_retry_at,
    hands_slot,
    moved_slot,
    owed_slots,
    pace_verdict,
    share_on_send,
    share_send,
    share_wait,
    slot_held,
    slot_hold_seconds,
    told_at,
)

RATE = 5.0  # one slot every 0.2 s
BURST = 1


def test_a_held_slot_is_used_late_without_taking_a_second_slot_from_the_bookings_clock() -> None:
    bucket = PaceBucket(tat=12.0, sent_tat=9.0)  # slots booked up to 12 s; last request at 8.8 s
    verdict = pace_verdict(bucket, now=10.4, held_slot=10.0, rate=RATE, burst=BURST)
    assert verdict.send
    assert verdict.bucket == PaceBucket(tat=12.0, sent_tat=10.6)  # the bookings' clock did not move
    assert not verdict.new_booking


def test_a_held_slot_with_no_room_on_the_sends_clock_is_kept_and_moved_to_the_first_moment_with_room() -> (
    None
):
    bucket = PaceBucket(tat=12.0, sent_tat=10.5)  # a request left at 10.3 s
    verdict = pace_verdict(bucket, now=10.4, held_slot=10.0, rate=RATE, burst=BURST)
    assert not verdict.send
    assert verdict.at == 10.5
    assert verdict.bucket == bucket
    assert not verdict.new_booking  # still its own slot: no fair share counted, no clock moved
    assert verdict.moved  # its agent may be told to come as much earlier as its call took (`told_at`)


def test_a_slot_whose_agent_does_not_come_within_the_hold_is_released_and_the_agent_books_behind_the_others() -> (
    None
):
    bucket = PaceBucket(tat=20.0, sent_tat=12.0)
    late = 10.0 + slot_hold_seconds(RATE) + 0.01
    verdict = pace_verdict(bucket, now=late, held_slot=10.0, rate=RATE, burst=BURST)
    assert not verdict.send
    assert verdict.new_booking
    assert verdict.at == 20.0
    assert verdict.bucket.tat == 20.2


def test_a_newcomer_sends_only_when_both_clocks_have_room() -> None:
    free = pace_verdict(PaceBucket(None, None), now=5.0, held_slot=None, rate=RATE, burst=BURST)
    assert free.send
    assert free.bucket == PaceBucket(5.2, 5.2)
    # Bookings' clock free, but late agents just used the sends' clock: booked where it has room.
    busy = pace_verdict(PaceBucket(5.0, 5.3), now=5.0, held_slot=None, rate=RATE, burst=BURST)
    assert not busy.send
    assert busy.at == 5.3
    assert busy.new_booking
    assert busy.bucket == PaceBucket(5.2, 5.3)


def test_an_agent_early_for_its_slot_keeps_it_and_waits() -> None:
    bucket = PaceBucket(12.0, 9.0)
    verdict = pace_verdict(bucket, now=9.5, held_slot=10.0, rate=RATE, burst=BURST)
    assert (verdict.send, verdict.at, verdict.bucket, verdict.new_booking) == (False, 10.0, bucket, False)
    assert not verdict.moved  # told its slot as it is: an earlier call would be turned away


@pytest.mark.parametrize(
    ("booked", "earliest", "older_waiting", "fleet_slots", "waits_for"),
    [
        (0, None, False, None, None),  # no fair shares: anyone books
        (9, 11.0, True, None, None),
        (0, None, False, 1, None),  # its principal holds nothing and nobody waited longer
        (1, 11.0, False, 1, 11.0),  # its one slot is held: look again at that slot
        (1, 9.5, False, 1, 10.2),  # held, its time come, its agent on the way: one interval on
        (0, None, True, 1, 10.2),  # another of its operations has waited longer: that one books first
        (1, 11.0, True, 2, 11.0),
        (1, 11.0, False, 2, None),  # room for a second slot
    ],
)
def test_a_principals_slots_are_capped_and_go_to_its_operations_oldest_waiting_first(
    booked: int, earliest: float | None, older_waiting: bool, fleet_slots: int | None, waits_for: float | None
) -> None:
    wait = share_wait(
        booked=booked,
        earliest=earliest,
        older_waiting=older_waiting,
        fleet_slots=fleet_slots,
        now=10.0,
        rate=RATE,
    )
    assert wait == waits_for


def test_room_is_kept_for_an_earlier_held_slot_whose_agent_has_not_come_yet() -> None:
    # The sends' clock has room for one request now; another operation's slot came at 10.0 s and
    # its agent (further from the database) is on its way.
    bucket = PaceBucket(tat=10.2, sent_tat=10.2)
    on_time = pace_verdict(bucket, now=10.2, held_slot=10.2, rate=RATE, burst=BURST)
    assert on_time.send  # nothing owed: the on-time agent takes the room
    kept = pace_verdict(bucket, now=10.2, held_slot=10.2, rate=RATE, burst=BURST, owed=1)
    assert not kept.send  # the room is the late agent's: this one keeps its slot, moved after it
    assert kept.at == pytest.approx(10.4)
    assert not kept.new_booking
    late = pace_verdict(bucket, now=10.3, held_slot=10.0, rate=RATE, burst=BURST)
    assert late.send  # and the late agent finds it


def test_an_operation_without_a_slot_is_not_admitted_into_room_owed_to_a_held_slot() -> None:
    bucket = PaceBucket(tat=10.0, sent_tat=10.0)
    assert pace_verdict(bucket, now=10.0, held_slot=None, rate=RATE, burst=BURST).send
    booked = pace_verdict(bucket, now=10.0, held_slot=None, rate=RATE, burst=BURST, owed=1)
    assert not booked.send
    assert booked.new_booking
    assert booked.at == pytest.approx(10.2)  # the first moment after the owed request


@pytest.mark.parametrize(
    ("held_slot", "bounds"),
    [
        (None, (8.0, 10.0)),  # without a slot: every slot still held whose time has come
        (9.5, (8.0, 9.5)),  # with one: only those before it
        (10.5, (8.0, 10.0)),  # its own not come yet (it waits anyway)
    ],
)
def test_the_slots_owed_room_are_the_others_still_held_whose_time_came_first(
    held_slot: float | None, bounds: tuple[float, float]
) -> None:
    assert owed_slots(held_slot, now=10.0, rate=RATE) == bounds


@pytest.mark.parametrize(
    ("slot_at", "next_check_at", "pacing", "moved_to"),
    [
        (10.0, 10.6, True, 10.6),  # its agent came after the slot and was told to come back at 10.6
        (10.0, 10.0, True, None),  # told its own slot: not moved
        (10.0, 30.0, False, None),  # a next check from the schedule (a slot booked ahead): not moved
        (None, 10.6, True, None),  # no slot
    ],
)
def test_a_slot_is_moved_only_when_its_agent_waits_for_the_pace_after_its_time(
    slot_at: float | None, next_check_at: float, pacing: bool, moved_to: float | None
) -> None:
    assert moved_slot(slot_at, next_check_at, pacing=pacing) == moved_to


def test_a_moved_slot_is_held_from_where_it_was_moved_and_released_after_the_hold_from_there() -> None:
    hold = slot_hold_seconds(RATE)
    assert not slot_held(10.0, now=10.0 + hold + 0.5, rate=RATE)
    assert slot_held(10.0, now=10.0 + hold + 0.5, rate=RATE, moved_to=11.0)
    assert not slot_held(10.0, now=11.0 + hold + 0.01, rate=RATE, moved_to=11.0)


def test_only_a_request_sent_while_slots_are_booked_beyond_the_burst_books_its_next_slot() -> None:
    queued = pace_verdict(
        PaceBucket(tat=12.0, sent_tat=9.0), now=10.4, held_slot=10.0, rate=RATE, burst=BURST
    )
    assert (queued.send, queued.books_ahead) == (True, True)
    slot, bucket = book_ahead(queued.bucket, now=10.4, rate=RATE, burst=BURST)
    assert (slot, bucket) == (12.0, PaceBucket(tat=12.2, sent_tat=10.6))  # the tail, booked
    calm = pace_verdict(PaceBucket(tat=10.0, sent_tat=9.0), now=10.4, held_slot=None, rate=RATE, burst=BURST)
    assert (calm.send, calm.books_ahead) == (True, False)


def test_a_slot_booked_ahead_keeps_its_place_in_the_turn_however_long_the_server_took_to_decide() -> None:
    # Issue 29: an instance 200 ms from the database decides 0.4 s after its agent came on time, so
    # its next slot at the queue's tail came 0.4 s later each turn: its turns were longer.
    bucket = PaceBucket(tat=14.0, sent_tat=9.0)
    on_time, _ = book_ahead(bucket, now=10.0, rate=RATE, burst=BURST, used_slot=10.0, came_at=10.0)
    slow, after = book_ahead(bucket, now=10.4, rate=RATE, burst=BURST, used_slot=10.0, came_at=10.0)
    assert on_time == 14.0
    assert slow == pytest.approx(13.6)  # its place in the turn, not 0.4 s behind it
    assert after == PaceBucket(tat=14.2, sent_tat=9.0)  # still one interval of the bookings' clock
    # Its agent's own lateness (it came 0.3 s after its slot) is not made up.
    late, _ = book_ahead(bucket, now=10.7, rate=RATE, burst=BURST, used_slot=10.0, came_at=10.3)
    assert late == pytest.approx(13.6)
    # At most the hold is made up, and never a slot before now.
    hold = slot_hold_seconds(RATE)
    capped, _ = book_ahead(bucket, now=10.0 + hold + 3, rate=RATE, burst=BURST, used_slot=10.0, came_at=10.0)
    assert capped == pytest.approx(10.0 + hold + 3)
    assert book_ahead(bucket, now=10.4, rate=RATE, burst=BURST)[0] == 14.0  # no slot used: the tail


@pytest.mark.parametrize(
    ("came_at", "now", "told"),
    [
        (10.0, 10.0, 12.0),  # decided as it came (SQLite): told its slot
        (9.6, 10.0, 11.6),  # decided 0.4 s after it came (200 ms to the database): told 0.4 s before
        (7.0, 10.0, 11.0),  # a long wait for its turn is made up only to half the hold (1 s)
        (10.0, 9.9, 12.0),  # a clock read before the call came is no lead
        (8.0, 11.9, 11.9),  # the lead would reach back past now: told now
    ],
)
def test_an_agent_whose_slot_was_moved_is_told_it_less_the_time_its_call_took_to_be_decided(
    came_at: float, now: float, told: float
) -> None:
    # Issue 29: told the moved slot itself, an agent 200 ms from the database is decided 0.4 s after it,
    # and the room kept for it meanwhile goes unused once its own jitter is added (88.7 % of the pace).
    assert told_at(12.0, now=now, came_at=came_at, rate=RATE) == pytest.approx(told)
    assert told_at(12.0, now=10.0, came_at=None, rate=RATE) == 12.0  # unknown: told the slot


def test_under_fair_shares_a_slot_is_booked_ahead_only_where_it_comes_after_its_agents_next_check() -> None:
    # Its agent checks again at most 3 s from now; the slot's hold is 2 s.
    assert ahead_usable(11.5, now=10.0, rate=RATE, next_poll_within=3.0)  # held until its agent comes
    assert not ahead_usable(11.5, now=10.0, rate=RATE, next_poll_within=3.0, principals_slot=True)
    assert ahead_usable(13.5, now=10.0, rate=RATE, next_poll_within=3.0, principals_slot=True)
    assert not ahead_usable(13.5, now=10.0, rate=RATE, next_poll_within=None)


def test_a_check_that_could_not_get_its_servers_turn_at_the_pace_row_comes_back_after_the_checks_ahead() -> (
    None
):
    # Four turns went by in 5 s while it waited; three checks (it among them) still wait.
    assert busy_turn_retry_at(now=100.0, rate=RATE, waiting=3, served=4, waited=5.0) == 103.75
    # Never before one pacing interval.
    assert busy_turn_retry_at(now=100.0, rate=1.0, waiting=1, served=50, waited=5.0) == 101.0
    # Never more than the time it waited (one turn in 5 s, 20 waiting: not 100 s, past its deadline).
    assert busy_turn_retry_at(now=100.0, rate=RATE, waiting=20, served=1, waited=5.0) == 105.0


def test_an_agent_that_came_within_the_hold_keeps_its_slot_however_long_the_server_took_to_decide() -> None:
    # Issue 29: a slower instance's checks wait their turn at the pace row; the agent was on time.
    bucket = PaceBucket(tat=20.0, sent_tat=9.0)
    hold = slot_hold_seconds(RATE)
    decided = 10.0 + hold + 3.0
    kept = pace_verdict(bucket, now=decided, held_slot=10.0, rate=RATE, burst=BURST, came_at=10.5)
    assert (kept.send, kept.new_booking) == (True, False)
    lost = pace_verdict(
        bucket, now=decided, held_slot=10.0, rate=RATE, burst=BURST, came_at=10.0 + hold + 0.1
    )
    assert (lost.send, lost.new_booking) == (False, True)  # it came after the hold: it books again


@pytest.mark.parametrize(
    ("held_slot", "older_waiting", "other_principal_first", "fleet_slots", "expected"),
    [
        (False, False, False, 1, None),  # nobody waits longer: it sends
        (False, True, False, 1, 10.2),  # its principal's operation waiting longer gets the room
        (False, False, True, 1, 10.2),  # a principal served less recently gets the room
        (True, True, True, 1, None),  # a held slot is its own
        (False, True, True, None, None),  # no fair shares: first come, first served
    ],
)
def test_fair_shares_leave_room_the_pace_has_now_to_whoever_waited_longer(
    held_slot: bool,
    older_waiting: bool,
    other_principal_first: bool,
    fleet_slots: int | None,
    expected: float | None,
) -> None:
    wait = share_send(
        held_slot=held_slot,
        older_waiting=older_waiting,
        other_principal_first=other_principal_first,
        fleet_slots=fleet_slots,
        now=10.0,
        rate=RATE,
    )
    assert wait == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("held_slot", "sibling_served", "other_booked", "expected"),
    [
        # (waits, hands its sibling, hands the other principal): sends, served at 9.0
        (True, 5.0, None, (False, True, False)),  # nobody else comes first: its sibling gets the next slot
        (True, 5.0, 0, (False, True, True)),  # the principal that comes first is handed one, then its sibling
        (True, None, 0, (False, False, True)),  # no sibling waits: only the other principal's
        (
            True,
            5.0,
            1,
            (False, False, False),
        ),  # it holds its one slot: its turn is next, nobody is handed one
        (False, 5.0, 0, (True, False, False)),  # no held slot: it leaves the room to that principal
    ],
)
def test_a_request_that_leaves_while_another_principal_comes_first_hands_that_principal_a_slot_first(
    held_slot: bool, sibling_served: float | None, other_booked: int | None, expected: tuple[bool, bool, bool]
) -> None:
    share = share_on_send(
        held_slot=held_slot,
        served=9.0,
        sibling_served=sibling_served,
        booked=0,
        fleet_slots=1,
        now=10.0,
        rate=RATE,
        other_booked=other_booked,
    )
    assert (share.wait is not None, share.hands, share.hands_other) == expected


def test_a_principals_next_slot_is_handed_on_only_within_its_share() -> None:
    assert hands_slot(sibling_waiting=True, booked=0, fleet_slots=1)
    assert not hands_slot(sibling_waiting=True, booked=1, fleet_slots=1)  # it holds its one slot
    assert hands_slot(sibling_waiting=True, booked=1, fleet_slots=2)
    assert not hands_slot(sibling_waiting=False, booked=0, fleet_slots=1)
    assert not hands_slot(sibling_waiting=True, booked=0, fleet_slots=None)
