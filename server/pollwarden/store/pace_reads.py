"""What a check reads of a provider's [fleet] pace, and the pace's step for it (issue 29).

Sans-IO, beside `pollwarden.store.plans`: whether a verdict takes the pace
(`needs_pace`), the pace's verdict on the operation's held slot (`pace_step`),
and the parameters and rows of the reads the pace and fair shares need
(`statements.PROVIDER_OWED_SLOTS`, `PRINCIPAL_BOOKED_SLOTS`,
`OLDEST_WAITING_SIBLING`, `OTHER_PRINCIPAL_FIRST`). The rule itself is
`pollwarden.rules.fleet_pace`'s.
"""

from __future__ import annotations

from typing import NamedTuple

from pollwarden.core.records import OperationRecord
from pollwarden.core.vocabulary import DelaySource
from pollwarden.rules.fleet_pace import (
    PaceBucket,
    PaceVerdict,
    moved_slot,
    owed_slots,
    pace_verdict,
    slot_held,
    slot_hold_seconds,
)
from pollwarden.rules.gate import GateVerdict, Verdict, may_reserve
from pollwarden_providers.table_limits import FleetSpec

__all__ = [
    "FirstOtherPrincipal",
    "before_own_slot",
    "booked_slots",
    "booked_slots_params",
    "first_other_principal",
    "needs_booked_slots",
    "needs_pace",
    "needs_pace_row",
    "owed_params",
    "pace_step",
    "served_since",
    "waiting_sibling",
]


def needs_pace(
    record: OperationRecord, decision: GateVerdict, fleet: FleetSpec | None, *, now: float
) -> bool:
    """Whether carrying out the verdict reads the provider's pace row: a reservation whose guard holds,
    on a provider with a [fleet] pace."""
    return decision.kind == Verdict.RESERVE and fleet is not None and may_reserve(record, now)


def pace_step(
    record: OperationRecord,
    decision: GateVerdict,
    fleet: FleetSpec | None,
    bucket: PaceBucket,
    *,
    now: float,
    owed: int = 0,
    came_at: float | None = None,
) -> PaceVerdict | None:
    """What the provider's pace says for the gate's reservation now (`fleet_pace.pace_verdict`, with the
    operation's held slot); None when no pace is taken (`needs_pace`). `bucket`: the pace row as read;
    `owed`: `statements.PROVIDER_OWED_SLOTS` read with `owed_params`."""
    if fleet is None or not needs_pace(record, decision, fleet, now=now):
        return None
    return pace_verdict(
        bucket,
        now=now,
        held_slot=record.fleet_slot_at,
        rate=fleet.max_requests_per_second,
        burst=fleet.burst,
        owed=owed,
        came_at=came_at,
        moved_to=_moved_to(record),
    )


def _moved_to(record: OperationRecord) -> float | None:
    """Where `record`'s held fleet slot was moved (`fleet_pace.moved_slot`), None when it was not."""
    pacing = record.delay_source == DelaySource.FLEET_PACING
    return moved_slot(record.fleet_slot_at, record.next_check_at, pacing=pacing)


def before_own_slot(record: OperationRecord, fleet: FleetSpec, *, now: float) -> bool:
    """Whether `record`'s check at `now` comes before its own held fleet slot (its time, or where it
    was moved): it is told that slot, and reads nothing of the provider's pace."""
    slot, moved = record.fleet_slot_at, _moved_to(record)
    held = slot_held(slot, now=now, rate=fleet.max_requests_per_second, moved_to=moved)
    return held and slot is not None and now < (moved or slot)


def needs_pace_row(
    record: OperationRecord, decision: GateVerdict, fleet: FleetSpec | None, *, now: float
) -> bool:
    """Whether carrying out the verdict takes the provider's pace row (PostgreSQL locks it, after its
    process's turn): a reservation that needs the pace (`needs_pace`), unless its check comes before
    its own held slot (`before_own_slot`: told that slot, it reads nothing of the pace)."""
    if fleet is None or not needs_pace(record, decision, fleet, now=now):
        return False
    return not before_own_slot(record, fleet, now=now)


def owed_params(record: OperationRecord, fleet: FleetSpec, *, now: float) -> dict[str, object]:
    """The parameters of `statements.PROVIDER_OWED_SLOTS` for `record`'s check at `now`."""
    held_since, before = owed_slots(record.fleet_slot_at, now=now, rate=fleet.max_requests_per_second)
    return {
        "provider": record.provider,
        "operation_id": record.operation_id,
        "held_since": held_since,
        "before": before,
        "now": now,
    }


def needs_booked_slots(step: PaceVerdict | None, fleet_slots: int | None) -> bool:
    """Whether the principal's booked slots decide the check (fair shares apply, and a request would go
    out or a new slot be booked)."""
    return step is not None and (step.new_booking or step.send) and fleet_slots is not None


def waiting_sibling(row: tuple[object, ...] | None) -> tuple[str, float] | None:
    """`statements.OLDEST_WAITING_SIBLING` as read: its id, and when its last request left."""
    return None if row is None else (str(row[0]), float(str(row[1])))


class FirstOtherPrincipal(NamedTuple):
    """`statements.OTHER_PRINCIPAL_FIRST` as read: the principal that comes first, its operation waiting
    longest, and the slots the principal holds."""

    operation_id: str
    owner: str
    booked: int


def first_other_principal(row: tuple[object, ...] | None) -> FirstOtherPrincipal | None:
    """`statements.OTHER_PRINCIPAL_FIRST`'s row (None: no other principal comes first)."""
    return None if row is None else FirstOtherPrincipal(str(row[0]), str(row[1]), int(str(row[2] or 0)))


def booked_slots_params(record: OperationRecord, fleet: FleetSpec, *, now: float) -> dict[str, object]:
    """The parameters of the fair-share reads (`statements.PRINCIPAL_BOOKED_SLOTS`,
    `OLDEST_WAITING_SIBLING`, `OTHER_PRINCIPAL_FIRST`) for `record`'s check at `now`."""
    return {
        "provider": record.provider,
        "owner": record.owner,
        "operation_id": record.operation_id,
        "held_since": now - slot_hold_seconds(fleet.max_requests_per_second),
        "now": now,
        "due_by": now + slot_hold_seconds(fleet.max_requests_per_second),
        # Waiting since its last request (or since it was created): the oldest goes first. One that
        # sends now books ahead only if none of its principal's other operations waits at all
        # (`check_plan`: the oldest waiting sibling read beside it).
        "served_at": served_since(record),
    }


def booked_slots(row: tuple[object, ...] | None) -> tuple[int, float | None, int]:
    """`statements.PRINCIPAL_BOOKED_SLOTS` as read: (slots held, the earliest, operations waiting longer)."""
    if row is None:
        return 0, None, 0
    count, earliest, older = row[0], row[1], row[2]
    return (
        int(str(count or 0)),
        None if earliest is None else float(str(earliest)),
        int(str(older or 0)),
    )


def served_since(record: OperationRecord) -> float:
    """When the operation was last served: its last request, or its creation (the oldest waits first)."""
    return record.created_at if record.request_sent_at is None else record.request_sent_at
