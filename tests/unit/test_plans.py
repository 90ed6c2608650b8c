"""The store's rules, once, in pure code (`pollwarden.store.plans`): what each transaction writes.

Each engine reads what a plan needs and carries its writes out; the engine conformance suite
(tests/integration/test_engine_conformance.py) shows both do. Here: the rules themselves.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from harness import operation_record
from pollwarden.audit.entry import NO_REFUSALS, PendingRefusals
from pollwarden.core.records import ApprovalRecord, FollowupRecord, OperationRecord
from pollwarden.core.vocabulary import (
    ApprovalKind,
    ApprovalStatus,
    DelaySource,
    FollowupKind,
    FollowupStatus,
    Outcome,
    Status,
    StopReason,
)
from pollwarden.rules.fleet_pace import PaceBucket, PaceVerdict
from pollwarden.rules.gate import GateVerdict, Verdict
from pollwarden.store import pace_reads, plans
from pollwarden.store.plans import Append, CountRefusal, Execute, Flush, HandSlot, Plan, SetPace, Update
from pollwarden_providers.table_limits import FleetSpec

NOW = 2000.0
RESERVE = GateVerdict(Verdict.RESERVE)
FLEET = FleetSpec(max_requests_per_second=1.0, burst=1)


def waiting(**changes: Any) -> OperationRecord:
    """A waiting operation, due at 1005 with requests left and no lease, with `changes`."""
    return operation_record(status_requests_used=3, stopped_at=None, **changes)


def kinds(plan: Plan) -> list[str]:
    """The plan's writes as words: `Flush`, `Update`, `SetPace`, `Count:<outcome>`, `Append:<audit kind>`."""
    out: list[str] = []
    for write in plan.writes:
        if isinstance(write, Append):
            out.append(f"Append:{write.entry.kind}")
        elif isinstance(write, CountRefusal):
            out.append(f"Count:{write.outcome}")
        else:
            out.append(type(write).__name__)
    return out


def update_of(plan: Plan) -> dict[str, object]:
    """The one `Update`'s changes."""
    (update,) = [w for w in plan.writes if isinstance(w, Update)]
    return dict(update.changes)


# -- carrying out the gate's verdict ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("lease", "expected"),
    [
        (None, ["Flush", "Update", "Append:stopped"]),
        ("dead-call", ["Flush", "Append:lease_recovered", "Update", "Append:stopped"]),
    ],
)
def test_a_stop_before_any_request_writes_the_refusals_then_the_stop_and_tells_a_lease_it_recovered(
    lease: str | None, expected: list[str]
) -> None:
    record = waiting(lease_owner=lease, lease_expires_at=None if lease is None else NOW - 1)
    stop = GateVerdict(Verdict.STOP, stop_reason=StopReason.DEADLINE_EXCEEDED, stop_detail="passed")
    plan = plans.check_plan(record, stop, now=NOW, owner="me", lease_seconds=30)
    assert kinds(plan) == expected
    assert plan.record.status == Status.ESCALATED
    assert plan.record.stop_reason == StopReason.DEADLINE_EXCEEDED
    assert (plan.record.lease_owner, plan.record.stopped_at, plan.record.version) == (
        None,
        NOW,
        record.version + 1,
    )
    assert plan.record.status_requests_used == record.status_requests_used  # nothing sent, nothing counted


@pytest.mark.parametrize("step", [Verdict.NOT_YET, Verdict.STOPPED])
def test_a_refused_call_is_only_counted(step: Verdict) -> None:
    record = waiting()
    plan = plans.check_plan(record, GateVerdict(step), now=NOW, owner="me", lease_seconds=30)
    assert kinds(plan) == [f"Count:{GateVerdict(step).refusal}"]
    assert plan.record is record


@pytest.mark.parametrize(
    ("lease", "expected"),
    [(None, ["Update"]), ("dead-call", ["Flush", "Append:lease_recovered", "Update"])],
)
def test_a_reservation_counts_the_request_and_takes_the_lease(lease: str | None, expected: list[str]) -> None:
    record = waiting(
        lease_owner=lease, lease_expires_at=None if lease is None else NOW - 1, fleet_slot_at=1990.0
    )
    plan = plans.check_plan(record, RESERVE, now=NOW, owner="me", lease_seconds=30)
    assert kinds(plan) == expected
    assert update_of(plan) == {
        "status_requests_used": 4,
        "fleet_slot_at": None,
        "lease_owner": "me",
        "lease_expires_at": NOW + 30,
        "request_sent_at": NOW,  # served when reserved, until its answer records when it left
    }
    assert plan.decision == RESERVE


@pytest.mark.parametrize(
    ("refusals", "decision", "quiet"),
    [
        (NO_REFUSALS, GateVerdict(Verdict.NOT_YET), True),
        (PendingRefusals(3, Outcome.NOT_YET, 1.0, 2.0), GateVerdict(Verdict.NOT_YET), True),
        (
            PendingRefusals(3, Outcome.STOPPED, 1.0, 2.0),
            GateVerdict(Verdict.NOT_YET),
            False,
        ),  # the other kind first
        (
            PendingRefusals(99, Outcome.NOT_YET, 1.0, 2.0),
            GateVerdict(Verdict.NOT_YET),
            False,
        ),  # completes a row
        (NO_REFUSALS, RESERVE, False),
    ],
)
def test_only_a_count_that_writes_no_audit_row_is_quiet(
    refusals: PendingRefusals, decision: GateVerdict, quiet: bool
) -> None:
    assert plans.quiet_refusal(refusals, decision) is quiet


