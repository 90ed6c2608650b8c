"""Fleet pacing: one shared bucket per provider, taken in the reservation transaction.

Three layers of proof: the pure GCRA step (`schedule.pace`), a fleet of
operations on a fake clock through the in-process MCP client (the fake
provider's log, attributed to the virtual time of each call, holds the
envelope), and two real `pollwarden serve` processes on one database whose
requests the fake provider timestamps with its own wall clock.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from harness import database_in, full_delays, make_harness, merge, view, write_table
from pollwarden.core.clock import FakeClock
from pollwarden.core.timefmt import iso, parse_iso
from pollwarden.rules.fleet_pace import (
    FLEET_SLOT_HOLD_SECONDS,
    PaceBucket,
    pace_verdict,
    slot_held,
    slot_hold_seconds,
)
from pollwarden.rules.gate import Verdict
from pollwarden.rules.schedule import pace
from pollwarden.store import open_store
from pollwarden_providers import load_tables
from tests.support.fake_provider import FakeProvider, pending, succeeded

# ----- helpers -------------------------------------------------------------------------------


def envelope_excess(times: Sequence[float], *, rate: float, burst: int, slack_seconds: float = 0.0) -> float:
    """How far the busiest window exceeds `burst + rate·w` (<= 0 means the pace held).

    For the requests i..j of the sorted times, the window is `w = t_j - t_i`;
    `slack_seconds` widens every window (clock jitter between processes).
    """
    ts = sorted(times)
    worst = float("-inf")
    for i in range(len(ts)):
        for j in range(i, len(ts)):
            allowed = burst + rate * (ts[j] - ts[i] + slack_seconds)
            worst = max(worst, (j - i + 1) - allowed)
    return worst


def busiest_window(times: Sequence[float], *, rate: float, burst: int) -> str:
    """A readable description of the window that exceeds the envelope the most."""
    ts = sorted(times)
    best = (float("-inf"), 0, 0)
    for i in range(len(ts)):
        for j in range(i, len(ts)):
            excess = (j - i + 1) - (burst + rate * (ts[j] - ts[i]))
            best = max(best, (excess, i, j))
    _, i, j = best
    return f"{j - i + 1} requests in {ts[j] - ts[i]:.3f} s (allowed {burst} + {rate:g}/s)"


@dataclass
class Booking:
    """One request at the gate: when it arrived and when it was allowed to go."""

    arrival: float
    sent_at: float
    booked: bool


def serve_arrivals(arrivals: Sequence[float], *, rate: float, burst: int) -> list[Booking]:
    """Run arrivals (in order) through `pace` the way the store does.

    A request that is admitted goes at once; one that is booked comes back at
    its slot and goes then without a second pacing step (its slot is already
    counted in the bucket).
    """
    tat: float | None = None
    out: list[Booking] = []
    for arrival in arrivals:
        step = pace(tat, now=arrival, rate=rate, burst=burst)
        tat = step.next_tat
        out.append(Booking(arrival, step.slot_at, booked=not step.admitted))
    return out


# ----- (a) the pure GCRA step ------------------------------------------------------------------


def test_a_burst_is_admitted_at_once_and_then_each_request_is_booked_one_interval_later() -> None:
    bookings = serve_arrivals([100.0] * 8, rate=4.0, burst=3)
    assert [b.booked for b in bookings] == [False] * 3 + [True] * 5
    assert [b.sent_at for b in bookings] == [100.0, 100.0, 100.0, 100.25, 100.5, 100.75, 101.0, 101.25]


def test_with_a_burst_of_one_only_the_first_request_passes_and_the_slots_are_exactly_one_over_rate_apart() -> (
    None
):
    bookings = serve_arrivals([0.0] * 6, rate=5.0, burst=1)
    slots = [b.sent_at for b in bookings]
    assert not bookings[0].booked
    assert all(b.booked for b in bookings[1:])
    assert [round(b - a, 9) for a, b in itertools.pairwise(slots)] == [0.2] * 5


def test_an_idle_bucket_refills_so_a_later_request_passes_at_once_again() -> None:
    first = pace(None, now=0.0, rate=2.0, burst=2)
    second = pace(first.next_tat, now=0.0, rate=2.0, burst=2)
    third = pace(second.next_tat, now=0.0, rate=2.0, burst=2)
    assert (first.admitted, second.admitted, third.admitted) == (True, True, False)
    assert third.slot_at == 0.5
    # Long after the queue drained, the whole burst is available again.
    later = pace(third.next_tat, now=60.0, rate=2.0, burst=2)
    again = pace(later.next_tat, now=60.0, rate=2.0, burst=2)
    assert later.admitted
    assert again.admitted
    assert later.slot_at == 60.0


def test_a_request_is_never_booked_earlier_than_it_arrived() -> None:
    step = pace(5.0, now=10.0, rate=1.0, burst=1)
    assert step.admitted
    assert step.slot_at == 10.0
    assert step.next_tat == 11.0


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=2.0, allow_nan=False), min_size=1, max_size=60),
    rate=st.sampled_from([0.5, 1.0, 2.0, 5.0, 10.0, 25.0]),
    burst=st.integers(min_value=1, max_value=6),
)
def test_bookings_follow_arrival_order_hold_the_envelope_and_every_booked_slot_is_reached(
    gaps: list[float], rate: float, burst: int
) -> None:
    arrivals: list[float] = []
    t = 1_000.0
    for gap in gaps:
        t += gap
        arrivals.append(t)
    bookings = serve_arrivals(arrivals, rate=rate, burst=burst)
    sent = [b.sent_at for b in bookings]
    # Never before arrival; booked strictly later, admitted exactly on arrival.
    for b in bookings:
        assert b.sent_at >= b.arrival
        assert (b.sent_at > b.arrival) == b.booked
    # FIFO at the gate: the order of service is the order of arrival.
    assert sent == sorted(sent)
    # No starvation: every request goes within the time the ones before it need.
    for k, b in enumerate(bookings):
        assert b.sent_at <= arrivals[k] + (k + 1) / rate + 1e-9
    # The fleet envelope: no window of length w holds more than burst + rate·w.
    assert envelope_excess(sent, rate=rate, burst=burst) <= 1e-6, busiest_window(sent, rate=rate, burst=burst)


def test_a_booked_slot_is_held_for_its_operation_the_interval_and_at_least_two_seconds_then_released() -> (
    None
):
    # rate 5/s: held two seconds, whatever the agent's jitter and round trips within that.
    assert slot_held(10.0, now=10.0, rate=5.0)
    assert slot_held(10.0, now=10.0 + FLEET_SLOT_HOLD_SECONDS, rate=5.0)
    assert not slot_held(10.0, now=10.01 + FLEET_SLOT_HOLD_SECONDS, rate=5.0)
    # rate 0.1/s: held one interval.
    assert slot_hold_seconds(0.1) == 10.0
    assert slot_held(10.0, now=20.0, rate=0.1)
    assert not slot_held(10.0, now=20.01, rate=0.1)
    assert not slot_held(None, now=10.0, rate=5.0)


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=2.0, allow_nan=False), min_size=1, max_size=40),
    lateness=st.lists(st.floats(min_value=0.0, max_value=3.0, allow_nan=False), min_size=40, max_size=40),
    rate=st.sampled_from([0.5, 1.0, 2.0, 5.0, 10.0, 25.0]),
    burst=st.integers(min_value=1, max_value=6),
)
def test_late_callers_never_push_the_sends_past_the_envelope_and_every_caller_is_served(
    gaps: list[float], lateness: list[float], rate: float, burst: int
) -> None:
    """The store's rule on virtual time: a booked caller comes back late by any amount (up to 3 s,
    past the hold); it sends when its held slot and the sends' clock allow, else comes back as told."""
    bucket = PaceBucket(None, None)
    pending: list[tuple[float, float | None]] = []  # (time it comes to the gate, its booked slot)
    t = 1_000.0
    for gap in gaps:
        t += gap
        pending.append((t, None))
    sent: list[float] = []
    late = iter(lateness * 1000)
    steps = 0
    while pending:
        steps += 1
        assert steps < 20_000, "a caller is never served"
        pending.sort(key=lambda p: p[0])
        arrival, slot = pending.pop(0)
        verdict = pace_verdict(bucket, now=arrival, held_slot=slot, rate=rate, burst=burst)
        bucket = verdict.bucket
        if verdict.send:
            sent.append(arrival)
        else:
            assert verdict.at >= arrival
            pending.append((verdict.at + next(late), verdict.at))
    # Exactly at the pace, with no slack: the sends' clock is taken at the decision.
    assert len(sent) == len(gaps)
    assert envelope_excess(sent, rate=rate, burst=burst) <= 1e-6, busiest_window(sent, rate=rate, burst=burst)


