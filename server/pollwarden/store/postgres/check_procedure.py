"""The check procedure on PostgreSQL: the gate's verdict written, and the answer recorded.

`begin_check` writes what `pollwarden.gate.decide_check` decided, as one guarded
statement when nothing else goes with it (the reservation, or the count of a
refused call), else on the locked row (and the locked pace row); `apply_answer`
records what the one request's answer meant, in one guarded trip after this
process's own reservation, else on the locked row. The guarantee of each is
stated on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext

from pollwarden.audit_entry import (
    NO_REFUSALS,
    REFUSALS_PER_SUMMARY,
    AuditEvent,
    PendingRefusals,
    event,
    lease_recovered,
)
from pollwarden.fleet_pace import PaceBucket, bucket_from_row, decide_pace
from pollwarden.gate import GateDecision, Step, decide_check, may_reserve
from pollwarden.records import (
    CheckStart,
    OperationRecord,
)
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.base import RESERVED_KEPT, PostgresBase
from pollwarden.store.postgres.connection import GuardFailed, Tx
from pollwarden.store.postgres.writer import Writer, answer_statement, operation
from pollwarden.store.sqlite.rows import StoredOperation, stored
from pollwarden.vocabulary import (
    DelaySource,
    Outcome,
    Status,
    status_for,
)
from pollwarden_providers.table_limits import FleetSpec


class CheckProcedure(PostgresBase):
    """The check's own transactions (that part of `pollwarden.store.Store`)."""

    async def begin_check(
        self,
        operation_id: str,
        *,
        now: float,
        wait_until: float,
        owner: str,
        lease_seconds: float,
        fleets: Mapping[str, FleetSpec | None],
        apply_approvals: bool = True,
        clock: Callable[[], float] | None = None,
        accounts: Mapping[str, str] | None = None,
        needs_person: frozenset[str] = frozenset(),
        fleet_slots: int | None = None,
    ) -> CheckStart | None:
        """Decide one round of check_status and write it (None: no such operation).

        Guarantee: a reservation is committed (synchronous_commit on) before
        this returns, so before the request leaves; it is either one guarded
        `UPDATE … RETURNING` (the gate's conditions and the version it read) or
        made on the operation row locked `FOR UPDATE`, with the provider's pace
        row locked in the same transaction when it has a [fleet] pace.

        The first trip, the read, is saved when this process knows the row (`_known_row`) and the
        gate's verdict on it is one guarded statement: the statement's guard (the version, and the
        refusal counters' state) holds only on that very row, so the verdict is the one a read
        would have given. Any other verdict, or a guard that fails, reads the row.
        """
        known = self._known_row(operation_id)
        if known is not None:
            decision = await self._decide(
                None, known.record, now, wait_until, fleets, apply_approvals, accounts, needs_person
            )
            if decision.step == Step.RESERVE or decision.refusal is not None:
                at = clock() if clock is not None else now
                quick = await self._one_statement(known, decision, at, owner, lease_seconds, fleets)
                if quick is not None:
                    return quick
        row = await self._pool.read_one(sql.SELECT_OPERATION, {"operation_id": operation_id})
        if row is None:
            return None
        current = stored(row)
        self._remember(current)
        decision = await self._decide(
            None, current.record, now, wait_until, fleets, apply_approvals, accounts, needs_person
        )
        if not decision.writes:
            return CheckStart(current.record, decision)
        at = clock() if clock is not None else now
        quick = await self._one_statement(current, decision, at, owner, lease_seconds, fleets)
        if quick is not None:
            return quick
        # Anything else (a pace, a stop, a recovered lease, a summary row due, or a peer moved first):
        # decide again on the locked row, where nothing can change.
        fleet = fleets.get(current.record.provider)
        async with (
            self._pace_turn_if(fleet, current.record.provider),
            self._locked(operation_id) as (
                writer,
                tx,
                cursor,
            ),
        ):
            pace_cursor = None
            if fleet is not None:
                await tx.queue(sql.ENSURE_FLEET_ROW, {"provider": current.record.provider})
                pace_cursor = await tx.queue(sql.LOCK_FLEET_ROW, {"provider": current.record.provider})
            current = operation(await tx.read(cursor), operation_id)
            pace_row = None if pace_cursor is None else await tx.read(pace_cursor)
            bucket = bucket_from_row(pace_row)
            now = clock() if clock is not None else now
            decision = await self._decide(
                tx, current.record, now, wait_until, fleets, apply_approvals, accounts, needs_person
            )
            if not decision.writes:
                return CheckStart(current.record, decision)
            return await _carry_out(
                writer, current, decision, now, owner, lease_seconds, fleet, bucket, fleet_slots
            )

    def _pace_turn_if(self, fleet: FleetSpec | None, provider: str) -> AbstractAsyncContextManager[None]:
        """`_pace_turn` for a provider with a [fleet] pace; nothing to wait for without one."""
        return self._pace_turn(provider) if fleet is not None else nullcontext()

    async def _decide(
        self,
        tx: Tx | None,
        record: OperationRecord,
        now: float,
        wait_until: float,
        fleets: Mapping[str, FleetSpec | None],
        apply_approvals: bool,
        accounts: Mapping[str, str] | None,
        needs_person: frozenset[str] = frozenset(),
    ) -> GateDecision:
        due = False
        if apply_approvals and record.status == Status.ESCALATED:
            params = {"operation_id": record.operation_id, "now": now}
            if tx is None:
                found = await self._pool.read_one(sql.HAS_DUE_EXTENSION_APPROVALS, params)
            else:
                found = await tx.one(sql.HAS_DUE_EXTENSION_APPROVALS, params)
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

    async def _one_statement(
        self,
        current: StoredOperation,
        decision: GateDecision,
        now: float,
        owner: str,
        lease_seconds: float,
        fleets: Mapping[str, FleetSpec | None],
    ) -> CheckStart | None:
        """The reservation or a refusal count as one guarded statement, when nothing goes with it."""
        record = current.record
        outcome = decision.refusal
        if outcome is not None:
            pending = current.refusals
            if pending.must_flush_before(outcome) or pending.full_after_one_more(outcome):
                return None  # a summary row is due: the locked path writes it
            # Only a counter nothing budget-related reads: committed without waiting for the disk.
            params = {"outcome": outcome, "at": now, "operation_id": record.operation_id}
            counted = await self._pool.write_one(
                sql.COUNT_REFUSAL, {**params, "version": record.version}, durable=False
            )
            if counted is None:
                self._forget(record.operation_id)
                return None
            count, _, first_at, last_at = counted
            refusals = PendingRefusals(int(count), outcome, first_at, last_at)
            self._remember(dataclasses.replace(current, refusals=refusals))
            return CheckStart(record, decision)  # the version guard held: only the counters moved
        if decision.step != Step.RESERVE or fleets.get(record.provider) is not None:
            return None
        if record.lease_owner is not None:
            return None  # an expired lease is recovered on the locked path (it writes an audit row)
        params = {
            "owner": owner,
            "lease_expires_at": now + lease_seconds,
            "now": now,
            "operation_id": record.operation_id,
            "version": record.version,
        }
        reserved = await self._pool.write_one(sql.RESERVE, params)
        if reserved is None:
            self._forget(record.operation_id)
            return None
        held = stored(reserved)
        self._remember(held)
        if len(self._reserved) >= RESERVED_KEPT:
            del self._reserved[next(iter(self._reserved))]  # a check that never answered
        self._reserved[(record.operation_id, owner)] = held
        return CheckStart(held.record, decision)

    async def apply_answer(
        self,
        operation_id: str,
        *,
        owner: str,
        changes: Mapping[str, object],
        at: float,
        payload_extra: Mapping[str, object],
    ) -> tuple[OperationRecord, bool]:
        """Persist what one status answer meant and release the lease; (record, applied).

        Guarantee: applied only while this call still holds the lease (checked
        on the locked row); a late answer is audited, not applied. Two trips;
        one when this process reserved the row in one statement and it is
        still exactly as reserved (`_answer_as_reserved`).
        """
        reserved = self._reserved.pop((operation_id, owner), None)
        if reserved is not None:
            answered = await self._answer_as_reserved(reserved, owner, changes, at, payload_extra)
            if answered is not None:
                self._remember(answered)
                return answered.record, True
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            await writer.flush(current)
            if current.record.lease_owner != owner:
                late = event(
                    current.record, "late_answer_ignored", at, outcome=Outcome.POLLED, extra=payload_extra
                )
                await writer.append(late, on=current)
                return current.record, False
            released = {**changes, "lease_owner": None, "lease_expires_at": None}
            updated = await writer.write(current, released, at=at)
            await writer.append(
                event(updated, "polled", at, outcome=Outcome.POLLED, extra=payload_extra), on=current
            )
            await writer.finish()
            answered = StoredOperation(updated, NO_REFUSALS, writer.chain_of(operation_id))
        self._remember(answered)  # committed: the next check needs no read
        return updated, True

    async def _answer_as_reserved(
        self,
        reserved: StoredOperation,
        owner: str,
        changes: Mapping[str, object],
        at: float,
        payload_extra: Mapping[str, object],
    ) -> StoredOperation | None:
        """The answer in one trip, computed from the row as this process reserved it (None: it changed).

        Written without reading the row first: the UPDATE's guard states that the row is still at the
        reserved version, leased by `owner`, with no refused call counted and no audit row written
        since — then it is the row reserved, and this is exactly what the locked path would write.
        Otherwise (or when the key does not match the chain) the guard fails, nothing is committed,
        and the caller takes the locked path.
        """
        if reserved.refusals.count or reserved.chain is None or reserved.chain.rows == 0:
            return None  # a summary row first, or the operation's first row: the locked path writes it
        released = {**changes, "lease_owner": None, "lease_expires_at": None}

        def polled(updated: OperationRecord) -> AuditEvent:
            return event(updated, "polled", at, outcome=Outcome.POLLED, extra=payload_extra)

        statement, params, after = answer_statement(
            reserved, released, polled, at=at, owner=owner, key=self._key
        )
        try:
            await self._pool.write_one(statement, params)
        except GuardFailed:
            return None
        return after

    # -- creating and submitting ---------------------------------------------------------------