# -- pacing and fair shares -------------------------------------------------------------------------


NO_ROW = PaceBucket(None, None)


@pytest.mark.parametrize(
    ("record", "decision", "fleet", "taken"),
    [
        (waiting(), RESERVE, FLEET, True),
        (waiting(), RESERVE, None, False),  # no [fleet] pace
        (waiting(), GateVerdict(Verdict.NOT_YET), FLEET, False),  # no reservation
        (waiting(next_check_at=NOW + 1), RESERVE, FLEET, False),  # its guard would not hold
        (waiting(fleet_slot_at=NOW), RESERVE, FLEET, True),  # its own slot: the sends' clock still decides
    ],
)
def test_the_pace_is_read_only_by_a_reservation_whose_guard_holds_on_a_paced_provider(
    record: OperationRecord, decision: GateVerdict, fleet: FleetSpec | None, taken: bool
) -> None:
    assert pace_reads.needs_pace(record, decision, fleet, now=NOW) is taken
    assert (pace_reads.pace_step(record, decision, fleet, NO_ROW, now=NOW) is not None) is taken


def test_an_admitted_request_moves_both_clocks_and_is_reserved() -> None:
    record = waiting()
    step = pace_reads.pace_step(record, RESERVE, FLEET, NO_ROW, now=NOW)
    assert step is not None
    assert step.send
    plan = plans.check_plan(record, RESERVE, now=NOW, owner="me", lease_seconds=30, step=step, bucket=NO_ROW)
    assert kinds(plan) == ["SetPace", "Update"]
    assert plan.writes[0] == SetPace("acme", NOW + 1.0, NOW + 1.0)
    assert plan.decision == RESERVE


def test_a_used_up_pace_books_the_next_free_slot_and_counts_nothing() -> None:
    record = waiting()
    bucket = PaceBucket(NOW + 3.0, NOW + 3.0)
    step = pace_reads.pace_step(record, RESERVE, FLEET, bucket, now=NOW)
    assert step is not None
    assert (step.send, step.new_booking) == (False, True)
    plan = plans.check_plan(record, RESERVE, now=NOW, owner="me", lease_seconds=30, step=step, bucket=bucket)
    assert kinds(plan) == ["SetPace", "Update"]
    assert update_of(plan) == {
        "fleet_slot_at": NOW + 3.0,
        "next_check_at": NOW + 3.0,
        "delay_source": DelaySource.FLEET_PACING,
    }
    assert plan.decision == GateVerdict(Verdict.PACED, allowed_at=NOW + 3.0)
    assert plan.record.status_requests_used == record.status_requests_used


def test_a_slot_held_for_its_agent_is_kept_without_moving_the_pace() -> None:
    record = waiting(fleet_slot_at=NOW + 2.0, next_check_at=NOW - 1)
    bucket = PaceBucket(NOW + 3.0, NOW)
    step = pace_reads.pace_step(record, RESERVE, FLEET, bucket, now=NOW)
    assert step is not None
    assert (step.send, step.new_booking, step.at) == (False, False, NOW + 2.0)
    plan = plans.check_plan(record, RESERVE, now=NOW, owner="me", lease_seconds=30, step=step, bucket=bucket)
    assert kinds(plan) == ["Update"]  # the pace row is as read
    assert plan.decision == GateVerdict(Verdict.PACED, allowed_at=NOW + 2.0)


@pytest.mark.parametrize(
    ("booked", "fleet_slots", "waits_for"),
    [
        ((2, NOW + 1.0, 0), 2, NOW + 1.0),  # its share is used: it waits for its earliest slot
        ((3, NOW + 1.0, 0), 2, NOW + 1.0),
        ((1, NOW - 0.5, 0), 1, NOW + 1.0),  # a slot still held, its agent due: one interval on
        ((1, NOW + 1.0, 0), 2, None),  # room in its share: it books one more
        ((0, None, 0), 1, None),
        ((0, None, 1), 1, NOW + 1.0),  # room, but another has waited longer: its turn first
        ((1, NOW + 1.5, 2), 2, NOW + 1.5),
        ((5, NOW + 1.0, 3), None, None),  # no fair shares
    ],
)
def test_fair_shares_a_principal_holding_its_share_or_owing_an_older_waiter_waits(
    booked: tuple[int, float | None, int], fleet_slots: int | None, waits_for: float | None
) -> None:
    record = waiting()
    bucket = PaceBucket(NOW + 3.0, NOW + 3.0)
    step = pace_reads.pace_step(record, RESERVE, FLEET, bucket, now=NOW)
    assert pace_reads.needs_booked_slots(step, fleet_slots) is (fleet_slots is not None)
    plan = plans.check_plan(
        record,
        RESERVE,
        now=NOW,
        owner="me",
        lease_seconds=30,
        step=step,
        bucket=bucket,
        booked=booked,
        fleet_slots=fleet_slots,
        fleet=FLEET,
    )
    if waits_for is None:
        assert kinds(plan) == ["SetPace", "Update"]
        assert update_of(plan)["fleet_slot_at"] == NOW + 3.0
    else:
        assert kinds(plan) == ["Update"]  # nothing taken from the pace
        assert update_of(plan) == {
            "fleet_slot_at": None,
            "next_check_at": waits_for,
            "delay_source": DelaySource.FLEET_PACING,
        }
        assert plan.decision == GateVerdict(Verdict.PACED, allowed_at=waits_for)