# ----- (b) a fleet on a fake clock, through the MCP client -----------------------------------

RATE = 4.0  # 0.25 s apart: every time in these tests is exact in binary floating point
BURST = 3
BASE_DELAY = 0.5
FLEET_TABLE: dict[str, Any] = {
    "fleet": {"max_requests_per_second": RATE, "burst": BURST},
    "schedule": {"base_delay_seconds": BASE_DELAY, "max_delay_seconds": 8},
}


@dataclass
class FleetTrace:
    """What a driven fleet did, as seen by the agents and by the fake provider."""

    sent_at: list[float] = field(default_factory=list[float])  # virtual time of every logged request
    bookings: list[tuple[str, float, float]] = field(default_factory=list[tuple[str, float, float]])
    polls: list[tuple[str, float]] = field(default_factory=list[tuple[str, float]])
    paced_views: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    final: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])
    ticks: int = 0


async def start_fleet(client: Client, prefix: str, count: int) -> tuple[list[str], dict[str, float]]:
    """Start `count` operations at the current fake time; their ids and first allowed check times."""
    ids: list[str] = []
    due: dict[str, float] = {}
    for i in range(count):
        op = f"{prefix}-{i:02d}"
        started = view(
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": op, "provider_job_id": op}
            )
        )
        ids.append(op)
        due[op] = started["retry_after_seconds"]
    return ids, due


