"""The check procedure's two transactions: before the request (the gate) and after it (the answer).

Each runs whole in one hop to the database thread. `begin_check` loads the
operation, lets the pure gate (`pollwarden.rules.gate`) decide, and writes what it
decided, guarded in SQL by the version it read (optimistic: another process
that changed the operation in between makes the guard fail, and the decision
is taken again under the write lock). `apply_answer` records what one answer
meant and releases the lease, only while this call still holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pollwarden.core.records import CheckStart, OperationRecord
from pollwarden.core.vocabulary import Status
from pollwarden.rules.fleet_pace import bucket_from_row
from pollwarden.rules.gate import GateDecision, decide_check
from pollwarden.store import plans, statements
from pollwarden.store.rows import StoredOperation
from pollwarden.store.sqlite import executor, sql
from pollwarden.store.sqlite.connection import Session
from pollwarden.store.sqlite.executor import StaleRow
from pollwarden_providers.table_limits import FleetSpec


def begin_check(
    session: Session,
    operation_id: str,
    *,
    now: float,
    wait_until: float,
    owner: str,
    lease_seconds: float,
    fleets: Mapping[str, FleetSpec | None],
    apply_approvals: bool,
    key: bytes | None,
    clock: Callable[[], float] | None = None,
    accounts: Mapping[str, str] | None = None,
    needs_person: frozenset[str] = frozenset(),
    fleet_slots: int | None = None,
) -> CheckStart | None:
    """Decide one round of check_status and write what it decided; None when there is no such operation.

    With `clock`, the time every write is guarded and paced by is read again
    once the write lock is held: BEGIN may wait for another process, and a
    fleet slot must be taken when the request really leaves, not before.
    """
    conn = session.conn
    current = executor.fetch(conn, operation_id)  # a snapshot read, outside any transaction
    if current is None:
        return None
    decision = _decide(
        session, current.record, now, wait_until, fleets, apply_approvals, accounts, needs_person
    )
    if not decision.writes:
        return CheckStart(current.record, decision)
    try:
        with session.transaction(durable=not plans.quiet_refusal(current.refusals, decision)):
            now = clock() if clock is not None else now
            return _carry_out(
                session, current, decision, now, owner, lease_seconds, fleets, key, fleet_slots, fresh=False
            )
    except StaleRow:
        pass
    # Another process moved first: decide again with the write lock held, where nothing can change.
    with session.transaction(durable=True):
        now = clock() if clock is not None else now
        current = executor.must_fetch(conn, operation_id)
        decision = _decide(
            session, current.record, now, wait_until, fleets, apply_approvals, accounts, needs_person
        )
        if not decision.writes:
            return CheckStart(current.record, decision)
        return _carry_out(
            session, current, decision, now, owner, lease_seconds, fleets, key, fleet_slots, fresh=True
        )


def _decide(
    session: Session,
    record: OperationRecord,
    now: float,
    wait_until: float,
    fleets: Mapping[str, FleetSpec | None],
    apply_approvals: bool,
    accounts: Mapping[str, str] | None,
    needs_person: frozenset[str],
) -> GateDecision:
    due = False
    if apply_approvals and record.status == Status.ESCALATED:
        found = session.conn.execute(
            statements.HAS_DUE_EXTENSION_APPROVALS, {"operation_id": record.operation_id, "now": now}
        ).fetchone()
        due = found is not None
    return decide_check(
        record,
        now=now,
        wait_until=wait_until,
        has_table=record.provider in fleets,
        approvals_due=due,
        account_context=None if accounts is None else accounts.get(record.provider),
        may_send=record.provider not in needs_person,
    )


def _carry_out(
    session: Session,
    current: StoredOperation,
    decision: GateDecision,
    now: float,
    owner: str,
    lease_seconds: float,
    fleets: Mapping[str, FleetSpec | None],
    key: bytes | None,
    fleet_slots: int | None,
    *,
    fresh: bool,
) -> CheckStart:
    """Read what the plan needs (the provider's pace, the principal's booked slots), plan, carry it out."""
    conn = session.conn
    record = current.record
    fleet = fleets.get(record.provider)
    step = bucket = booked = None
    if plans.needs_pace(record, decision, fleet, now=now):
        bucket = bucket_from_row(conn.execute(sql.SELECT_FLEET_TAT, {"provider": record.provider}).fetchone())
        owed = 0
        if fleet is not None:
            params = plans.owed_params(record, fleet, now=now)
            owed = int(conn.execute(statements.PROVIDER_OWED_SLOTS, params).fetchone()[0])
        step = plans.pace_step(record, decision, fleet, bucket, now=now, owed=owed)
        if plans.needs_booked_slots(step, fleet_slots) and fleet is not None:
            params = plans.booked_slots_params(record, fleet, now=now)
            booked = plans.booked_slots(conn.execute(statements.PRINCIPAL_BOOKED_SLOTS, params).fetchone())
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
    )
    executor.carry_out(conn, current, plan, key, durable=session.durable, fresh=fresh)
    return CheckStart(plan.record, plan.decision or decision)


def apply_answer(
    session: Session,
    operation_id: str,
    *,
    owner: str,
    changes: Mapping[str, object],
    at: float,
    payload_extra: Mapping[str, object],
    key: bytes | None,
) -> tuple[OperationRecord, bool]:
    """Persist what one status answer meant and release the lease; (record, applied).

    Applied only while this call still holds the lease (`plans.answer_plan`).
    """
    with session.transaction() as conn:
        current = executor.must_fetch(conn, operation_id)
        plan = plans.answer_plan(
            current.record, owner=owner, changes=changes, at=at, payload_extra=payload_extra
        )
        return executor.carry_out(conn, current, plan, key), plan.applied