def test_the_booked_slots_read_counts_held_slots_and_ranks_by_the_last_request() -> None:
    record = dataclasses.replace(waiting(), request_sent_at=NOW - 7.0)
    params = pace_reads.booked_slots_params(record, FLEET, now=NOW)
    assert params["held_since"] == NOW - 2.0  # a slot is held 2 s past its time (at 1/s)
    assert params["served_at"] == NOW - 7.0
    never = pace_reads.booked_slots_params(dataclasses.replace(record, request_sent_at=None), FLEET, now=NOW)
    assert never["served_at"] == record.created_at  # never sent: waiting since it was created
    assert pace_reads.booked_slots((2, NOW + 1.0, 1)) == (2, NOW + 1.0, 1)
    assert pace_reads.booked_slots((0, None, None)) == (0, None, 0)
    assert pace_reads.booked_slots(None) == (0, None, 0)


def test_booked_slots_are_read_only_for_a_send_or_a_new_booking_under_fair_shares() -> None:
    sends = PaceVerdict(True, NOW, NO_ROW, new_booking=False)
    ahead = PaceVerdict(True, NOW, NO_ROW, new_booking=False, books_ahead=True)
    kept = PaceVerdict(False, NOW + 1, NO_ROW, new_booking=False)
    booking = PaceVerdict(False, NOW + 1, NO_ROW, new_booking=True)
    assert not pace_reads.needs_booked_slots(None, 2)
    assert pace_reads.needs_booked_slots(sends, 2)  # a send may leave its room to others, or hand a slot on
    assert pace_reads.needs_booked_slots(ahead, 2)
    assert not pace_reads.needs_booked_slots(kept, 2)
    assert pace_reads.needs_booked_slots(booking, 2)
    assert not pace_reads.needs_booked_slots(booking, None)
    assert not pace_reads.needs_booked_slots(sends, None)


def test_a_request_that_leaves_on_its_slot_while_a_queue_waits_books_its_next_slot_at_the_tail() -> None:
    # Issue 29: booked when the request leaves, so the agent's time away does not cost it its place.
    record = waiting(fleet_slot_at=NOW - 0.5, next_check_at=NOW - 0.5)
    bucket = PaceBucket(NOW + 5.0, NOW - 1.0)  # five more slots booked; room on the sends' clock
    step = pace_reads.pace_step(record, RESERVE, FLEET, bucket, now=NOW)
    assert step is not None
    assert (step.send, step.books_ahead) == (True, True)
    args: dict[str, Any] = {
        "owner": "me",
        "lease_seconds": 30,
        "step": step,
        "bucket": bucket,
        "fleet": FLEET,
    }
    # Its own schedule brings it back within 3 s: before the slot at NOW + 5 is released.
    plan = plans.check_plan(record, RESERVE, now=NOW, next_poll_within=3.0, **args)
    assert kinds(plan) == ["SetPace", "Update"]
    assert plan.writes[0] == SetPace("acme", NOW + 6.0, NOW + 1.0)  # one more slot booked, one request sent
    assert update_of(plan)["fleet_slot_at"] == NOW + 5.0 - (FLEET.burst - 1)  # the next free slot
    assert plan.decision == RESERVE
    # Its schedule keeps it away 30 s, past the slot's hold: a slot booked now would go unused, and
    # hold back the others. Nothing is booked ahead; it books when it comes, as without a queue.
    away = plans.check_plan(record, RESERVE, now=NOW, next_poll_within=30.0, **args)
    assert away.writes[0] == SetPace("acme", NOW + 5.0, NOW + 1.0)  # the bookings' clock did not move
    assert update_of(away)["fleet_slot_at"] is None
    assert away.decision == RESERVE
    unknown = plans.check_plan(record, RESERVE, now=NOW, **args)
    assert update_of(unknown)["fleet_slot_at"] is None
    # No queue (the pace has room now): nothing is booked ahead.
    calm = pace_reads.pace_step(record, RESERVE, FLEET, PaceBucket(NOW - 1.0, NOW - 1.0), now=NOW)
    assert calm is not None
    assert (calm.send, calm.books_ahead) == (True, False)


def test_a_request_decided_after_its_agent_came_on_time_books_its_next_slot_as_much_before_the_tail() -> None:
    # Issue 29: the slot it used was at NOW - 0.5 and its agent came then; the server decided at NOW (a
    # slower path to the database, its turn at the pace row). Its next slot keeps its place in the turn.
    record = waiting(fleet_slot_at=NOW - 0.5, next_check_at=NOW - 0.5)
    bucket = PaceBucket(NOW + 5.0, NOW - 1.0)
    step = pace_reads.pace_step(record, RESERVE, FLEET, bucket, now=NOW, came_at=NOW - 0.5)
    assert step is not None
    plan = plans.check_plan(
        record,
        RESERVE,
        now=NOW,
        owner="me",
        lease_seconds=30,
        step=step,
        bucket=bucket,
        fleet=FLEET,
        next_poll_within=3.0,
        came_at=NOW - 0.5,
    )
    assert plan.writes[0] == SetPace("acme", NOW + 6.0, NOW + 1.0)  # still one slot on the bookings' clock
    assert update_of(plan)["fleet_slot_at"] == NOW + 4.5  # the tail, less the 0.5 s the decision took


