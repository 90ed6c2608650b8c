"""The PostgreSQL engine: the `Store` interface over one database shared by every instance.

Each method is one transaction, in pipeline mode (see `connection`), in as few
round trips as its reads allow; the guarantee each gives is stated on it. The
shape of most writes is two trips: the first locks the operation row (when the
provider has a [fleet] pace, its pace row too) and reads it; the second carries
the new rows and the COMMIT. The check's own writes are shorter: the
reservation, when nothing else goes with it, is one guarded `UPDATE …
RETURNING` that commits itself (autocommit, one trip), the count of a refused
call one guarded statement, and the answer to this process's own reservation
one guarded trip; the read before them is saved when this process knows the
row (`_known_row`: the guard holds only on that very row). Nothing uses SKIP
LOCKED: a peer that skipped a locked row could spend the same budget or pace.

The audit (`pollwarden.audit_verify`): an operation's first row joins the one
chain, whose head row its transaction locks; every later row follows that
operation's own last row, recorded on the operation's row, so answers to
different operations never wait for one another. Every time written comes
from the caller's clock.
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from pollwarden.audit import REKEY_OPERATION, SEAL_KIND, AuditRow
from pollwarden.audit_entry import (
    NO_REFUSALS,
    REFUSALS_PER_SUMMARY,
    AuditEvent,
    OperationChain,
    PendingRefusals,
    event,
    lease_recovered,
)
from pollwarden.errors import StoreError
from pollwarden.gate import GateDecision, Step, decide_check, may_reserve
from pollwarden.job_identity import REOPENABLE, account_parts, duplicate_changes
from pollwarden.records import (
    ApprovalRecord,
    CheckStart,
    FollowupRecord,
    OperationRecord,
    WakeOutcome,
    WakeResult,
)
from pollwarden.schedule import pace, slot_still_held
from pollwarden.store.browse import OperationFacets, OperationFilter, OperationPage
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.postgres import browse, sql
from pollwarden.store.postgres.connection import EngineStats, GuardFailed, Pool, Tx, migrate
from pollwarden.store.postgres.writer import Writer, operation, seal_entries
from pollwarden.store.sqlite.queries import OPTIONAL_NEW_COLUMNS
from pollwarden.store.sqlite.rows import StoredOperation, stored
from pollwarden.timefmt import iso
from pollwarden.vocabulary import (
    APPROVAL_CLOSABLE_FROM,
    ApprovalKind,
    ApprovalStatus,
    DelaySource,
    FollowupKind,
    FollowupStatus,
    Outcome,
    Status,
    status_for,
)
from pollwarden_providers.table_limits import FleetSpec

# Connections per process: concurrent tool calls of one HTTP instance each borrow one.
POOL_SIZE = 10

# Reservations remembered for a one-trip answer (an entry is dropped when its answer comes).
_RESERVED_KEPT = 256
# Operation rows remembered as this process last saw them (the check's first trip, saved).
_KNOWN_KEPT = 4096

# What a submission answer that named another operation's job still records about itself.
_SUBMIT_ANSWER_FACTS = frozenset({"last_http_status", "last_http_at", "provider_request_id"})

_DECIDED_KIND = {
    ApprovalStatus.APPROVED: "approval_granted",
    ApprovalStatus.EXPIRED: "approval_expired",
    ApprovalStatus.VOID: "approval_void",
}


class PostgresStore:
    """One process's store on a PostgreSQL database (implements `pollwarden.store.Store`)."""

    def __init__(self, pool: Pool, location: DatabaseLocation, audit_key: bytes | None) -> None:
        self._pool = pool
        self._key = audit_key
        self.location = location
        # The rows this process reserved in one statement, by (operation, lease owner): the answer
        # that follows is written in one trip if the row is still exactly that (see apply_answer).
        self._reserved: dict[tuple[str, str], StoredOperation] = {}
        # Each operation's row as this process last read or wrote it (see `_known_row`).
        self._known: OrderedDict[str, StoredOperation] = OrderedDict()

    def _remember(self, current: StoredOperation) -> None:
        """Keep `current` as the row this process knows last (bounded: the oldest go first)."""
        op_id = current.record.operation_id
        self._known[op_id] = current
        self._known.move_to_end(op_id)
        while len(self._known) > _KNOWN_KEPT:
            self._known.popitem(last=False)

    def _forget(self, operation_id: str) -> None:
        self._known.pop(operation_id, None)

    @property
    def stats(self) -> EngineStats:
        """Round trips and commits since the store opened."""
        return self._pool.stats

    @asynccontextmanager
    async def _locked(
        self, operation_id: str | None = None, *, audit: bool = True, durable: bool = True
    ) -> AsyncGenerator[tuple[Writer, Tx, Any]]:
        """A transaction that locks the operation row first (and reads the audit head); yields the row's cursor."""
        async with self._pool.transaction(durable=durable) as tx:
            writer = Writer(tx, self._key)
            cursor = None
            if operation_id is not None:
                self._forget(operation_id)  # written on the locked row: read afresh next time
                cursor = await tx.queue(sql.LOCK_OPERATION, {"operation_id": operation_id})
            if audit:
                await writer.head_first()
            yield writer, tx, cursor
            await writer.finish()

    # -- reads (one statement, no transaction) ------------------------------------------------------

    async def get(self, operation_id: str) -> OperationRecord | None:
        """The current record, or None."""
        row = await self._pool.read_one(sql.SELECT_OPERATION, {"operation_id": operation_id})
        if row is None:
            return None
        current = stored(row)
        self._remember(current)
        return current.record

    async def list_operations(
        self,
        *,
        status: str | None = None,
        provider: str | None = None,
        limit: int = 50,
        owner: str | None = None,
    ) -> list[OperationRecord]:
        """Most recent operations first (only `owner`'s when given)."""
        params = {"status": status, "provider": provider, "owner": owner, "limit": limit}
        query = sql.list_operations(
            *(name for name in ("status", "provider", "owner") if params[name] is not None)
        )
        found = await self._pool.read(query, params)
        return [stored(row).record for row in found]

    async def principal_usage(self, owner: str, *, since: float) -> tuple[int, int]:
        """(active operations, operations created after `since`) of one principal."""
        active = await self._pool.read_one(sql.COUNT_ACTIVE_OF_OWNER, {"owner": owner})
        started = await self._pool.read_one(
            sql.COUNT_CREATED_SINCE_BY_OWNER, {"owner": owner, "since": since}
        )
        return (0 if active is None else int(active[0])), (0 if started is None else int(started[0]))

    async def operations_of_fingerprint(self, fingerprint: str, *, limit: int = 20) -> list[OperationRecord]:
        """The operations recorded with this request fingerprint, newest first."""
        found = await self._pool.read(sql.LIST_BY_FINGERPRINT, {"fingerprint": fingerprint, "limit": limit})
        return [stored(row).record for row in found]

    async def count_operations(self) -> int:
        """How many operations the database holds."""
        row = await self._pool.read_one(sql.COUNT_OPERATIONS)
        return 0 if row is None else int(row[0])

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        """One approval by id."""
        row = await self._pool.read_one(sql.SELECT_APPROVAL, {"approval_id": approval_id})
        return None if row is None else ApprovalRecord.from_row(row)

    async def list_approvals(
        self, *, status: str | None = None, operation_id: str | None = None
    ) -> list[ApprovalRecord]:
        """Approvals, newest first."""
        if operation_id is not None:
            query = sql.LIST_APPROVALS_OF if status is None else sql.LIST_APPROVALS_OF_BY_STATUS
        else:
            query = sql.LIST_APPROVALS if status is None else sql.LIST_APPROVALS_BY_STATUS
        found = await self._pool.read(query, {"status": status, "operation_id": operation_id})
        return [ApprovalRecord.from_row(row) for row in found]

    async def list_followups(self, operation_id: str) -> list[FollowupRecord]:
        """The follow-ups of one operation, oldest first."""
        found = await self._pool.read(sql.LIST_FOLLOWUPS, {"operation_id": operation_id})
        return [FollowupRecord.from_row(row) for row in found]

    # -- reads for a person looking at everything (the console; see `pollwarden.store.browse`) ---

    async def operations_page(self, filters: OperationFilter, *, page: int, page_size: int) -> OperationPage:
        """One page of the operations matching `filters`, newest first, and how many match."""
        return await browse.operations_page(self._pool, filters, max(1, page), page_size)

    async def operation_facets(self) -> OperationFacets:
        """Every provider, stop reason and owner some operation has (to filter by)."""
        return await browse.facets(self._pool)

    async def audit_rows(self, operation_id: str) -> list[AuditRow]:
        """One operation's audit rows in chain order (its story and timeline)."""
        return await browse.audit_rows(self._pool, operation_id)

    async def polled_times(self, providers: Sequence[str], *, since: float) -> dict[str, list[float]]:
        """When each status request of `providers` was answered since `since` (epoch s), per provider."""
        return await browse.polled_times(self._pool, providers, iso(since) or "")

    # -- the check procedure ------------------------------------------------------------------

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
        async with self._locked(operation_id) as (writer, tx, cursor):
            pace_cursor = None
            if fleet is not None:
                await tx.queue(sql.ENSURE_FLEET_ROW, {"provider": current.record.provider})
                pace_cursor = await tx.queue(sql.LOCK_FLEET_ROW, {"provider": current.record.provider})
            current = operation(await tx.read(cursor), operation_id)
            tat_row = None if pace_cursor is None else await tx.read(pace_cursor)
            tat = None if tat_row is None or tat_row[0] is None else float(tat_row[0])
            now = clock() if clock is not None else now
            decision = await self._decide(
                tx, current.record, now, wait_until, fleets, apply_approvals, accounts, needs_person
            )
            if not decision.writes:
                return CheckStart(current.record, decision)
            return await _carry_out(
                writer, current, decision, now, owner, lease_seconds, fleet, tat, fleet_slots
            )

    def _known_row(self, operation_id: str) -> StoredOperation | None:
        """The row as this process last saw it, while it is waiting (an escalated one's approvals
        live in other rows, read on every check)."""
        known = self._known.get(operation_id)
        return known if known is not None and known.record.status == Status.WAITING else None

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
            async with self._pool.transaction(durable=False) as tx:
                cursor = await tx.queue(sql.COUNT_REFUSAL, {**params, "version": record.version})
            counted = await cursor.fetchone()
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
        if len(self._reserved) >= _RESERVED_KEPT:
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
        if reserved.refusals.count:
            return None
        released = {**changes, "lease_owner": None, "lease_expires_at": None}
        try:
            async with self._pool.transaction() as tx:
                writer = Writer(tx, self._key)
                updated = await writer.write(reserved, released, at=at, owner=owner)
                polled = event(updated, "polled", at, outcome=Outcome.POLLED, extra=payload_extra)
                await writer.append(polled, on=reserved, unread=True)
                await writer.finish()
                chain = writer.chain_of(reserved.record.operation_id)
        except GuardFailed:
            return None
        return StoredOperation(updated, NO_REFUSALS, chain)

    # -- creating and submitting ---------------------------------------------------------------

    async def create_operation(
        self, values: Mapping[str, object], *, kind: str, at: float
    ) -> tuple[OperationRecord, bool]:
        """Insert the record and its first audit row unless the id or the job exists; (record, created).

        Guarantee: one job, one budget across processes — the INSERT does nothing
        when the id or the job (the partial UNIQUE index) is taken, waiting for a
        concurrent insert of either to commit; then the operation holding the id,
        else the job's holder, is returned (pollwarden.job_identity). A submission
        first takes its payload's advisory lock and, unless its id exists, is
        answered with the payload's operation still in flight if there is one.
        """
        values = {**OPTIONAL_NEW_COLUMNS, **values}
        missing = set(sql.NEW_OPERATION_COLUMNS) - set(values)
        extra = set(values) - set(sql.NEW_OPERATION_COLUMNS)
        if missing or extra:
            raise ValueError(
                f"a new operation needs exactly its columns (missing {missing}, unknown {extra})"
            )
        operation_id = str(values["operation_id"])
        async with self._locked(audit=False) as (writer, tx, _):
            if values["submit_payload_json"] is not None:
                payload = {"request_fingerprint": values["request_fingerprint"]}
                await tx.queue(sql.LOCK_PAYLOAD, payload)
                same_id = await tx.queue(sql.SELECT_OPERATION, {"operation_id": operation_id})
                in_flight = await tx.one(sql.SELECT_PAYLOAD_IN_FLIGHT, {**payload, "owner": values["owner"]})
                if in_flight is not None and await tx.read(same_id) is None:
                    return stored(in_flight).record, False
            inserted = await tx.queue(sql.INSERT_OPERATION, dict(values))
            await writer.head_first(lock=True)  # its first row is a row of the one chain
            row = await tx.read(inserted)
            if row is None:
                existing = await tx.one(sql.SELECT_OPERATION, {"operation_id": operation_id})
                if existing is None and values["provider_job_id"] is not None:
                    job = {k: values[k] for k in ("provider", "account_context", "provider_job_id", "owner")}
                    existing = await tx.one(sql.SELECT_JOB_OWNER, job)
                return operation(existing, operation_id).record, False
            created = stored(row).record
            origin, credential_env = account_parts(created.account_context)
            first = {
                "account_origin": origin,
                "account_credential_env": credential_env,
                "expected_terminal_state": created.expected_terminal_state,
            }
            await writer.append(
                event(created, kind, at, extra=first),
                on=StoredOperation(created, NO_REFUSALS, OperationChain(0, "")),
            )
            await writer.finish()
            opened = StoredOperation(created, NO_REFUSALS, writer.chain_of(operation_id))
        self._remember(opened)  # committed: its first check needs no read
        return created, True

    async def claim_submission(
        self, operation_id: str, *, owner: str, now: float, lease_seconds: float, allow_stale: bool, note: str
    ) -> OperationRecord | None:
        """Take the submission lease before the submit request is sent (None: not free); committed first."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            record = current.record
            await writer.flush(current)
            stale = allow_stale and (record.lease_expires_at or 0.0) <= now
            if record.status != Status.SUBMITTING or not (record.lease_owner is None or stale):
                return None
            if record.held_for_approval:
                return None  # a resubmission a person has not approved is never sent
            claimed = await writer.write(
                current,
                {"lease_owner": owner, "lease_expires_at": now + lease_seconds, "submit_sent_at": now},
                at=now,
            )
            await writer.append(event(claimed, "submit_sending", now, note=note), on=current)
            return claimed

    async def finish_submission(
        self,
        operation_id: str,
        *,
        owner: str | None,
        changes: Mapping[str, object],
        kind: str,
        at: float,
        note: str | None,
        payload_extra: Mapping[str, object] | None = None,
    ) -> OperationRecord | None:
        """Record what a submission led to; with `owner`, only while it holds the lease (released)."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            record = current.record
            await writer.flush(current)
            if record.status != Status.SUBMITTING or (owner is not None and record.lease_owner != owner):
                return None
            released: dict[str, object] = {**changes, "lease_owner": None, "lease_expires_at": None}
            job_id = changes.get("provider_job_id")
            if job_id is not None:
                # The provider named a job another operation holds: this submission adopts nothing.
                job = {
                    "provider": record.provider,
                    "account_context": record.account_context,
                    "owner": record.owner,
                }
                found = await tx.one(sql.SELECT_JOB_OWNER, {**job, "provider_job_id": job_id})
                holder = None if found is None else stored(found).record
                if holder is not None and holder.operation_id != operation_id:
                    kept = {k: v for k, v in changes.items() if k in _SUBMIT_ANSWER_FACTS}
                    released = {**kept, **duplicate_changes(holder.operation_id, str(job_id), at=at)}
                    released["provider_job_id"] = job_id
                    kind, note = "stopped", str(released["stop_detail"])
            finished = await writer.write(current, released, at=at)
            await writer.append(event(finished, kind, at, note=note, extra=payload_extra), on=current)
            return finished

    # -- extensions and approvals ---------------------------------------------------------------

    async def apply_extension(
        self,
        operation_id: str,
        *,
        bound_version: int,
        changes: Mapping[str, object],
        at: float,
        approval_id: str | None,
        payload_extra: Mapping[str, object],
    ) -> OperationRecord | None:
        """Grant a new authorization, only if the operation is still as it was when asked."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            record = current.record
            await writer.flush(current)
            if record.version != bound_version or record.status != Status.ESCALATED:
                return None
            granted = await writer.write(
                current, {**changes, "extensions_used": record.extensions_used + 1}, at=at
            )
            if approval_id is not None:
                await tx.queue(sql.MARK_APPROVAL_APPLIED, {"approval_id": approval_id})
            await writer.append(
                event(granted, "extension_approved", at, note=approval_id, extra=payload_extra), on=current
            )
            return granted

    async def open_approval(
        self,
        *,
        approval_id: str,
        record: OperationRecord,
        kind: str,
        request: Mapping[str, object],
        at: float,
        ttl_seconds: float,
    ) -> ApprovalRecord:
        """Record a question for a person, bound to the operation as it is now (idempotent)."""
        request_json = json.dumps(request, sort_keys=True)
        params = {
            "approval_id": approval_id,
            "operation_id": record.operation_id,
            "kind": ApprovalKind(kind),
            "version": record.version,
            "request_json": request_json,
            "at": at,
            "expires_at": at + ttl_seconds,
        }
        async with self._locked(record.operation_id) as (writer, tx, cursor):
            existing = await tx.queue(sql.FIND_PENDING_APPROVAL, params)
            current = operation(await tx.read(cursor), record.operation_id)
            found = await tx.read(existing)
            if found is not None:
                return ApprovalRecord.from_row(found)
            await tx.queue(sql.INSERT_APPROVAL, params)
            await writer.flush(current)
            await writer.append(
                event(
                    record,
                    "approval_pending",
                    at,
                    note=approval_id,
                    extra={"request": dict(request), "approval_kind": str(kind)},
                ),
                on=current,
            )
            return ApprovalRecord(
                approval_id,
                record.operation_id,
                ApprovalKind(kind),
                ApprovalStatus.PENDING,
                request_json,
                record.version,
                at,
                at + ttl_seconds,
                None,
                None,
                None,
            )

    async def decide_approval(
        self,
        approval_id: str,
        *,
        approve: bool,
        by: str,
        at: float,
        method: str,
        signature: str | None = None,
    ) -> ApprovalRecord | None:
        """A person's answer to a pending approval (pending → approved/denied; expired when late).

        Guarantee: decided once — the operation row, then the approval row, are
        locked, and only a pending approval is decided.
        """
        first = await self.get_approval(approval_id)
        if first is None:
            return None
        async with self._locked(first.operation_id) as (writer, tx, cursor):
            approval_cursor = await tx.queue(sql.LOCK_APPROVAL, {"approval_id": approval_id})
            current = operation(await tx.read(cursor), first.operation_id)
            row = await tx.read(approval_cursor)
            approval = None if row is None else ApprovalRecord.from_row(row)
            if approval is None or approval.status != ApprovalStatus.PENDING:
                return approval
            if at >= approval.expires_at:
                status = ApprovalStatus.EXPIRED
            elif approve and current.record.version != approval.bound_version:
                status = ApprovalStatus.VOID  # the operation changed since the person was asked
            else:
                status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
            decided = {"status": status, "at": at, "by": by, "method": method, "signature": signature}
            await tx.queue(sql.DECIDE_APPROVAL, {**decided, "approval_id": approval_id})
            await writer.flush(current)
            kind = _DECIDED_KIND.get(status, f"{approval.kind}_denied")
            note = f"{approval_id} by {by}"
            await writer.append(
                event(current.record, kind, at, note=note, extra={"authenticated_by": method}), on=current
            )
            return dataclasses.replace(
                approval,
                status=status,
                decided_at=at,
                decided_by=by,
                decided_method=method,
                decision_signature=signature,
            )

    async def close_approval(
        self, approval_id: str, *, status: str, at: float, note: str, audit_kind: str | None = None
    ) -> ApprovalRecord | None:
        """Mark an approval applied, void or expired; with `audit_kind`, tell it in the operation's story.

        Guarded as on SQLite: None when it is no longer in a status it may be closed from.
        """
        first = await self.get_approval(approval_id)
        if first is None:
            return None
        async with self._locked(first.operation_id, audit=audit_kind is not None) as (writer, tx, cursor):
            allowed = list(APPROVAL_CLOSABLE_FROM.get(status, ()))
            params = {
                "status": ApprovalStatus(status),
                "note": note,
                "at": at,
                "approval_id": approval_id,
                "allowed": allowed,
            }
            closed = await tx.queue(sql.CLOSE_APPROVAL, params)
            current = operation(await tx.read(cursor), first.operation_id)
            row = await tx.read(closed)
            if row is None:
                return None
            approval = ApprovalRecord.from_row(row)
            if audit_kind is not None:
                await writer.flush(current)
                await writer.append(event(current.record, audit_kind, at, note=approval_id), on=current)
            return approval

    # -- follow-ups and the audit ------------------------------------------------------------------

    async def record_followup(
        self,
        *,
        followup_id: str,
        operation_id: str,
        kind: str,
        status: str,
        at: float,
        approval_id: str | None = None,
        http_status: int | None = None,
        answer: str | None = None,
        note: str | None = None,
        operation_changes: Mapping[str, object] | None = None,
        expect_version: int | None = None,
    ) -> FollowupRecord | None:
        """Record one follow-up and its audit row; optionally change the operation (if still `expect_version`)."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            record = current.record
            await writer.flush(current)
            if operation_changes:
                if record.version != expect_version:
                    return None
                record = await writer.write(current, operation_changes, at=at)
            followup = FollowupRecord(
                followup_id,
                operation_id,
                FollowupKind(kind),
                FollowupStatus(status),
                approval_id,
                at,
                at,
                http_status,
                answer,
                note,
            )
            await tx.queue(sql.INSERT_FOLLOWUP, followup.__dict__)
            if approval_id is not None:
                await tx.queue(
                    sql.MARK_APPROVAL_USED, {"note": f"used by {followup_id}", "approval_id": approval_id}
                )
            extra = {"followup_id": followup_id, "http_status": http_status, "approval_id": approval_id}
            await writer.append(event(record, f"{kind}_{status}", at, note=note, extra=extra), on=current)
            return followup

    async def audit_event(
        self, operation_id: str, *, kind: str, at: float, note: str | None, extra: Mapping[str, object]
    ) -> None:
        """Append one audit row about an operation."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            await writer.flush(current)
            await writer.append(event(current.record, kind, at, note=note, extra=extra), on=current)

    async def reopen(
        self,
        operation_id: str,
        *,
        bound_version: int,
        next_check_at: float,
        at: float,
        extra: Mapping[str, object],
    ) -> OperationRecord | None:
        """An operator's reopen after a refusal, only if the operation is still as shown (None otherwise)."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            record = current.record
            await writer.flush(current)
            if (
                record.version != bound_version
                or record.status != Status.ESCALATED
                or record.stop_reason not in REOPENABLE
                or record.provider_job_id is None
                or record.duplicate_of is not None
            ):
                return None
            changes = {
                "status": Status.WAITING,
                "stop_reason": None,
                "stop_detail": None,
                "stopped_at": None,
                "next_check_at": next_check_at,
                "delay_source": DelaySource.MANUAL_EXTENSION,
                "fleet_slot_at": None,
                "lease_owner": None,
                "lease_expires_at": None,
            }
            reopened = await writer.write(current, changes, at=at)
            await writer.append(
                event(reopened, "reopened", at, note=str(extra.get("reason")), extra=extra), on=current
            )
            return reopened

    async def wake(
        self,
        *,
        provider: str,
        job_id: str,
        event_id: str,
        event_type: str,
        now: float,
        remember_seconds: float,
    ) -> WakeResult:
        """Remember a verified webhook's id and bring the job's waiting operations forward (one transaction).

        Guarantee: a replayed event id changes nothing (its row is inserted once, the primary key
        decides); only the guarded UPDATE's rows move, each audited as `woken_by_webhook`.
        """
        job = {"provider": provider, "job_id": job_id}
        if await self._pool.read_one(sql.KNOWS_JOB, job) is None:
            return WakeResult(WakeOutcome.UNKNOWN_JOB, ())
        async with self._locked() as (writer, tx, _):
            await tx.queue(sql.PRUNE_WEBHOOK_EVENTS, {"provider": provider, "before": now - remember_seconds})
            remembered = await tx.one(
                sql.REMEMBER_WEBHOOK_EVENT, {"provider": provider, "event_id": event_id, "now": now}
            )
            if remembered is None:
                return WakeResult(WakeOutcome.REPLAYED, ())
            woken = [stored(row) for row in await tx.all(sql.WAKE, {**job, "now": now})]
            extra = {
                "event_id": event_id,
                "event_type": event_type,
                "delay_source": DelaySource.PROVIDER_WEBHOOK,
            }
            for current in woken:
                self._forget(current.record.operation_id)
                await writer.flush(current)
                await writer.append(event(current.record, "woken_by_webhook", now, extra=extra), on=current)
            ids = tuple(c.record.operation_id for c in woken)
            return WakeResult(WakeOutcome.WOKEN if ids else WakeOutcome.NOT_WOKEN, ids)

    async def seal(self, *, at: float) -> int:
        """Seal every operation's audit chain that moved since the last seal; how many were named.

        One chain row (`audit.SEAL_KIND`) names each such operation with its chain's row count and
        last hash (`pollwarden.audit_verify`): from then on, rows deleted from the end of any of
        those chains are caught. Nothing is written when no chain moved. The head is locked first,
        then the moved operations' rows, for this one transaction.
        """
        async with self._pool.transaction() as tx:
            writer = Writer(tx, self._key)
            await writer.head_first(lock=True)
            moved = seal_entries(await tx.all(sql.SEAL_OPERATIONS))
            if not moved:
                return 0
            payload = {
                "decision": SEAL_KIND,
                "note": f"sealed the audit chains of {len(moved)} operations",
                "operations": moved,
            }
            await writer.append_to_chain(AuditEvent(REKEY_OPERATION, at, SEAL_KIND, payload))
            await writer.finish()
            return len(moved)

    async def flush_refusals(self, operation_id: str | None = None) -> int:
        """Write pending summaries of refused calls (one operation's, or all); how many were written."""
        if operation_id is None:
            if await self._pool.read_one(sql.ANY_PENDING_REFUSALS) is None:
                return 0
            async with self._locked() as (writer, tx, _):
                pending = await tx.all(sql.LOCK_PENDING_REFUSALS)
                for row in pending:
                    self._forget(stored(row).record.operation_id)
                    await writer.flush(stored(row))
                return len(pending)
        if await self._pool.read_one(sql.ANY_PENDING_REFUSALS_OF, {"operation_id": operation_id}) is None:
            return 0
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            return 1 if await writer.flush(current) else 0


