"""The check procedure's two transactions: before the request (the gate) and after it (the answer).

Each runs whole in one hop to the database thread. `begin_check` loads the
operation, lets the pure gate (`pollwarden.gate`) decide, and writes what it
decided, guarded in SQL by the version it read (optimistic: another process
that changed the operation in between makes the guard fail, and the decision
is taken again under the write lock). `apply_answer` records what one answer
meant and releases the lease, only while this call still holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pollwarden.audit_entry import event, lease_recovered
from pollwarden.fleet_pace import bucket_from_row, decide_pace
from pollwarden.gate import GateDecision, Step, decide_check, may_reserve
from pollwarden.records import CheckStart, OperationRecord
from pollwarden.store.sqlite import queries, rows
from pollwarden.store.sqlite.connection import Session
from pollwarden.store.sqlite.rows import StoredOperation
from pollwarden.vocabulary import Outcome, Status, status_for
from pollwarden_providers.table_limits import FleetSpec


class _Stale(Exception):
    """The operation changed between the gate's read and the guarded write."""


def _written(session: Session, sql: str, params: Mapping[str, object]) -> OperationRecord:
    """The row a write guarded by the version the gate read returned; `_Stale` when the guard failed."""
    written = rows.returned(session.conn.execute(sql, params))
    if written is None:
        raise _Stale
    return written.record


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
    current = rows.fetch(conn, operation_id)  # a snapshot read, outside any transaction
    if current is None:
        return None
    decision = _decide(
        session, current.record, now, wait_until, fleets, apply_approvals, accounts, needs_person
    )
    if not decision.writes:
        return CheckStart(current.record, decision)
    try:
        with session.transaction(durable=_durable(decision, current)):
            now = clock() if clock is not None else now
            return _carry_out(session, current, decision, now, owner, lease_seconds, fleets, key, fleet_slots)
    except _Stale:
        pass
    # Another process moved first: decide again with the write lock held, where nothing can change.
    with session.transaction(durable=True):
        now = clock() if clock is not None else now
        current = rows.must_fetch(conn, operation_id)
        decision = _decide(
            session, current.record, now, wait_until, fleets, apply_approvals, accounts, needs_person
        )
        if not decision.writes:
            return CheckStart(current.record, decision)
        return _carry_out(session, current, decision, now, owner, lease_seconds, fleets, key, fleet_slots)


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
            queries.HAS_DUE_EXTENSION_APPROVALS, (record.operation_id, now)
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


def _durable(decision: GateDecision, current: StoredOperation) -> bool:
    """Only a counted refusal that writes no audit row commits at synchronous=NORMAL."""
    outcome = decision.refusal
    if outcome is None:
        return True
    pending = current.refusals
    return pending.must_flush_before(outcome) or pending.full_after_one_more(outcome)


def _carry_out(
    session: Session,
    current: StoredOperation,
    decision: GateDecision,
    now: float,
    owner: str,
    lease_seconds: float,
    fleets: Mapping[str, FleetSpec | None],
    key: bytes | None,
    fleet_slots: int | None = None,
) -> CheckStart:
    conn = session.conn
    record = current.record
    outcome = decision.refusal
    if outcome is not None:
        counted = rows.count_refusal(conn, current, outcome, now, key, durable=session.durable)
        if counted is None:
            raise _Stale
        return CheckStart(counted.record, decision)
    if decision.step == Step.STOP:
        return CheckStart(_stop_before_request(session, current, decision, now, key), decision)
    fleet = fleets.get(record.provider)
    if fleet is not None and may_reserve(record, now):
        booked = _pace(session, record, fleet, now, fleet_slots)
        if booked is not None:
            return CheckStart(booked, GateDecision(Step.PACED, allowed_at=booked.next_check_at))
    reserved = _written(
        session,
        queries.RESERVE,
        {
            "owner": owner,
            "lease_expires_at": now + lease_seconds,
            "now": now,
            "operation_id": record.operation_id,
            "version": record.version,
        },
    )
    if record.lease_owner is not None:
        # A check that never finished held the lease until it expired: tell it in the story.
        rows.flush_refusals(conn, record.operation_id, key)
        rows.append(conn, lease_recovered(record, now), key)
    return CheckStart(reserved, decision)