def test_an_agent_whose_slot_is_moved_is_told_the_new_time_less_the_time_its_call_took() -> None:
    # Issue 29: its slot came at NOW - 0.5; its call came at NOW - 0.4 and was decided at NOW (two trips
    # to the database); the sends' clock has room at NOW + 1 only.
    record = waiting(fleet_slot_at=NOW - 0.5, next_check_at=NOW - 0.5)
    bucket = PaceBucket(NOW + 2.0, NOW + 1.0)
    args = {"owner": "me", "lease_seconds": 30, "bucket": bucket, "fleet": FLEET}
    step = pace_reads.pace_step(record, RESERVE, FLEET, bucket, now=NOW, came_at=NOW - 0.4)
    assert step is not None
    assert (step.send, step.moved, step.at) == (False, True, NOW + 1.0)
    plan = plans.check_plan(record, RESERVE, now=NOW, step=step, came_at=NOW - 0.4, **args)
    assert update_of(plan) == {"next_check_at": NOW + 0.6, "delay_source": DelaySource.FLEET_PACING}
    assert plan.decision == GateVerdict(Verdict.PACED, allowed_at=NOW + 0.6)
    # Its next call, told so, is decided at NOW + 1 on the slot it still holds: not turned away as early.
    assert not pace_reads.before_own_slot(plan.record, FLEET, now=NOW + 0.6)
    # Decided as it came: told the new time itself.
    same = plans.check_plan(record, RESERVE, now=NOW, step=step, came_at=NOW, **args)
    assert update_of(same)["next_check_at"] == NOW + 1.0
    # A slot booked now is told as it is: a call before its slot would be turned away as early.
    fresh = waiting(fleet_slot_at=None, next_check_at=NOW - 1.0)
    booked = pace_reads.pace_step(fresh, RESERVE, FLEET, bucket, now=NOW, came_at=NOW - 0.4)
    assert booked is not None
    assert (booked.send, booked.new_booking, booked.moved) == (False, True, False)
    later = plans.check_plan(fresh, RESERVE, now=NOW, step=booked, came_at=NOW - 0.4, **args)
    assert update_of(later)["next_check_at"] == update_of(later)["fleet_slot_at"] == booked.at


def test_a_check_that_could_not_get_its_turn_at_the_pace_row_is_told_when_and_gives_up_its_slot() -> None:
    record = waiting(fleet_slot_at=NOW - 0.5, next_check_at=NOW - 0.5)
    plan = plans.busy_turn_plan(record, NOW + 3.0, NOW)
    assert kinds(plan) == ["Update"]  # the operation's row alone: no pace row, no audit row
    assert update_of(plan) == {
        "next_check_at": NOW + 3.0,
        "delay_source": DelaySource.FLEET_PACING,
        "fleet_slot_at": None,  # released: no room is kept for it on the sends' clock
    }
    assert plan.decision == GateVerdict(Verdict.PACED, allowed_at=NOW + 3.0)
    assert (plan.record.next_check_at, plan.record.fleet_slot_at) == (NOW + 3.0, None)


def test_under_fair_shares_a_request_books_ahead_only_when_none_of_its_principals_operations_waits() -> None:
    record = waiting(fleet_slot_at=NOW - 0.5, next_check_at=NOW - 0.5)
    bucket = PaceBucket(NOW + 5.0, NOW - 1.0)
    step = pace_reads.pace_step(record, RESERVE, FLEET, bucket, now=NOW)
    assert step is not None
    cases: list[tuple[tuple[int, float | None, int], tuple[str, float] | None, bool]] = [
        ((0, None, 0), None, True),
        ((0, None, 0), ("op-sibling", NOW - 0.1), False),  # waiting, if not longer: it is handed the slot
        ((0, None, 1), None, False),
        ((1, NOW + 2.0, 0), None, False),
    ]
    for booked, sibling, books in cases:
        plan = fair_send(record, bucket, sibling=sibling, booked=booked)
        assert plan.decision == RESERVE  # the request goes out either way
        assert (update_of(plan)["fleet_slot_at"] is not None) is books, booked
    # Its agent comes back at most 6 s on, after the slot at the tail (NOW + 5): without fair shares the
    # slot is held for it (its hold reaches past 6 s); under them it would keep the principal's one
    # slot idle meanwhile, and nothing is booked ahead.
    late = {"owner": "me", "lease_seconds": 30, "step": step, "bucket": bucket, "fleet": FLEET}
    alone = plans.check_plan(record, RESERVE, now=NOW, next_poll_within=6.0, **late)
    shared = fair_send(record, bucket, next_poll_within=6.0)
    assert update_of(alone)["fleet_slot_at"] is not None
    assert update_of(shared)["fleet_slot_at"] is None


def test_a_held_slot_moved_for_lack_of_room_keeps_its_own_time_and_so_its_place() -> None:
    record = waiting(fleet_slot_at=NOW - 0.5, next_check_at=NOW - 0.5)
    bucket = PaceBucket(NOW + 5.0, NOW + 2.0)  # the sends' clock has room only at NOW + 1
    step = pace_reads.pace_step(record, RESERVE, FLEET, bucket, now=NOW)
    assert step is not None
    assert (step.send, step.new_booking) == (False, False)
    plan = plans.check_plan(record, RESERVE, now=NOW, owner="me", lease_seconds=30, step=step, bucket=bucket)
    assert update_of(plan) == {"next_check_at": step.at, "delay_source": DelaySource.FLEET_PACING}
    # Coming back at the moved time, it is still held there (the hold runs from the moved time).
    moved = plan.record
    assert moved.fleet_slot_at == NOW - 0.5
    later = step.at + 1.9
    again = pace_reads.pace_step(moved, RESERVE, FLEET, PaceBucket(NOW + 5.0, later - 1.0), now=later)
    assert again is not None
    assert (again.send, again.new_booking) == (True, False)