async def drive_fleet(
    clients: Sequence[Client],
    clock: Any,
    fake: FakeProvider,
    due_in: dict[str, float],
    *,
    max_ticks: int = 400,
    late_by: float = 0.0,
) -> FleetTrace:
    """Call check_status for every operation whenever it is allowed, on virtual time.

    Each tick jumps the clock to the earliest allowed time (plus `late_by`, an
    agent that comes back late) and checks every due operation in the order it
    became due, spreading the calls over `clients` (several servers on one
    database). Each request in the fake's log is stamped with the virtual
    time of the call that caused it.
    """
    trace = FleetTrace()
    start = clock.now()
    next_at = {op: start + delay for op, delay in due_in.items()}
    order = {op: n for n, op in enumerate(next_at)}
    call = 0
    while next_at:
        trace.ticks += 1
        assert trace.ticks <= max_ticks, "the fleet did not finish: an operation is starving"
        clock.t = max(clock.t, min(next_at.values()) + late_by)
        now = clock.now()
        due = sorted((op for op, at in next_at.items() if at <= now), key=lambda op: (next_at[op], order[op]))
        for op in due:
            client = clients[call % len(clients)]
            call += 1
            before = len(fake.log())
            result = view(await client.call_tool("check_status", {"operation_id": op, "wait_seconds": 0}))
            sent = len(fake.log()) - before
            trace.sent_at.extend([now] * sent)
            if result["outcome"] == "polled":
                trace.polls.append((op, now))
            if result["delay_source"] == "fleet_pacing" and result["outcome"] == "not_yet":
                trace.paced_views.append(result)
                trace.bookings.append((op, now, now + result["retry_after_seconds"]))
            if result["status"] == "waiting":
                next_at[op] = now + result["retry_after_seconds"]
            else:
                trace.final[op] = result
                del next_at[op]
    return trace


