"""The fleet pace's rule (issue 29): who may send now, who holds a slot, and for how long.

A provider's [fleet] pace is kept on two GCRA clocks (`schedule.pace`), both in
the provider's pace row:

- `tat`, the bookings: every slot given out (a request admitted now, or a slot
  booked later) takes one interval of it, in the order callers come, so none
  starves behind later ones;
- `sent_tat`, the requests that really left: a request goes out only when this
  clock admits it at the moment of the decision, so the provider never sees more
  than the pace (`burst + rate·w` in any window `w`), however late callers come.

A booked slot is held for its operation from its time until `slot_hold_seconds`
after it: an agent that sleeps the `retry_after_seconds` it was told, plus its
own jitter and a slow database round trip, still finds its slot and uses it,
and a late agent never books a second slot, so it never moves the bookings'
clock for the others. When the sends' clock has no room at that moment (other
late agents just used it), its agent is told the first moment it has
(`PaceVerdict.at`) and the slot keeps its own time, so its place before later
slots, held until the hold after that moment. A slot whose agent does not come
within the hold is released: that agent books again, behind the others.

While a queue waits (the bookings' clock is ahead of now), an operation whose
request goes out books its next slot at that moment, at the queue's tail
(`book_ahead`): its turn then comes once per turn of the queue however long its
agent is away (its answer, its jitter, a slower path to the database), which is
what keeps each instance within its fair share.

An agent whose held slot was moved is told the new time less the time its call took to be decided
(`told_at`): its next call, on the same path to the database, is then decided at that time rather
than that much after it.

The sends' clock keeps room for the held slots whose time came before the
caller's and whose agents have not come yet (`owed`): otherwise agents that come
on time, or with no slot at all, take the room of one that comes a little after
its slot (its own jitter, a slower path to the database), and it is moved again
and again. Under fair shares (`share_wait`) a principal's slots go to its
operations oldest-waiting first, and a slot whose time has come counts as held
until it is used, so a principal never holds more than its share. Room the pace
has now goes the same way (`share_send`): principals take turns (the one served
least recently first), and a principal's request that leaves hands its next slot
to its operation waiting longest (`hands_slot`), so a principal with fewer
agents does not lose its turn while none of them happens to be calling; while
another principal comes first, that principal's operation waiting longest is
handed a slot before it (`share_on_send`'s `hands_other`).

Pure: the engines read the pace row and the operation's `fleet_slot_at`, call
`pace_verdict` with the time read inside their transaction, and write what it says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pollwarden.rules.schedule import pace

# How long after its time a booked slot waits for its agent: the pacing interval, and never
# less than this. It covers an agent that sleeps `retry_after_seconds` plus its own jitter
# (0.1-0.5 s in the run) and a few database round trips of up to 200 ms.
FLEET_SLOT_HOLD_SECONDS = 2.0


def slot_hold_seconds(rate: float) -> float:
    """How long after its time a booked slot is still held for its operation."""
    return max(1.0 / rate, FLEET_SLOT_HOLD_SECONDS)


def slot_held(slot_at: float | None, *, now: float, rate: float, moved_to: float | None = None) -> bool:
    """Whether an operation's booked slot is still its own at `now` (not yet released); a slot moved
    to `moved_to` (its agent came and the sends' clock had no room) is held from there."""
    if slot_at is None:
        return False
    return now <= max(slot_at, moved_to or slot_at) + slot_hold_seconds(rate)


@dataclass(frozen=True)
class PaceBucket:
    """A provider's pace row: the bookings' clock and the sends' clock (None: never used)."""

    tat: float | None
    sent_tat: float | None


def bucket_from_row(row: Sequence[object] | None) -> PaceBucket:
    """The pace row as the engines read it, `(tat, sent_tat)` (None: the provider has no row yet)."""
    if row is None:
        return PaceBucket(None, None)
    tat, sent_tat = row[0], row[1]
    return PaceBucket(
        None if tat is None else float(str(tat)), None if sent_tat is None else float(str(sent_tat))
    )


@dataclass(frozen=True)
class PaceVerdict:
    """What the pace says for one operation that may otherwise send now."""

    send: bool  # the request goes out now
    at: float  # now when it sends; else when it may (its slot, held for it)
    bucket: PaceBucket  # the pace row to write
    new_booking: bool  # a slot was taken from the pace for a later time (fair shares count it)
    books_ahead: bool = False  # it sends while a queue waits: its next slot is booked now (`book_ahead`)
    by_held_slot: bool = False  # it sends in the slot held for it (fair shares never keep it)
    moved: bool = False  # its held slot came, the sends' clock had no room: moved to `at` (`told_at`)


def pace_verdict(
    bucket: PaceBucket,
    *,
    now: float,
    held_slot: float | None,
    rate: float,
    burst: int,
    owed: int = 0,
    moved_to: float | None = None,
    came_at: float | None = None,
) -> PaceVerdict:
    """Send now, or the slot this operation holds (kept, or booked now); see the module's rule.

    `held_slot` is the operation's booked slot (`fleet_slot_at`), None without one;
    `now` is read where the decision is made, inside the transaction that writes it.
    `owed` counts the other operations' held slots whose time came before this
    one's (before `now` without one) and that are not used yet (`owed_slots`): the
    sends' clock keeps room for them, so an agent that comes after its slot (its
    jitter, a slower path to the database) is not beaten to that room by agents
    that come on time, or by one with no slot at all. `moved_to`: where its held
    slot was moved (it keeps the slot's own time, so its place before later slots).
    `came_at`: when its agent's call started (default `now`): an agent that came
    within the hold keeps its slot however long the server took to decide (a
    slower instance's checks wait for their turn at the pace row).
    """
    sent = pace(bucket.sent_tat, now=now, rate=rate, burst=burst)
    room = pace(_owing(bucket.sent_tat, owed, now=now, rate=rate), now=now, rate=rate, burst=burst)
    if slot_held(held_slot, now=now if came_at is None else min(came_at, now), rate=rate, moved_to=moved_to):
        assert held_slot is not None
        due = moved_to or held_slot  # `moved_slot` is always after the slot's own time
        if now < due:
            return PaceVerdict(False, due, bucket, new_booking=False)
        if room.admitted:  # its slot is already counted on the bookings' clock
            # Slots booked beyond the burst: demand exceeds the pace (a caller without one would queue).
            queue = not pace(bucket.tat, now=now, rate=rate, burst=burst).admitted
            sends = PaceBucket(bucket.tat, sent.next_tat)
            return PaceVerdict(True, now, sends, new_booking=False, books_ahead=queue, by_held_slot=True)
        return PaceVerdict(False, room.slot_at, bucket, new_booking=False, moved=True)
    booked = pace(bucket.tat, now=now, rate=rate, burst=burst)
    if booked.admitted and room.admitted:
        return PaceVerdict(True, now, PaceBucket(booked.next_tat, sent.next_tat), new_booking=False)
    # A slot for later: the next free one, and never before the sends' clock has room.
    at = booked.slot_at if not booked.admitted else room.slot_at
    return PaceVerdict(False, at, PaceBucket(booked.next_tat, bucket.sent_tat), new_booking=True)


def book_ahead(
    bucket: PaceBucket,
    *,
    now: float,
    rate: float,
    burst: int,
    used_slot: float | None = None,
    came_at: float | None = None,
) -> tuple[float, PaceBucket]:
    """The next slot of an operation that sends while a queue waits (`PaceVerdict.books_ahead`): the
    next free one, booked now, and the pace row with it booked.

    Booked when its request leaves, not when its agent comes back: so its place in
    the queue does not depend on how long the agent is away (its answer, its own
    interval, its jitter, a slower path to the database), and each operation gets
    one slot a turn of the queue, its fair share, wherever it runs.

    One that sends in its held slot (`used_slot`) keeps its place in the turn: the
    slot comes as much earlier than the queue's tail as the server took to decide
    after its agent came (`came_at`) in time for that slot, up to the hold. Otherwise
    an instance on a slower path to the database (its checks also wait for their
    turn at the pace row) would book each next slot that much later, and its turn
    would be that much longer than the others'. Its agent's own lateness is not
    made up: every slot still counts one interval on the bookings' clock.
    """
    step = pace(bucket.tat, now=now, rate=rate, burst=burst)
    lag = 0.0 if used_slot is None or came_at is None else now - max(used_slot, came_at)
    return max(now, step.slot_at - min(max(lag, 0.0), slot_hold_seconds(rate))), PaceBucket(
        step.next_tat, bucket.sent_tat
    )


def ahead_usable(
    slot_at: float, *, now: float, rate: float, next_poll_within: float | None, principals_slot: bool = False
) -> bool:
    """Whether a slot booked ahead at `slot_at` is one its agent can use: its next check, at most
    `next_poll_within` after `now` by its own schedule, comes before the slot's hold ends. Otherwise
    (demand below the pace: the queue is shorter than the agent's own interval) nothing is booked
    ahead; the agent books when it comes, as it would without a queue. None: unknown, never.

    Under fair shares (`principals_slot`) the slot must also not come before that check: it is one of
    the principal's few slots, and one that waits for its agent keeps the principal's other
    operations waiting too (simulated with the provider answering in 0.5 s: principals of 15 and 5
    operations 30 % apart with tight loops, 3 % so)."""
    if next_poll_within is None or (principals_slot and slot_at < now + next_poll_within):
        return False
    return slot_at + slot_hold_seconds(rate) >= now + next_poll_within


def told_at(at: float, *, now: float, came_at: float | None, rate: float) -> float:
    """When an agent whose held slot was moved to `at` (`PaceVerdict.moved`: it came for its slot and the
    sends' clock had no room) is told to come back: as much before `at` as this call's decision took
    after its call came (`came_at`; the database's round trips, the turn at the pace row), up to half
    a hold, and never before now. Its next call, on the same path, is then decided at `at`.

    Told `at` itself, an agent 200 ms from the database is decided 0.4 s after the room comes, and one
    that adds its own 0.1-0.5 s up to 0.9 s after it, while the sends' clock keeps that room for it
    (`owed`) longer than the burst's tolerance: the room goes unused (simulated: 88.7 % of the pace
    used at worst over 20 seeds; 93.7 % so). Only a moved slot is told early: its time has come, so
    the early call is not turned away as before its own slot, and the slot may be used at once."""
    if came_at is None:
        return at
    lead = min(max(now - came_at, 0.0), slot_hold_seconds(rate) / 2)
    return max(now, at - lead)


def moved_slot(slot_at: float | None, next_check_at: float | None, *, pacing: bool) -> float | None:
    """Where an operation's held slot was moved (its next check, when it waits for the pace after its
    slot's time); None when it was not."""
    if slot_at is None or next_check_at is None or not pacing or next_check_at <= slot_at:
        return None
    return next_check_at


def _owing(sent_tat: float | None, owed: int, *, now: float, rate: float) -> float | None:
    """The sends' clock as if the `owed` earlier held slots had just been used."""
    if owed <= 0:
        return sent_tat
    return (now if sent_tat is None else max(sent_tat, now)) + owed / rate


def owed_slots(held_slot: float | None, *, now: float, rate: float) -> tuple[float, float]:
    """Which other operations' slots `pace_verdict` keeps room for: held (from the first bound) and come
    before this one's (before the second)."""
    before = now if held_slot is None or held_slot > now else held_slot
    return now - slot_hold_seconds(rate), before


def share_wait(
    *,
    booked: int,
    earliest: float | None,
    older_waiting: bool,
    fleet_slots: int | None,
    now: float,
    rate: float,
) -> float | None:
    """When fair shares keep an operation from booking a new slot: the time to look again (None: it may).

    A principal holds at most `fleet_slots` slots (`booked`: its other operations'
    slots still held, the `earliest` of them). They go to its operations
    oldest-waiting first: one may book only when no other operation of its
    principal that waits for the pace (and whose agent is still coming) has sent
    its last request before this one did (`older_waiting`). So an agent that always
    comes a little later than the others (its own jitter, a slower path) still
    gets its turn. It looks again at the principal's earliest slot, or one
    interval on.
    """
    if fleet_slots is None or (booked < fleet_slots and not older_waiting):
        return None
    return earliest if earliest is not None and earliest > now else now + 1.0 / rate


def share_send(
    *,
    held_slot: bool,
    older_waiting: bool,
    other_principal_first: bool,
    fleet_slots: int | None,
    now: float,
    rate: float,
) -> float | None:
    """When fair shares keep an operation from taking room the pace has now: the time to look again
    (None: it may send).

    Only an operation without a held slot is kept (a held slot is its own). It
    waits while another principal, with an operation waiting for the pace whose
    agent is still coming, was served less recently than its own principal
    (`other_principal_first`: principals take turns, so one with more agents
    does not take more of the pace by coming more often), or while an operation
    of its own principal has waited longer (`older_waiting`: that one gets the
    room, `hands_slot`).
    """
    if fleet_slots is None or held_slot or not (older_waiting or other_principal_first):
        return None
    return now + 1.0 / rate


def hands_slot(*, sibling_waiting: bool, booked: int, fleet_slots: int | None) -> bool:
    """Whether the principal's next slot goes to its oldest waiting operation now: when one of its
    operations sends, or gives up room to it (`share_send`), and the principal holds fewer than
    `fleet_slots` slots. Its turn then does not wait for its agent to come and book."""
    return fleet_slots is not None and sibling_waiting and booked < fleet_slots


@dataclass(frozen=True)
class SendShare:
    """What fair shares say of an operation the pace would let send now (`share_on_send`)."""

    wait: float | None  # it does not send, and looks again then (None: it sends)
    hands: bool  # its principal's next slot goes to the principal's operation waiting longest
    # The principal that comes first (`other_principal_first`) is handed the next slot, before `hands`'s.
    hands_other: bool = False


def share_on_send(
    *,
    held_slot: bool,
    served: float,
    sibling_served: float | None,
    other_booked: int | None,
    booked: int,
    fleet_slots: int | None,
    now: float,
    rate: float,
) -> SendShare:
    """Fair shares on a send the pace allows (`share_send`, `hands_slot`), as the store and the
    simulation carry them out. `served`: when the operation's last request left; `sibling_served`:
    the same of its principal's operation waiting longest (None: none waits); `booked`: the slots its
    principal's other operations hold; `other_booked`: the slots held by the principal that comes first
    (it waits, served less recently: `share_send`'s `other_principal_first`), None when none does.

    It gives up the room when `share_send` says so; the room is then handed to that operation if it
    waited longer (not when it is left for another principal). One that sends hands its principal's
    next slot to that operation.

    One that sends while another principal comes first hands that principal's operation waiting
    longest a slot, before its own sibling's, if the principal holds fewer than `fleet_slots`; if it
    holds them, its turn is next and no sibling is handed one. Otherwise a principal whose few
    operations are not all waiting at the moment its turn passes loses that turn, while the other's
    slot goes on from sibling to sibling: simulated with the provider answering in 0.5 s, principals
    of 15 and 5 operations were up to 23 % from their halves; within 10 % so.
    """
    older = sibling_served is not None and sibling_served < served
    other_principal_first = other_booked is not None
    wait = share_send(
        held_slot=held_slot,
        older_waiting=older,
        other_principal_first=other_principal_first,
        fleet_slots=fleet_slots,
        now=now,
        rate=rate,
    )
    handing = older and not other_principal_first if wait is not None else sibling_served is not None
    first = wait is None and other_booked is not None
    other = first and hands_slot(sibling_waiting=True, booked=other_booked or 0, fleet_slots=fleet_slots)
    if first and not other:
        handing = False  # the principal that comes first holds its slots: its turn is next, not a sibling's
    return SendShare(
        wait, handing and hands_slot(sibling_waiting=True, booked=booked, fleet_slots=fleet_slots), other
    )


def busy_turn_retry_at(*, now: float, rate: float, waiting: int, served: int, waited: float) -> float:
    """When a check that waited `waited` s for its server's turn at the pace row, while `served` turns
    went by and `waiting` checks (itself among them) still wait, may look again: after those checks
    have had their turns at the speed the turns just went, never before one pacing interval, and never
    more than `waited` on (a longer estimate only says the turns are slow; it comes back and queues).

    Such a check read nothing under a lock: its server's checks reach the pace row slower than they
    come (a slow path to the database), so it is told when to come back, as a paced check would be,
    instead of an error (issue 29: a check that fails tells its agent nothing it can follow).
    """
    per_turn = waited / served if served > 0 else waited
    return now + max(1.0 / rate, min(waiting * per_turn, waited))