async def _carry_out(
    writer: Writer,
    current: StoredOperation,
    decision: GateDecision,
    now: float,
    owner: str,
    lease_seconds: float,
    fleet: FleetSpec | None,
    bucket: PaceBucket,
    fleet_slots: int | None = None,
) -> CheckStart:
    """Write what the gate decided on the locked row (and the locked pace row).

    Fair shares (`fleet_slots`): while the pace is used up, one principal holds at
    most that many booked slots of it; its other checks wait for the earliest of
    them (nothing taken from the pace), as on SQLite.
    """
    record = current.record
    outcome = decision.refusal
    if outcome is not None:
        await _count_refusal(writer, current, outcome, now)
        return CheckStart(record, decision)
    if decision.step == Step.STOP:
        assert decision.stop_reason is not None
        await writer.flush(current)
        if record.lease_owner is not None:  # the gate stops only once a lease has expired
            await writer.append(lease_recovered(record, now), on=current)
        changes = {
            "status": status_for(decision.stop_reason),
            "stop_reason": decision.stop_reason,
            "stop_detail": decision.stop_detail,
            "stopped_at": now,
            "lease_owner": None,
            "lease_expires_at": None,
        }
        stopped = await writer.write(current, changes, at=now)
        await writer.append(event(stopped, "stopped", now, outcome=Outcome.STOPPED), on=current)
        return CheckStart(stopped, decision)
    if fleet is not None and may_reserve(record, now):
        verdict = decide_pace(
            bucket,
            now=now,
            held_slot=record.fleet_slot_at,
            rate=fleet.max_requests_per_second,
            burst=fleet.burst,
        )
        if verdict.new_booking and fleet_slots is not None:
            own = await _own_booked_slots(writer, record, now)
            if own is not None and own[0] >= fleet_slots:
                wait = {
                    "fleet_slot_at": None,
                    "next_check_at": own[1],
                    "delay_source": DelaySource.FLEET_PACING,
                }
                waiting = await writer.write(current, wait, at=now)
                return CheckStart(waiting, GateDecision(Step.PACED, allowed_at=waiting.next_check_at))
        if verdict.bucket != bucket:
            written = {
                "provider": record.provider,
                "tat": verdict.bucket.tat,
                "sent_tat": verdict.bucket.sent_tat,
            }
            await writer.tx.queue(sql.SET_FLEET_TAT, written)
        if not verdict.send:
            slot = {
                "fleet_slot_at": verdict.at,
                "next_check_at": verdict.at,
                "delay_source": DelaySource.FLEET_PACING,
            }
            booked = await writer.write(current, slot, at=now)
            return CheckStart(booked, GateDecision(Step.PACED, allowed_at=booked.next_check_at))
    if record.lease_owner is not None:
        # A check that never finished held the lease until it expired: tell it in the story.
        await writer.flush(current)
        await writer.append(lease_recovered(record, now), on=current)
    reserved = await writer.write(
        current,
        {
            "status_requests_used": record.status_requests_used + 1,
            "fleet_slot_at": None,
            "lease_owner": owner,
            "lease_expires_at": now + lease_seconds,
        },
        at=now,
    )
    return CheckStart(reserved, decision)


