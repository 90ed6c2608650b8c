"""A store transaction as a flow: a generator that yields what it needs of its engine (`Locked`,
`Query`, `Queue`, `CarryOut`, …) and gets the answer back, so its logic — read, then a pure plan
of `pollwarden.store.plans`, then its writes — is written once; and the flows the check and the
refusal summaries run (`gate`, `check`, `flush_all`, `flush_one`). `planned.Store` runs the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pollwarden.audit.entry import AuditEvent
from pollwarden.core.errors import StoreError
from pollwarden.core.records import (
    CheckStart,
    OperationRecord,
)
from pollwarden.core.vocabulary import (
    Status,
)
from pollwarden.rules.fleet_pace import PaceBucket, bucket_from_row
from pollwarden.rules.gate import GateVerdict, gate_verdict
from pollwarden.rules.schedule import raw_delay
from pollwarden.store import pace_reads, plans, statements
from pollwarden.store.plans import FLUSH, Plan
from pollwarden.store.reads import Row
from pollwarden.store.rows import StoredOperation, stored
from pollwarden_providers.table_limits import FleetSpec

T = TypeVar("T")

# -- what a flow asks of its engine ----------------------------------------------------------------


@dataclass(frozen=True)
class Locked:
    """The transaction's operation row (`_transact(lock=…)`), read under its lock: a `StoredOperation`."""


@dataclass(frozen=True)
class Query:
    """One statement of `statements` and its rows: every row, or the first (None: none)."""

    statement: str
    params: Mapping[str, object] = field(default_factory=dict[str, object])
    lock: bool = False  # PostgreSQL locks the rows read (`FOR UPDATE`); SQLite's write lock holds every row
    every: bool = False


@dataclass(frozen=True)
class Queue:
    """One write whose result nobody reads (PostgreSQL sends it with the next trip)."""

    statement: str
    params: Mapping[str, object]


@dataclass(frozen=True)
class CarryOut:
    """Carry out `plan`, made from `current` (a row this transaction holds); the record it leaves."""

    current: StoredOperation
    plan: Plan


@dataclass(frozen=True)
class LockPayload:
    """Serialise the starts of one payload (PostgreSQL's advisory lock; SQLite's write lock already does)."""

    request_fingerprint: object


@dataclass(frozen=True)
class LockHead:
    """Lock the one audit chain's head before an operation's first row (PostgreSQL; SQLite holds it)."""


@dataclass(frozen=True)
class AboutTheChain:
    """Append `entry`, a row about the database itself and no operation (`audit.REKEY_OPERATION`), to the
    one chain: its head locked and moved in this transaction."""

    entry: AuditEvent


Request = Locked | Query | Queue | CarryOut | LockPayload | LockHead | AboutTheChain
# A flow yields a request, or a tuple of them (sent together: one trip on PostgreSQL), and gets the answers.
Flow = Generator[Request | tuple[Request, ...], Any, T]


def drive(flow: Flow[T], answer: Callable[[Request], object]) -> T:
    """Run `flow`, each request answered by `answer` (a tuple's in order); the flow's result."""
    reply: object = None
    while True:
        try:
            asked = flow.send(reply)
        except StopIteration as done:
            return done.value
        reply = tuple(answer(r) for r in asked) if isinstance(asked, tuple) else answer(asked)


def carry_out_on(plan_of: Callable[[OperationRecord], Plan]) -> Flow[Plan]:
    """The flow of a write that is one plan on the locked operation row: `plan_of` the row as read."""
    current: StoredOperation = yield Locked()
    plan = plan_of(current.record)
    yield CarryOut(current, plan)
    return plan


def flush_all() -> Flow[int]:
    """Write every operation's pending summary of refused calls; how many."""
    rows: list[Row] = yield Query(statements.PENDING_REFUSALS, lock=True, every=True)
    for row in rows:
        # Locked after the read's condition held again: each row still has refusals to write.
        yield CarryOut(stored(row), Plan(stored(row).record, (FLUSH,)))
    return len(rows)


def flush_one() -> Flow[int]:
    """Write the locked operation's pending summary of refused calls; how many (another flush may have)."""
    current: StoredOperation = yield Locked()
    yield CarryOut(current, Plan(current.record, (FLUSH,)))
    return 1 if current.refusals.count else 0


def gate(
    record: OperationRecord,
    now: float,
    wait_until: float,
    fleets: Mapping[str, FleetSpec | None],
    apply_approvals: bool,
    accounts: Mapping[str, str] | None,
    needs_person: frozenset[str],
) -> Flow[GateVerdict]:
    """The gate's verdict on `record` (`gate.gate_verdict`), told whether an extension decision waits."""
    due = False
    if apply_approvals and record.status == Status.ESCALATED:
        params = {"operation_id": record.operation_id, "now": now}
        due = (yield Query(statements.HAS_DUE_EXTENSION_APPROVALS, params)) is not None
    return gate_verdict(
        record,
        now=now,
        wait_until=wait_until,
        has_table=record.provider in fleets,
        approvals_due=due,
        account_context=None if accounts is None else accounts.get(record.provider),
        may_send=record.provider not in needs_person,
    )