def _pace(
    session: Session, record: OperationRecord, fleet: FleetSpec, now: float, fleet_slots: int | None = None
) -> OperationRecord | None:
    """Carry out `decide_pace` on the provider's pace row: None to send now, else the slot held (returned).

    Fair shares (`fleet_slots`): while the pace is used up, one principal holds at
    most that many booked slots of it; its other checks wait for the earliest of
    them (nothing taken from the pace), so another principal's check books the
    next free slot behind at most that many.
    """
    conn = session.conn
    row = conn.execute(queries.SELECT_FLEET_TAT, (record.provider,)).fetchone()
    bucket = bucket_from_row(row)
    verdict = decide_pace(
        bucket, now=now, held_slot=record.fleet_slot_at, rate=fleet.max_requests_per_second, burst=fleet.burst
    )
    if verdict.new_booking and fleet_slots is not None:
        held = {
            "provider": record.provider,
            "owner": record.owner,
            "now": now,
            "operation_id": record.operation_id,
        }
        count, earliest = conn.execute(queries.PRINCIPAL_BOOKED_SLOTS, held).fetchone()
        if int(count) >= fleet_slots and earliest is not None:
            wait = {
                "at": float(earliest),
                "now": now,
                "operation_id": record.operation_id,
                "version": record.version,
            }
            return _written(session, queries.WAIT_FOR_OWN_SLOT, wait)
    if verdict.bucket != bucket:
        written = verdict.bucket
        tat = now if written.tat is None else written.tat  # NOT NULL here; `now` is an unused clock
        conn.execute(queries.UPSERT_FLEET_TAT, (record.provider, tat, written.sent_tat))
    if verdict.send:
        return None
    slot = {
        "slot_at": verdict.at,
        "now": now,
        "operation_id": record.operation_id,
        "version": record.version,
    }
    return _written(session, queries.BOOK_FLEET_SLOT, slot)


def _stop_before_request(
    session: Session, current: StoredOperation, decision: GateDecision, now: float, key: bytes | None
) -> OperationRecord:
    """Stop a waiting operation whose deadline passed or whose budget is used, nothing sent."""
    conn = session.conn
    before = current.record
    assert decision.stop_reason is not None
    rows.flush_refusals(conn, before.operation_id, key)
    if before.lease_owner is not None:  # the gate stops only once a lease has expired
        rows.append(conn, lease_recovered(before, now), key)
    stopped = _written(
        session,
        queries.STOP_BEFORE_REQUEST,
        {
            "status": status_for(decision.stop_reason),
            "stop_reason": decision.stop_reason,
            "stop_detail": decision.stop_detail,
            "at": now,
            "operation_id": before.operation_id,
            "version": before.version,
        },
    )
    rows.append(conn, event(stopped, "stopped", now, outcome=Outcome.STOPPED), key)
    return stopped


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

    Applied only while this call still holds the lease: an answer that arrives
    after the lease was lost and taken over is audited, not applied.
    """
    with session.transaction() as conn:
        rows.flush_refusals(conn, operation_id, key)  # the refusals came before this answer
        released = {**changes, "lease_owner": None, "lease_expires_at": None}
        updated = rows.update_operation(
            conn, operation_id, released, queries.Guard.LEASE_HELD, at=at, guard_owner=owner
        )
        if updated is None:
            current = rows.must_fetch(conn, operation_id).record
            rows.append(
                conn,
                event(current, "late_answer_ignored", at, outcome=Outcome.POLLED, extra=payload_extra),
                key,
            )
            return current, False
        rows.append(conn, event(updated, "polled", at, outcome=Outcome.POLLED, extra=payload_extra), key)
        return updated, True