async def _own_booked_slots(writer: Writer, record: OperationRecord, now: float) -> tuple[int, float] | None:
    """How many future slots of this provider's pace the record's principal holds, and the earliest."""
    params = {
        "provider": record.provider,
        "owner": record.owner,
        "now": now,
        "operation_id": record.operation_id,
    }
    row = await writer.tx.one(sql.PRINCIPAL_BOOKED_SLOTS, params)
    if row is None or row[1] is None:
        return None
    return int(row[0]), float(row[1])


async def _count_refusal(writer: Writer, current: StoredOperation, outcome: Outcome, at: float) -> None:
    """Count one refused call on the locked row, writing the summary rows that are due."""
    pending = current.refusals
    if pending.must_flush_before(outcome):
        await writer.flush(current)
        await writer.finish()  # the counters reset before this call is counted
        pending = NO_REFUSALS
    after = PendingRefusals(pending.count + 1, outcome, pending.first_at if pending.count else at, at)
    if after.count >= REFUSALS_PER_SUMMARY:
        await writer.flush(dataclasses.replace(current, refusals=after))
        return
    await writer.tx.queue(
        sql.SET_REFUSALS,
        {
            "count": after.count,
            "outcome": outcome,
            "first_at": after.first_at,
            "last_at": after.last_at,
            "operation_id": current.record.operation_id,
        },
    )