# -- the answer -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("holder", "applied", "expected"),
    [
        ("me", True, ["Flush", "Update", "Append:polled"]),
        ("peer", False, ["Flush", "Append:late_answer_ignored"]),
    ],
)
def test_an_answer_is_applied_only_while_its_call_holds_the_lease(
    holder: str, applied: bool, expected: list[str]
) -> None:
    record = waiting(lease_owner=holder, lease_expires_at=NOW + 10)
    plan = plans.answer_plan(record, owner="me", changes={"polls_completed": 13}, at=NOW, payload_extra={})
    assert (plan.applied, kinds(plan)) == (applied, expected)
    if applied:
        assert update_of(plan) == {"polls_completed": 13, "lease_owner": None, "lease_expires_at": None}
        assert plan.record.polls_completed == 13
    else:
        assert plan.record is record


# -- submitting -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "allow_stale", "free"),
    [
        ({}, False, True),
        ({"lease_owner": "peer", "lease_expires_at": NOW + 5}, True, False),  # a live send
        ({"lease_owner": "peer", "lease_expires_at": NOW - 5}, True, True),  # a dead one, resend is safe
        ({"lease_owner": "peer", "lease_expires_at": NOW - 5}, False, False),
        ({"resubmission_of": "op-0"}, False, False),  # a person has yet to approve it
        ({"resubmission_of": "op-0", "resubmission_approved_by": "ana"}, False, True),
        ({"status": Status.WAITING}, False, False),
    ],
)
def test_the_submission_lease_is_taken_only_when_free(
    changes: dict[str, Any], allow_stale: bool, free: bool
) -> None:
    record = operation_record(**{"status": Status.SUBMITTING, **changes})
    plan = plans.claim_plan(record, owner="me", now=NOW, lease_seconds=30, allow_stale=allow_stale, note="n")
    assert plan.applied is free
    assert kinds(plan) == (["Flush", "Update", "Append:submit_sending"] if free else ["Flush"])


@pytest.mark.parametrize(
    ("lease", "expires_in", "owner", "applied"),
    [
        ("me", 5, "me", True),
        ("peer", 5, "me", False),
        # Without an owner (a stop decided from a read outside the transaction): never over a submission
        # another call claimed since and is sending, only over a free or a stale lease.
        ("peer", 5, None, False),
        ("peer", 0, None, True),
        (None, 5, None, True),
    ],
)
def test_a_submission_is_finished_only_by_the_call_holding_it(
    lease: str | None, expires_in: float, owner: str | None, applied: bool
) -> None:
    record = operation_record(status=Status.SUBMITTING, lease_owner=lease, lease_expires_at=NOW + expires_in)
    plan = plans.finish_plan(
        record,
        owner=owner,
        changes={"status": Status.WAITING},
        kind="submitted",
        at=NOW,
        note=None,
        payload_extra=None,
    )
    assert plan.applied is applied
    if applied:
        assert update_of(plan) == {"status": Status.WAITING, "lease_owner": None, "lease_expires_at": None}


def test_a_submission_answered_with_another_operations_job_adopts_nothing_and_stops() -> None:
    record = operation_record(status=Status.SUBMITTING, lease_owner="me", provider_job_id=None)
    holder = operation_record(operation_id="op-holder", provider_job_id="job-9")
    changes = {
        "provider_job_id": "job-9",
        "last_http_status": 202,
        "state": "running",
        "status": Status.WAITING,
    }
    plan = plans.finish_plan(
        record,
        owner="me",
        changes=changes,
        kind="submitted",
        at=NOW,
        note=None,
        payload_extra=None,
        job_holder=holder,
    )
    written = update_of(plan)
    assert (written["status"], written["duplicate_of"]) == (Status.ESCALATED, "op-holder")
    assert (written["provider_job_id"], written["last_http_status"]) == ("job-9", 202)
    assert "state" not in written  # the other job's answer is not this operation's
    assert kinds(plan)[-1] == "Append:stopped"
    own = plans.finish_plan(
        record,
        owner="me",
        changes=changes,
        kind="submitted",
        at=NOW,
        note=None,
        payload_extra=None,
        job_holder=record,
    )
    assert update_of(own)["status"] == Status.WAITING


# -- what people decide -----------------------------------------------------------------------------


def approval(**changes: Any) -> ApprovalRecord:
    """A pending extension approval asked at version 7, expiring at NOW + 60."""
    values: dict[str, Any] = {
        "approval_id": "ap-1",
        "operation_id": "op",
        "kind": ApprovalKind.EXTENSION,
        "status": ApprovalStatus.PENDING,
        "request_json": "{}",
        "bound_version": 7,
        "asked_at": NOW - 10,
        "expires_at": NOW + 60,
        "decided_at": None,
        "decided_by": None,
        "note": None,
    }
    return ApprovalRecord(**{**values, **changes})