def check(
    current: StoredOperation,
    decision: GateVerdict,
    now: float,
    owner: str,
    lease_seconds: float,
    fleet: FleetSpec | None,
    fleet_slots: int | None,
    bucket: PaceBucket | None = None,
    owed: int | None = None,
    came_at: float | None = None,
    next_poll_within: float | None = None,
    shares: tuple[Row | None, Row | None, Row | None] | None = None,
) -> Flow[CheckStart]:
    """Carry out the gate's verdict (`plans.check_plan`): read what it needs first — the provider's pace
    (unless the caller read it, locked), the other operations' held slots not used yet (`owed`, unless
    the caller read them in the same trip) and, under fair shares, `fair_share_reads` (`shares`, unless
    the caller read them in that trip)."""
    record = current.record
    step = booked = sibling = other = None
    if fleet is not None and pace_reads.needs_pace(record, decision, fleet, now=now):
        if bucket is None:
            bucket = bucket_from_row((yield Query(statements.SELECT_PACE, {"provider": record.provider})))
        if owed is None:
            row = yield Query(statements.PROVIDER_OWED_SLOTS, pace_reads.owed_params(record, fleet, now=now))
            owed = 0 if row is None else int(str(row[0]))
        step = pace_reads.pace_step(record, decision, fleet, bucket, now=now, owed=owed, came_at=came_at)
        if pace_reads.needs_booked_slots(step, fleet_slots):
            if shares is None:
                read: tuple[Row | None, Row | None, Row | None] = yield fair_share_reads(
                    pace_reads.booked_slots_params(record, fleet, now=now)
                )
                shares = read
            slots, oldest, first = shares
            booked, sibling, other = (
                pace_reads.booked_slots(slots),
                pace_reads.waiting_sibling(oldest),
                pace_reads.first_other_principal(first),
            )
    plan = plans.check_plan(
        record,
        decision,
        now=now,
        owner=owner,
        lease_seconds=lease_seconds,
        step=step,
        bucket=bucket,
        booked=booked,
        fleet_slots=fleet_slots,
        fleet=fleet,
        next_poll_within=next_poll_within,
        sibling=sibling,
        other_principal=other,
        came_at=came_at,
    )
    return CheckStart((yield CarryOut(current, plan)), plan.decision or decision)


def fair_share_reads(params: Mapping[str, object]) -> tuple[Query, Query, Query]:
    """What fair shares read (`pace_reads.booked_slots_params`): the principal's held slots, its operation
    waiting longest, and whether another principal comes first."""
    return (
        Query(statements.PRINCIPAL_BOOKED_SLOTS, params),
        Query(statements.OLDEST_WAITING_SIBLING, params),
        Query(statements.OTHER_PRINCIPAL_FIRST, params),
    )


def must(row: Row | None, operation_id: object) -> StoredOperation:
    """The operation row read; rows are never deleted, so a missing one is a programming error."""
    if row is None:
        raise StoreError(f"operation {operation_id!r} is not in the database")
    return stored(row)


@dataclass(frozen=True)
class CheckCall:
    """One `Store.begin_check`'s arguments, as each engine's check procedure receives them."""

    operation_id: str
    now: float
    wait_until: float
    owner: str
    lease_seconds: float
    fleets: Mapping[str, FleetSpec | None]
    apply_approvals: bool = True
    clock: Callable[[], float] | None = None
    accounts: Mapping[str, str] | None = None
    needs_person: frozenset[str] = frozenset()
    fleet_slots: int | None = None
    # Each provider's own schedule (base and longest delay, s): how soon an operation may check again.
    poll_schedules: Mapping[str, tuple[float, float]] | None = None

    @property
    def asks(
        self,
    ) -> tuple[float, Mapping[str, FleetSpec | None], bool, Mapping[str, str] | None, frozenset[str]]:
        """What the gate is asked besides the record and the time (`gate`'s arguments after them)."""
        return (self.wait_until, self.fleets, self.apply_approvals, self.accounts, self.needs_person)

    def next_poll_within(self, record: OperationRecord) -> float | None:
        """The longest its own schedule makes `record` wait after its next answer (None: unknown)."""
        schedule = None if self.poll_schedules is None else self.poll_schedules.get(record.provider)
        if schedule is None:
            return None
        return raw_delay(record.polls_completed + 1, schedule[0], schedule[1])

    def check_flow(
        self,
        current: StoredOperation,
        decision: GateVerdict,
        now: float,
        bucket: PaceBucket | None = None,
        owed: int | None = None,
        shares: tuple[Row | None, Row | None, Row | None] | None = None,
    ) -> Flow[CheckStart]:
        """`check` for this call: its owner, lease, fleet and fair shares, the time its call started, how
        soon `current`'s own schedule brings it back; `now` is the time read under the locks."""
        return check(
            current,
            decision,
            now,
            self.owner,
            self.lease_seconds,
            self.fleets.get(current.record.provider),
            self.fleet_slots,
            bucket,
            owed,
            came_at=self.now,
            next_poll_within=self.next_poll_within(current.record),
            shares=shares,
        )

    def time(self, now: float) -> float:
        """The time to guard and pace by once the locks are held: the clock read again, or `now`."""
        return self.clock() if self.clock is not None else now