@pytest.mark.anyio
async def test_a_fleet_of_due_operations_reaches_the_provider_at_the_configured_pace_and_none_starves(
    tmp_path: Path, fake: FakeProvider
) -> None:
    count = 24
    for i in range(count):
        fake.script(f"pace-{i:02d}", [pending("running"), succeeded()])
    # The draws are chosen at 1.0, so every first check is due at one instant: the pace's worst case.
    h = make_harness(tmp_path, fake, table=FLEET_TABLE, rng=full_delays())
    async with h.client() as client:
        ids, due = await start_fleet(client, "pace", count)
        first_due = h.clock.now() + BASE_DELAY
        assert set(due.values()) == {BASE_DELAY}  # every check is due at the same moment
        trace = await drive_fleet([client], h.clock, fake, due)

    # The provider saw exactly two requests per job (running, then succeeded): nothing extra.
    assert len(fake.log()) == 2 * count
    assert {op for op, _ in trace.polls} == set(ids)
    assert all(trace.final[op]["status"] == "succeeded" for op in ids)
    # The burst went out at once; no window held more than burst + rate·w.
    assert trace.sent_at.count(first_due) == BURST
    assert envelope_excess(trace.sent_at, rate=RATE, burst=BURST) <= 1e-9, busiest_window(
        trace.sent_at, rate=RATE, burst=BURST
    )
    # The shared pace is the bottleneck: 48 requests, 3 at once, then one every 0.25 s, but for the
    # slots booked ahead by operations whose request then found the job finished (issue 29: a slot
    # is booked when a request leaves while a queue waits; nobody else may use it): over 95 % used.
    paced_span = max(trace.sent_at) - first_due
    assert paced_span >= (2 * count - BURST) / RATE
    assert (2 * count - BURST) / RATE / paced_span >= 0.95, paced_span

    # Waiting operations were told why and when: not_yet, fleet_pacing, the booked slot.
    assert trace.paced_views, "nothing was paced"
    for result in trace.paced_views:
        assert result["outcome"] == "not_yet"
        assert result["status"] == "waiting"
        assert result["delay_source"] == "fleet_pacing"
        assert result["retry_after_seconds"] > 0
    for (op, booked_at, slot), result in zip(trace.bookings, trace.paced_views, strict=True):
        assert result["operation_id"] == op
        assert result["next_check_at"] == iso(slot)
        # Slots sit on the grid of the shared pace.
        assert ((slot - first_due) * RATE).is_integer(), (op, booked_at, slot)
    slots = [slot for _, _, slot in trace.bookings]
    assert len(set(slots)) == len(slots), "two operations were given the same slot"
    # Each served exactly at its booked slot. (A slot booked ahead when a request left is told to its
    # agent when it next comes, so the order agents are told in is not the order slots were booked.)
    for op, _, slot in trace.bookings:
        assert (op, slot) in trace.polls, f"{op} was not polled at its booked slot {slot}"
    # A paced refusal counts nothing: every job used exactly its two status requests.
    assert {trace.final[op]["status_requests_used"] for op in ids} == {2}


@pytest.mark.anyio
async def test_an_agent_a_little_late_for_its_booked_slot_still_uses_it_instead_of_queueing_again(
    tmp_path: Path, fake: FakeProvider
) -> None:
    count = 16
    late = 0.03  # on time: within a quarter interval (62.5 ms at 4/s) and the 50 ms cap
    for i in range(count):
        fake.script(f"tardy-{i:02d}", [pending("running"), succeeded()])
    h = make_harness(tmp_path, fake, table=FLEET_TABLE)
    async with h.client() as client:
        _, due = await start_fleet(client, "tardy", count)
        trace = await drive_fleet([client], h.clock, fake, due, late_by=late)

    assert len(fake.log()) == 2 * count
    assert len(trace.final) == count
    assert trace.bookings
    for op, _, slot in trace.bookings:
        assert (op, slot + late) in trace.polls, f"{op} lost its slot {slot} by coming {late} s late"
    assert envelope_excess(trace.sent_at, rate=RATE, burst=BURST, slack_seconds=late) <= 1e-9


@pytest.mark.anyio
async def test_an_agent_late_for_its_slot_still_uses_it_and_the_next_slot_waits_so_they_never_bunch(
    tmp_path: Path, fake: FakeProvider
) -> None:
    for op in ("tardy-a", "tardy-b", "tardy-c"):
        fake.script(op, [pending("running")])
    h = make_harness(
        tmp_path, fake, table={**FLEET_TABLE, "fleet": {"max_requests_per_second": RATE, "burst": 1}}
    )
    interval = 1 / RATE
    sent: list[float] = []

    async def check(client: Client, op: str) -> dict[str, Any]:
        before = len(fake.log())
        result = view(await client.call_tool("check_status", {"operation_id": op}))
        sent.extend([h.clock.now()] * (len(fake.log()) - before))
        return result

    async with h.client() as client:
        for op in ("tardy-a", "tardy-b", "tardy-c"):
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": op, "provider_job_id": op}
            )
        h.clock.advance(BASE_DELAY)
        t0 = h.clock.now()
        assert (await check(client, "tardy-a"))["outcome"] == "polled"
        b = await check(client, "tardy-b")
        c = await check(client, "tardy-c")
        assert [b["retry_after_seconds"], c["retry_after_seconds"]] == [interval, 2 * interval]
        # b comes back 0.2 s after its slot, just before c's: its slot was held for it.
        h.clock.t = t0 + interval + 0.2
        assert (await check(client, "tardy-b"))["outcome"] == "polled"
        # c on time: one interval after b's request has not passed yet, so c keeps its slot, moved there.
        h.clock.t = t0 + 2 * interval
        moved = await check(client, "tardy-c")
        assert (moved["outcome"], moved["delay_source"]) == ("not_yet", "fleet_pacing")
        assert moved["retry_after_seconds"] == pytest.approx(0.2)
        h.clock.t = t0 + 2 * interval + 0.2
        assert (await check(client, "tardy-c"))["outcome"] == "polled"
    assert sent == [t0, t0 + interval + 0.2, t0 + 2 * interval + 0.2]
    assert envelope_excess(sent, rate=RATE, burst=1) <= 1e-9