@pytest.mark.parametrize(
    ("approve", "version_now", "at", "status", "kind"),
    [
        (True, 7, NOW, ApprovalStatus.APPROVED, "approval_granted"),
        (False, 7, NOW, ApprovalStatus.DENIED, "extension_denied"),
        (True, 8, NOW, ApprovalStatus.VOID, "approval_void"),  # the operation changed since asked
        (False, 8, NOW, ApprovalStatus.DENIED, "extension_denied"),  # a no stands whatever changed
        (True, 7, NOW + 60, ApprovalStatus.EXPIRED, "approval_expired"),  # too late
        (False, 8, NOW + 61, ApprovalStatus.EXPIRED, "approval_expired"),
    ],
)
def test_an_approvals_outcome_is_expired_void_approved_or_denied(
    approve: bool, version_now: int, at: float, status: ApprovalStatus, kind: str
) -> None:
    asked = approval()
    assert plans.approval_outcome(asked, version_now=version_now, approve=approve, at=at) == status
    record = waiting(version=version_now)
    decided, plan = plans.decision_plan(asked, record, approve=approve, by="ana", at=at, method="console")
    assert decided == status
    assert kinds(plan) == ["Flush", f"Append:{kind}"]
    entry = plan.writes[-1]
    assert isinstance(entry, Append)
    assert entry.entry.payload["authenticated_by"] == "console"
    assert entry.entry.payload["note"] == "ap-1 by ana"


@pytest.mark.parametrize(
    ("changes", "applied"),
    [
        ({"status": Status.ESCALATED, "version": 7}, True),
        ({"status": Status.ESCALATED, "version": 8}, False),  # changed since the person was asked
        ({"status": Status.WAITING, "version": 7}, False),
    ],
)
def test_an_extension_is_granted_only_as_the_person_saw_the_operation(
    changes: dict[str, Any], applied: bool
) -> None:
    record = operation_record(**changes)
    plan = plans.extension_plan(
        record,
        bound_version=7,
        changes={"max_status_requests": 20},
        at=NOW,
        approval_id="ap-1",
        payload_extra={},
    )
    assert plan.applied is applied
    if applied:
        assert update_of(plan) == {"max_status_requests": 20, "extensions_used": 1}
        assert kinds(plan) == [
            "Flush",
            "Update",
            "Execute",
            "Append:extension_approved",
        ]  # the approval applied


@pytest.mark.parametrize(
    ("changes", "applied"),
    [
        ({"stop_reason": StopReason.AUTHORIZATION_DENIED}, True),
        ({"stop_reason": StopReason.INTEGRATION_FAILURE}, True),
        ({"stop_reason": StopReason.ACCOUNT_CONTEXT_CHANGED}, True),
        ({"stop_reason": StopReason.DEADLINE_EXCEEDED}, False),  # not a refusal
        ({"stop_reason": StopReason.AUTHORIZATION_DENIED, "version": 8}, False),  # not as shown
        ({"stop_reason": StopReason.AUTHORIZATION_DENIED, "provider_job_id": None}, False),
        ({"stop_reason": StopReason.AUTHORIZATION_DENIED, "duplicate_of": "op-0"}, False),
        ({"stop_reason": StopReason.AUTHORIZATION_DENIED, "status": Status.WAITING}, False),
    ],
)
def test_only_an_operation_stopped_by_a_refusal_is_reopened_and_only_as_shown(
    changes: dict[str, Any], applied: bool
) -> None:
    record = operation_record(**{"status": Status.ESCALATED, "version": 7, **changes})
    plan = plans.reopen_plan(
        record, bound_version=7, next_check_at=NOW + 5, at=NOW, extra={"reason": "fixed"}
    )
    assert plan.applied is applied
    if applied:
        assert (plan.record.status, plan.record.stop_reason) == (Status.WAITING, None)
        assert plan.record.next_check_at == NOW + 5
        assert plan.record.delay_source == DelaySource.MANUAL_EXTENSION
        assert plan.record.status_requests_used == record.status_requests_used  # same budget
        assert kinds(plan) == ["Flush", "Update", "Append:reopened"]
    else:
        assert kinds(plan) == ["Flush"]


@pytest.mark.parametrize(
    ("operation_changes", "expect_version", "expected"),
    [
        (None, None, ["Flush", "Execute", "Append:cancel_sent"]),
        ({"status": Status.SUCCEEDED}, 7, ["Flush", "Update", "Execute", "Append:cancel_sent"]),
        # The operation moved while the call was out: the call is still recorded and told, unchanged.
        ({"status": Status.SUCCEEDED}, 6, ["Flush", "Execute", "Append:cancel_sent"]),
    ],
)
def test_a_follow_up_is_always_recorded_and_changes_the_operation_only_if_it_is_still_as_expected(
    operation_changes: dict[str, object] | None, expect_version: int | None, expected: list[str]
) -> None:
    record = waiting(version=7)
    followup = FollowupRecord(
        "fu-1", "op", FollowupKind.CANCEL, FollowupStatus.SENT, None, NOW, NOW, 202, None, "approved by ann"
    )
    plan = plans.followup_plan(
        record, followup, operation_changes=operation_changes, expect_version=expect_version
    )
    assert kinds(plan) == expected
    moved = operation_changes is not None and expect_version != record.version
    assert plan.applied is not moved
    (insert,) = [w for w in plan.writes if isinstance(w, Execute)]
    assert insert.params["followup_id"] == "fu-1"
    (told,) = [w.entry for w in plan.writes if isinstance(w, Append)]
    assert (
        told.payload["note"] == "approved by ann; the operation changed since (version 6 → 7): not changed"
    ) is moved
    assert plan.record.status == (Status.SUCCEEDED if operation_changes and not moved else Status.WAITING)