async def _carry_out(
    writer: Writer,
    current: StoredOperation,
    decision: GateDecision,
    now: float,
    owner: str,
    lease_seconds: float,
    fleet: FleetSpec | None,
    tat: float | None,
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
        held = record.fleet_slot_at is not None and slot_still_held(
            record.fleet_slot_at, now=now, rate=fleet.max_requests_per_second
        )
        if not held:
            step = pace(tat, now=now, rate=fleet.max_requests_per_second, burst=fleet.burst)
            if not step.admitted and fleet_slots is not None:
                own = await _own_booked_slots(writer, record, now)
                if own is not None and own[0] >= fleet_slots:
                    wait = {
                        "fleet_slot_at": None,
                        "next_check_at": own[1],
                        "delay_source": DelaySource.FLEET_PACING,
                    }
                    waiting = await writer.write(current, wait, at=now)
                    return CheckStart(waiting, GateDecision(Step.PACED, allowed_at=waiting.next_check_at))
            await writer.tx.queue(sql.SET_FLEET_TAT, {"provider": record.provider, "tat": step.next_tat})
            if not step.admitted:
                slot = {
                    "fleet_slot_at": step.slot_at,
                    "next_check_at": step.slot_at,
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


@asynccontextmanager
async def open_postgres(
    location: DatabaseLocation, *, audit_key: bytes | None, busy_timeout: float
) -> AsyncGenerator[PostgresStore]:
    """Connect (migrating the schema once), and on the way out write pending refusals and close."""
    pool = Pool(location, lock_timeout=busy_timeout, max_size=POOL_SIZE)
    await pool.open()
    try:
        await migrate(pool)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await pool.close()
        raise
    store = PostgresStore(pool, location, audit_key)
    try:
        yield store
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await store.flush_refusals()
            except StoreError:
                pass  # unreachable or read-only: the counters stay in the row for the next reader
            finally:
                await pool.close()