@pytest.mark.anyio
async def test_a_slow_round_trip_to_the_database_does_not_turn_a_booked_slot_late(
    tmp_path: Path, fake: FakeProvider
) -> None:
    for op in ("gate-a", "gate-b"):
        fake.script(op, [pending("running")])
    h = make_harness(
        tmp_path, fake, table={**FLEET_TABLE, "fleet": {"max_requests_per_second": RATE, "burst": 1}}
    )
    async with h.client() as client:
        for op in ("gate-a", "gate-b"):
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": op, "provider_job_id": op}
            )
        h.clock.advance(BASE_DELAY)
        view(await client.call_tool("check_status", {"operation_id": "gate-a"}))
        booked = view(await client.call_tool("check_status", {"operation_id": "gate-b"}))
        slot = h.clock.now() + booked["retry_after_seconds"]
    table = load_tables([h.tables_dir], include_shipped=False)["acme"]
    async with open_store(h.db_path) as store:
        # The caller decided at its slot; the write lock was held 0.3 s later (a slow path, or
        # another process's lock): the time is read there, and the slot is still its own.
        start = await store.begin_check(
            "gate-b",
            now=slot,
            wait_until=slot,
            owner="slow",
            lease_seconds=30,
            fleets={"acme": table.fleet},
            clock=lambda: slot + 0.3,
        )
        assert start is not None
        assert start.decision.kind == Verdict.RESERVE
        assert start.record.status_requests_used == 1
        assert start.record.lease_expires_at == slot + 0.3 + 30


class SlowDatabaseClock(FakeClock):
    """A fake clock read `lag` later inside a store transaction (on SQLite's own thread): the time under
    the locks comes after the round trips to the database, as on an instance far from it."""

    def __init__(self, lag: float) -> None:
        super().__init__()
        self.lag = lag

    def now(self) -> float:
        if threading.current_thread() is not threading.main_thread():
            self.t += self.lag
        return self.t


@pytest.mark.anyio
@pytest.mark.one_engine  # the clock's lag is read on SQLite's own thread; the subject is the wait loop
async def test_a_call_that_waits_for_its_slot_on_a_slow_path_to_the_database_sends_a_round_trip_after_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # Issue 29: the round that booked the slot took `lag` to decide; a sleep measured from that round's
    # start woke `lag` after the slot, and the next round decided another `lag` later.
    for op in ("wait-a", "wait-b"):
        fake.script(op, [pending("running")])
    lag = 0.1
    h = make_harness(
        tmp_path,
        fake,
        table={**FLEET_TABLE, "fleet": {"max_requests_per_second": RATE, "burst": 1}},
        clock=SlowDatabaseClock(lag),
    )
    async with h.client() as client:
        for op in ("wait-a", "wait-b"):
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": op, "provider_job_id": op}
            )
        h.clock.advance(BASE_DELAY)
        asked = h.clock.now()
        assert view(await client.call_tool("check_status", {"operation_id": "wait-a"}))["outcome"] == "polled"
        slot = asked + lag + 1 / RATE  # one interval after a's request, taken `lag` after a's call came
        b = view(await client.call_tool("check_status", {"operation_id": "wait-b", "wait_seconds": 5}))
    assert b["outcome"] == "polled"
    assert parse_iso(b["request_sent_at"]) == pytest.approx(slot + lag, abs=1e-3)