# -- the webhook wake-up ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "wakes"),
    [
        ({"next_check_at": NOW + 60}, True),
        ({"next_check_at": NOW}, False),  # already due: nothing to bring forward
        # the earliest allowed request (a Retry-After) is the planned time: nothing to bring forward
        (
            {
                "next_check_at": NOW + 60,
                "delay_source": DelaySource.PROVIDER_RETRY_AFTER,
                "not_before_at": NOW + 60,
            },
            False,
        ),
        ({"next_check_at": NOW + 60, "delay_source": DelaySource.FLEET_PACING}, False),
        ({"next_check_at": NOW + 60, "delay_source": DelaySource.PROVIDER_POLL_HINT}, True),
        ({"next_check_at": NOW + 60, "deadline_at": NOW}, False),  # past its deadline
        ({"next_check_at": NOW + 60, "business_deadline_at": NOW - 1}, False),
        ({"next_check_at": NOW + 60, "lease_owner": "peer", "lease_expires_at": NOW + 5}, False),  # in flight
        ({"next_check_at": NOW + 60, "lease_owner": "peer", "lease_expires_at": NOW - 5}, True),  # lease dead
        ({"next_check_at": NOW + 60, "status": Status.ESCALATED}, False),
    ],
)
def test_a_webhook_wakes_only_a_waiting_operation_it_may_bring_forward(
    changes: dict[str, Any], wakes: bool
) -> None:
    record = waiting(**changes)
    assert plans.may_wake(record, NOW) is wakes
    plan = plans.wake_plan(record, now=NOW, event_id="ev-1", event_type="job.done")
    if not wakes:
        assert plan is None
        return
    assert plan is not None
    assert update_of(plan) == {"next_check_at": NOW, "woken_at": NOW}
    assert kinds(plan) == ["Flush", "Update", "Append:woken_by_webhook"]
    told = plan.writes[-1]
    assert isinstance(told, Append)
    assert told.entry.payload["event_id"] == "ev-1"
    assert told.entry.payload["delay_source"] == DelaySource.PROVIDER_WEBHOOK


def test_a_webhook_moves_the_next_check_to_the_earliest_allowed_request_when_that_is_later_than_now() -> None:
    # Issue 30: a Retry-After in force (not_before_at) bounds the wake-up; it no longer cancels it.
    record = waiting(
        next_check_at=NOW + 60, not_before_at=NOW + 20, delay_source=DelaySource.PROVIDER_RETRY_AFTER
    )
    assert plans.woken_at(record, NOW) == NOW + 20
    plan = plans.wake_plan(record, now=NOW, event_id="ev-1", event_type="job.done")
    assert plan is not None
    assert update_of(plan) == {"next_check_at": NOW + 20, "woken_at": NOW + 20}
    assert (
        plans.wake_plan(
            waiting(next_check_at=NOW + 60, not_before_at=NOW + 90), now=NOW, event_id="e", event_type="t"
        )
        is None
    )


def test_every_plan_flushes_before_it_writes_about_the_operation() -> None:
    # The pending summary of refused calls lands before the decision that follows it, in every plan.
    record = waiting(lease_owner="me", lease_expires_at=NOW + 5, status=Status.WAITING)
    made = [
        plans.answer_plan(record, owner="me", changes={}, at=NOW, payload_extra={}),
        plans.note_plan(record, "note", NOW),
        plans.reopen_plan(record, bound_version=0, next_check_at=NOW, at=NOW, extra={}),
    ]
    for plan in made:
        assert isinstance(plan.writes[0], Flush)


@pytest.mark.parametrize(
    ("changes", "before"),
    [
        ({"fleet_slot_at": NOW + 2.0, "next_check_at": NOW - 1.0}, True),  # booked ahead, its time to come
        ({"fleet_slot_at": NOW - 0.5, "next_check_at": NOW - 0.5}, False),  # its slot came: the pace decides
        (
            {
                "fleet_slot_at": NOW - 0.5,
                "next_check_at": NOW + 0.5,
                "delay_source": DelaySource.FLEET_PACING,
            },
            True,  # moved to NOW + 0.5
        ),
        ({"fleet_slot_at": None}, False),
        ({"fleet_slot_at": NOW - 5.0, "next_check_at": NOW - 5.0}, False),  # released long ago
    ],
)
def test_a_check_before_its_own_held_slot_needs_nothing_of_the_pace(
    changes: dict[str, Any], before: bool
) -> None:
    assert pace_reads.before_own_slot(waiting(**changes), FLEET, now=NOW) is before


# -- fair shares on a send (issue 29): principals take turns, a principal's slot goes to its oldest ---------


def fair_send(
    record: OperationRecord,
    bucket: PaceBucket,
    *,
    sibling: tuple[str, float] | None = None,
    other_principal: pace_reads.FirstOtherPrincipal | None = None,
    booked: tuple[int, float | None, int] = (0, None, 0),
    next_poll_within: float = 1.0,
) -> Plan:
    """check_plan for `record` under one slot per principal, its pace step taken on `bucket`."""
    step = pace_reads.pace_step(record, RESERVE, FLEET, bucket, now=NOW)
    assert step is not None
    assert step.send
    return plans.check_plan(
        record,
        RESERVE,
        now=NOW,
        owner="me",
        lease_seconds=30,
        step=step,
        bucket=bucket,
        booked=booked,
        fleet_slots=1,
        fleet=FLEET,
        next_poll_within=next_poll_within,
        sibling=sibling,
        other_principal=other_principal,
    )


ROOM = PaceBucket(NOW - 1.0, NOW - 1.0)  # the pace has room now
# Another principal comes first (it waits, served less recently): bob, holding none of his slots, or his one.
BOBS = pace_reads.FirstOtherPrincipal("bobs-oldest", "bob", 0)
BOBS_FULL = BOBS._replace(booked=1)


