"""The check procedure on SQLite: the gate's verdict written before the request, in one hop.

`begin_check` loads the operation, lets the pure gate (`pollwarden.gate`)
decide, and writes what it decided, guarded in SQL by the version it read
(optimistic: another process that changed the operation in between makes the
guard fail, and the decision is taken again under the write lock).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pollwarden.fleet_pace import bucket_from_row
from pollwarden.gate import GateDecision, decide_check
from pollwarden.records import CheckStart, OperationRecord
from pollwarden.store import plans, statements
from pollwarden.store.rows import StoredOperation
from pollwarden.store.sqlite import executor, sql
from pollwarden.store.sqlite.connection import Session
from pollwarden.store.sqlite.executor import StaleRow
from pollwarden.vocabulary import Status
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
        step = plans.pace_step(record, decision, fleet, bucket, now=now)
        if plans.needs_booked_slots(step, fleet_slots):
            held = {
                "provider": record.provider,
                "owner": record.owner,
                "now": now,
                "operation_id": record.operation_id,
            }
            count, earliest = conn.execute(statements.PRINCIPAL_BOOKED_SLOTS, held).fetchone()
            booked = (int(count), None if earliest is None else float(earliest))
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
    )
    executor.carry_out(conn, current, plan, key, durable=session.durable, fresh=fresh)
    return CheckStart(plan.record, plan.decision or decision)