@pytest.mark.anyio
async def test_two_servers_on_one_database_share_one_bucket(tmp_path: Path, fake: FakeProvider) -> None:
    count = 16
    for i in range(count):
        fake.script(f"pair-{i:02d}", [pending("running"), succeeded()])
    h = make_harness(tmp_path, fake, table=FLEET_TABLE)
    async with h.client() as first, h.client() as second:
        _, due = await start_fleet(first, "pair", count)
        trace = await drive_fleet([first, second], h.clock, fake, due)

    assert len(fake.log()) == 2 * count
    assert len(trace.final) == count
    # Alternating servers cannot double the pace: the bucket lives in the database.
    assert envelope_excess(trace.sent_at, rate=RATE, burst=BURST) <= 1e-9, busiest_window(
        trace.sent_at, rate=RATE, burst=BURST
    )
    assert len(trace.bookings) >= count - BURST


@pytest.mark.anyio
async def test_without_a_fleet_section_every_due_operation_is_polled_at_once(
    tmp_path: Path, fake: FakeProvider
) -> None:
    count = 24
    for i in range(count):
        fake.script(f"free-{i:02d}", [pending("running"), succeeded()])
    # The draws are chosen at 1.0, so every first check is due at one instant.
    h = make_harness(tmp_path, fake, table={"schedule": FLEET_TABLE["schedule"]}, rng=full_delays())
    async with h.client() as client:
        _, due = await start_fleet(client, "free", count)
        first_due = h.clock.now() + BASE_DELAY
        trace = await drive_fleet([client], h.clock, fake, due)

    assert len(fake.log()) == 2 * count
    assert trace.sent_at.count(first_due) == count
    assert trace.bookings == []
    assert trace.ticks == 2  # every operation, polled twice, all at once each time
    assert all(r["delay_source"] != "fleet_pacing" for r in trace.final.values())


@pytest.mark.anyio
async def test_agents_that_come_back_long_after_their_booked_slots_queue_again_instead_of_bursting(
    tmp_path: Path, fake: FakeProvider
) -> None:
    count = 20
    for i in range(count):
        fake.script(f"late-{i:02d}", [succeeded()])
    h = make_harness(tmp_path, fake, table=FLEET_TABLE)
    async with h.client() as client:
        _, due = await start_fleet(client, "late", count)
        h.clock.advance(BASE_DELAY)
        now = h.clock.now()
        booked: list[str] = []
        for op in sorted(due):
            result = view(await client.call_tool("check_status", {"operation_id": op}))
            if result["outcome"] == "not_yet":
                assert result["delay_source"] == "fleet_pacing"
                booked.append(op)
        assert len(booked) == count - BURST
        # Every agent ignores retry_after_seconds and comes back a minute after the last slot.
        h.clock.advance((count - BURST) / RATE + 60)
        later = h.clock.now()
        before = len(fake.log())
        again = [view(await client.call_tool("check_status", {"operation_id": op})) for op in booked]
        burst_now = len(fake.log()) - before
        # A slot nobody used is gone: the late-comers share the bucket again, burst first.
        assert burst_now == BURST, f"{burst_now} requests at once at {later - now:g} s"
        queued = [r for r in again if r["outcome"] == "not_yet"]
        assert len(queued) == len(booked) - BURST
        assert all(r["delay_source"] == "fleet_pacing" for r in queued)
        # And they are still all served, at the pace, in the order they came back.
        rest = {r["operation_id"]: r["retry_after_seconds"] for r in queued}
        trace = await drive_fleet([client], h.clock, fake, rest)
    assert len(trace.final) == len(queued)
    times = [later] * burst_now + trace.sent_at
    assert envelope_excess(times, rate=RATE, burst=BURST) <= 1e-9, busiest_window(
        times, rate=RATE, burst=BURST
    )
    assert len(fake.log()) == count


# ----- (c) two real server processes, one database, the provider's own clock ----------------

PROCESS_RATE = 5.0
PROCESS_BURST = 1
PROCESS_OPS = 20
# A request reaches the provider's clock a little after its slot: up to the on-time
# tolerance after it (a later caller gives the slot up), then the commit of the
# reservation (an fsync) and the HTTP send, in one of two server processes busy on
# two cores. The allowance for that last part is 0.1 s; measured under a parallel
# CPU load, the whole lag stayed under 0.05 s (it reached 0.175 s while slots were
# held 0.25 s and the gate read the time before waiting for the database lock, which
# is what made this test flaky). 0.15 s still needs two requests 50 ms apart at
# least, and the whole run to hold 5/s; unpaced, these 40 requests arrive within 0.3 s.
SEND_LATENCY_ALLOWANCE_SECONDS = 0.1
# The sends' clock is taken at the decision; before issue 29 a slot could also be used up to
# 50 ms late, and this slack kept that allowance.
CLOCK_SLACK_SECONDS = 0.05 + SEND_LATENCY_ALLOWANCE_SECONDS


