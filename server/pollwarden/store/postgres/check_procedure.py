"""The check procedure on PostgreSQL: the gate's verdict written, and the answer recorded.

`begin_check` writes what `pollwarden.rules.gate.gate_verdict` decided, as one guarded
statement when nothing else goes with it (the reservation, or the count of a
refused call), else on the locked row (and the locked pace row); `apply_answer`
records what the one request's answer meant, in one guarded trip after this
process's own reservation, else on the locked row. The guarantee of each is
stated on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

from pollwarden.audit.entry import (
    PendingRefusals,
)
from pollwarden.core.records import (
    CheckStart,
    OperationRecord,
)
from pollwarden.rules.fleet_pace import bucket_from_row, busy_turn_retry_at
from pollwarden.rules.gate import GateVerdict, Verdict
from pollwarden.store import pace_reads, plans, statements
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.base import RESERVED_KEPT, Held, PostgresBase
from pollwarden.store.postgres.errors import GuardFailed
from pollwarden.store.postgres.executor import answer_statement, operation
from pollwarden.store.postgres.pace_turn import PaceTurnBusy
from pollwarden.store.rows import StoredOperation, stored
from pollwarden.store.transactions import CheckCall, fair_share_reads, gate
from pollwarden_providers.table_limits import FleetSpec


class CheckProcedure(PostgresBase):
    """The check's own transactions (that part of `pollwarden.store.Store`)."""

    async def _begin_check(self, call: CheckCall) -> CheckStart | None:
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
        operation_id, now, ask, fleets = call.operation_id, call.now, call.asks, call.fleets
        owner, lease_seconds = call.owner, call.lease_seconds
        known = self._known_row(operation_id)
        if known is not None:
            decision = await self._drive(gate(known.record, now, *ask))
            if decision.kind == Verdict.RESERVE or decision.refusal is not None:
                at = call.time(now)
                quick = await self._one_statement(known, decision, at, owner, lease_seconds, fleets)
                if quick is not None:
                    return quick
        row = await self._pool.read_one(statements.SELECT_OPERATION, {"operation_id": operation_id})
        if row is None:
            return None
        current = stored(row)
        self._remember(current)
        decision = await self._drive(gate(current.record, now, *ask))
        if not decision.writes:
            return CheckStart(current.record, decision)
        at = call.time(now)
        quick = await self._one_statement(current, decision, at, owner, lease_seconds, fleets)
        if quick is not None:
            return quick
        # Anything else (a pace, a stop, a recovered lease, a summary row due, or a peer moved first):
        # decide again on the locked row, where nothing can change. A check before its own held fleet
        # slot is only told that slot: it takes neither a turn at the pace row nor its lock, each held
        # for a round trip (issue 29: a slower instance's checks held the pace for everyone).
        fleet = fleets.get(current.record.provider)
        paced = pace_reads.needs_pace_row(current.record, decision, fleet, now=at)
        try:
            started = await self._locked_check(call, current, paced=paced)
            if started is None:  # the locked row needs the pace after all: decide with it
                started = await self._locked_check(call, current, paced=True)
        except PaceTurnBusy as busy:
            assert fleet is not None
            return await self._told_to_come_back(call, current, fleet, busy)
        assert started is not None
        return started

    async def _told_to_come_back(
        self, call: CheckCall, current: StoredOperation, fleet: FleetSpec, busy: PaceTurnBusy
    ) -> CheckStart:
        """A reservation that could not get this process's turn at the pace row: told when to come back
        (`plans.busy_turn_plan`), written on the operation's row if it is free and still as read (else only
        told)."""
        now = call.time(call.now)
        until = busy_turn_retry_at(
            now=now,
            rate=fleet.max_requests_per_second,
            waiting=busy.waiting,
            served=busy.served,
            waited=busy.waited,
        )
        plan = plans.busy_turn_plan(current.record, until, now)
        assert plan.decision is not None
        # Written only on the row as read, and never waited for: another transaction holding it (this
        # operation's check on another server, waiting for the same pace row) leaves it only told.
        operation_id = current.record.operation_id
        free = self._locked(operation_id, audit=False, durable=False, if_free=True)
        async with free as (writer, tx, cursor):
            row = await tx.read(cursor)
            locked = None if row is None else operation(row, operation_id)
            if locked is not None and locked.record.version == current.record.version:
                await writer.carry_out(locked, plan)
        return CheckStart(plan.record, plan.decision)

    async def _locked_check(
        self, call: CheckCall, current: StoredOperation, *, paced: bool
    ) -> CheckStart | None:
        """`_begin_check` on the locked row (and, when `paced`, the provider's locked pace row); None when
        the pace was not taken and the locked row needs it."""
        operation_id, now, ask = call.operation_id, call.now, call.asks
        fleet = call.fleets.get(current.record.provider)
        pace = fleet if paced else None
        async with (
            self._pace_turn_if(pace, current.record.provider),
            self._locked(operation_id) as (
                writer,
                tx,
                cursor,
            ),
        ):
            pace_cursor = owed_cursor = None
            share_cursors: list[Any] = []
            shared: dict[str, object] = {}
            if pace is not None:
                await tx.queue(sql.ENSURE_FLEET_ROW, {"provider": current.record.provider})
                pace_cursor = await tx.queue(sql.LOCK_FLEET_ROW, {"provider": current.record.provider})
                # In the same trip, once the pace row is locked: bounded by the time before the trip.
                before = call.time(now)
                params = pace_reads.owed_params(current.record, pace, now=before)
                owed_cursor = await tx.queue(statements.PROVIDER_OWED_SLOTS, params)
                if call.fleet_slots is not None:  # fair shares' reads too: no trip of their own
                    shared = pace_reads.booked_slots_params(current.record, pace, now=before)
                    share_cursors = [await tx.queue(q.statement, q.params) for q in fair_share_reads(shared)]
            current = operation(await tx.read(cursor), operation_id)
            pace_row = None if pace_cursor is None else await tx.read(pace_cursor)
            owed_row = None if owed_cursor is None else await tx.read(owed_cursor)
            shares = None
            if share_cursors:
                held, oldest, other = [await tx.read(c) for c in share_cursors]
                # Read with the row as it was before the lock: kept only if its last request is the same.
                if pace_reads.served_since(current.record) == shared["served_at"]:
                    shares = (held, oldest, other)
            owed = 0 if owed_row is None else int(str(owed_row[0]))
            bucket = bucket_from_row(pace_row)
            now = call.time(now)
            held = Held(writer, tx, cursor, operation_id, [])
            decision = await self._drive(gate(current.record, now, *ask), held)
            if pace is None and pace_reads.needs_pace_row(current.record, decision, fleet, now=now):
                return None  # nothing was queued: the COMMIT writes nothing and frees the row
            if not decision.writes:
                return CheckStart(current.record, decision)
            flow = call.check_flow(current, decision, now, bucket, owed, shares)
            return await self._drive(flow, held)

    def _pace_turn_if(self, fleet: FleetSpec | None, provider: str) -> AbstractAsyncContextManager[None]:
        """`_pace_turn` for a provider with a [fleet] pace; nothing to wait for without one."""
        return self._pace_turn(provider) if fleet is not None else nullcontext()

    async def _one_statement(
        self,
        current: StoredOperation,
        decision: GateVerdict,
        now: float,
        owner: str,
        lease_seconds: float,
        fleets: Mapping[str, FleetSpec | None],
    ) -> CheckStart | None:
        """The reservation or a refusal count as one guarded statement, when nothing goes with it."""
        record = current.record
        outcome = decision.refusal
        if outcome is not None:
            if not plans.quiet_refusal(current.refusals, decision):
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
        if decision.kind != Verdict.RESERVE or fleets.get(record.provider) is not None:
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
        reserved = await self._pool.write_one(statements.RESERVE, params)
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
        """`Store.apply_answer` (on the locked row: two trips); one trip when this process reserved the
        row in one statement and it is still exactly as reserved (`_answer_as_reserved`)."""
        reserved = self._reserved.pop((operation_id, owner), None)
        if reserved is not None:
            answered = await self._answer_as_reserved(reserved, owner, changes, at, payload_extra)
            if answered is not None:
                self._remember(answered)
                return answered.record, True
        return await super().apply_answer(
            operation_id, owner=owner, changes=changes, at=at, payload_extra=payload_extra
        )

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
        plan = plans.answer_plan(
            reserved.record, owner=owner, changes=changes, at=at, payload_extra=payload_extra
        )
        statement, params, after = answer_statement(reserved, plan, owner=owner, key=self._key)
        try:
            await self._pool.write_one(statement, params)
        except GuardFailed:
            return None
        return after

    # -- creating and submitting ---------------------------------------------------------------