def test_a_request_that_leaves_hands_its_principals_next_slot_to_the_operation_waiting_longest() -> None:
    # With no slot of its own, it came first and its principal's oldest waiting operation came after it.
    record = waiting(request_sent_at=NOW - 9.0)
    plan = fair_send(record, ROOM, sibling=("op-old", NOW - 5.0), booked=(0, None, 1))
    assert plan.decision == RESERVE
    assert kinds(plan) == ["SetPace", "HandSlot", "Update"]
    (handed,) = [w for w in plan.writes if isinstance(w, HandSlot)]
    # The next free slot after this request, on the bookings' clock this request just moved.
    assert (handed.sibling, handed.slot_at, handed.tat) == ("op-old", NOW + 1.0, NOW + 2.0)
    assert (handed.provider, handed.owner) == ("acme", record.owner)
    assert handed.held_since == NOW - 2.0  # only a sibling whose agent is still coming is handed it
    assert update_of(plan)["fleet_slot_at"] is None  # it books nothing for itself
    # Its principal already holds its one slot: nothing is handed, the request still goes out.
    full = fair_send(record, ROOM, sibling=("op-old", NOW - 5.0), booked=(1, NOW + 1.0, 1))
    assert kinds(full) == ["SetPace", "Update"]
    assert full.decision == RESERVE


def test_room_the_pace_has_now_goes_to_the_principals_operation_that_waited_longer() -> None:
    record = waiting(request_sent_at=NOW - 5.0)
    # Its sibling, served longer ago, is still coming: this call did not come first.
    younger = fair_send(record, ROOM, sibling=("op-young", NOW - 1.0))
    assert younger.decision == RESERVE
    plan = fair_send(waiting(request_sent_at=NOW - 1.0), ROOM, sibling=("op-old", NOW - 9.0))
    assert plan.decision == GateVerdict(Verdict.PACED, allowed_at=NOW + 1.0)  # one interval on
    assert kinds(plan) == ["HandSlot", "Update"]  # nothing taken from the pace but the handed slot
    (handed,) = [w for w in plan.writes if isinstance(w, HandSlot)]
    assert (handed.sibling, handed.slot_at, handed.tat) == ("op-old", NOW, NOW + 1.0)
    assert update_of(plan) == {
        "fleet_slot_at": None,
        "next_check_at": NOW + 1.0,
        "delay_source": DelaySource.FLEET_PACING,
    }


def test_a_principal_served_more_recently_leaves_the_room_to_another_that_waits() -> None:
    plan = fair_send(waiting(request_sent_at=NOW - 1.0), ROOM, other_principal=BOBS)
    assert plan.decision == GateVerdict(Verdict.PACED, allowed_at=NOW + 1.0)
    assert kinds(plan) == ["Update"]  # nothing from the pace, nothing handed: the room is the other's
    # Even with an older sibling waiting, the other principal comes first: nothing is handed.
    both = fair_send(
        waiting(request_sent_at=NOW - 1.0), ROOM, sibling=("op-old", NOW - 9.0), other_principal=BOBS
    )
    assert kinds(both) == ["Update"]


def test_a_slot_held_for_an_operation_is_its_own_whoever_else_waits() -> None:
    record = waiting(request_sent_at=NOW - 1.0, fleet_slot_at=NOW - 0.5, next_check_at=NOW - 0.5)
    plan = fair_send(record, ROOM, sibling=("op-old", NOW - 9.0), other_principal=BOBS, booked=(0, None, 1))
    assert plan.decision == RESERVE
    assert "HandSlot" in kinds(plan)  # and it hands the next slots on (below)


def test_a_request_that_leaves_while_another_principal_comes_first_hands_it_a_slot_before_its_sibling() -> (
    None
):
    # Issue 29: with the provider answering in 0.5 s, a principal of 5 operations lost every turn that
    # passed while none of them waited, and its slot went on from sibling to sibling for the principal
    # of 15: up to 23 % from their halves on virtual time, within 10 % so.
    record = waiting(request_sent_at=NOW - 1.0, fleet_slot_at=NOW - 0.5, next_check_at=NOW - 0.5)
    plan = fair_send(record, ROOM, sibling=("op-old", NOW - 9.0), other_principal=BOBS, booked=(0, None, 1))
    assert plan.decision == RESERVE
    assert kinds(plan) == ["SetPace", "HandSlot", "HandSlot", "Update"]
    bobs, own = [w for w in plan.writes if isinstance(w, HandSlot)]
    # Its own slot was already counted on the bookings' clock: the next two free slots, bob's first.
    assert (bobs.owner, bobs.sibling, bobs.slot_at, bobs.tat) == ("bob", "bobs-oldest", NOW, NOW + 1.0)
    assert (own.owner, own.sibling, own.slot_at, own.tat) == (record.owner, "op-old", NOW + 1.0, NOW + 2.0)
    assert (bobs.after, own.after) == (None, ("bobs-oldest", NOW))  # the sibling's only if bob's took
    # Bob holds his one slot: his turn is next, and no sibling of this principal is handed one.
    full = fair_send(
        record, ROOM, sibling=("op-old", NOW - 9.0), other_principal=BOBS_FULL, booked=(0, None, 1)
    )
    assert kinds(full) == ["SetPace", "Update"]
    assert full.decision == RESERVE
    # No other principal comes first: only the sibling, as before.
    alone = fair_send(record, ROOM, sibling=("op-old", NOW - 9.0), booked=(0, None, 1))
    assert [(w.owner, w.sibling) for w in alone.writes if isinstance(w, HandSlot)] == [
        (record.owner, "op-old")
    ]