def _serve_params(db: Any, tables: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "pollwarden", "serve", "--db", str(db), "--providers", str(tables)],
        env={"PYTHONUNBUFFERED": "1"},
    )


# Alone: under pytest-xdist, other workers' processes on the same cores delayed requests past the
# allowance now and then (0.12 s of the 0.15 s slack measured with a loaded machine); with nothing
# beside it the lag stays under 0.05 s (tests/support/parallel.py).
@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.anyio
async def test_two_server_processes_on_one_database_hold_the_configured_rate_by_the_providers_own_clock(
    tmp_path: Path, fake: FakeProvider
) -> None:
    ops = [f"proc-{i:02d}" for i in range(PROCESS_OPS)]
    for op in ops:
        fake.script(op, [pending("running"), succeeded()])
    table = merge(
        make_harness(tmp_path, fake).table,
        {
            "fleet": {"max_requests_per_second": PROCESS_RATE, "burst": PROCESS_BURST},
            "schedule": {"base_delay_seconds": 0.05, "max_delay_seconds": 0.2},
        },
    )
    tables = tmp_path / "tables"
    write_table(tables, table)
    db = database_in(tmp_path)
    finals: dict[str, dict[str, Any]] = {}

    with anyio.fail_after(60):
        async with Client(_serve_params(db, tables)) as a, Client(_serve_params(db, tables)) as b:
            for n, op in enumerate(ops):  # half the operations started by each process
                client = a if n % 2 == 0 else b
                args = {"provider": "acme", "operation_id": op, "provider_job_id": op}
                view(await client.call_tool("start_operation", args))
            await anyio.sleep(0.1)  # every first check is due: the two processes now race for the bucket

            async def agent(client: Client, op: str) -> None:
                # Each call waits (holding no lease) for its allowed time: its backoff or its booked slot.
                for _ in range(10):
                    args = {"operation_id": op, "wait_seconds": 20}
                    result = view(await client.call_tool("check_status", args))
                    if result["status"] != "waiting":
                        finals[op] = result
                        return

            async with anyio.create_task_group() as tg:
                # Both processes drive every operation at once: 40 calls in flight on one bucket.
                for op in ops:
                    tg.start_soon(agent, a, op)
                    tg.start_soon(agent, b, op)

    log = [e for e in fake.log() if e["route"] == "status"]
    assert len(log) == 2 * PROCESS_OPS, "each job is polled exactly twice (running, succeeded)"
    assert set(finals) == set(ops)
    assert all(r["status"] == "succeeded" for r in finals.values())
    stamps = sorted(e["started_at_wall"] for e in log)
    excess = envelope_excess(
        stamps, rate=PROCESS_RATE, burst=PROCESS_BURST, slack_seconds=CLOCK_SLACK_SECONDS
    )
    assert excess <= 1e-9, busiest_window(stamps, rate=PROCESS_RATE, burst=PROCESS_BURST)
    # The whole run was paced by the shared bucket: 40 requests need at least 39 intervals.
    span = stamps[-1] - stamps[0]
    assert span >= (len(stamps) - PROCESS_BURST) / PROCESS_RATE - CLOCK_SLACK_SECONDS
    # ...and not much more: nobody starved behind the queue.
    assert span <= (len(stamps) - PROCESS_BURST) / PROCESS_RATE + 3.0


@pytest.mark.anyio
async def test_concurrent_checks_through_one_server_do_not_collide_in_one_database_transaction(
    tmp_path: Path, fake: FakeProvider
) -> None:
    count = 8
    for i in range(count):
        fake.script(f"conc-{i:02d}", [pending("running")])
    h = make_harness(tmp_path, fake, table=FLEET_TABLE)
    errors: list[str] = []
    async with h.client() as client:
        _, due = await start_fleet(client, "conc", count)
        h.clock.advance(max(due.values()))

        async def check(op: str) -> None:
            result = await client.call_tool("check_status", {"operation_id": op})
            if result.is_error:
                errors.append(" ".join(getattr(block, "text", "") for block in result.content))

        async with anyio.create_task_group() as tg:
            for op in due:
                tg.start_soon(check, op)
    assert errors == []
