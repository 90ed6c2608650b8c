"""`Store`: every store transaction written once, over a small seam each engine provides.

A transaction here is a flow: a generator that yields what it needs (`Locked`,
`Query`, `Queue`, `CarryOut`, …) and gets the answer back, so its logic (read,
then a pure plan of `pollwarden.store.plans`, then its writes) is written once.
An engine provides the seam: `_read` (one statement outside a transaction,
`pollwarden.store.reads`), `_transact` (runs a flow as one transaction with its
locking: SQLite in one thread hop under its write lock, PostgreSQL in pipeline
mode on rows locked `FOR UPDATE`), and `begin_check`, the check procedure.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import anyio

from pollwarden.access.approval_policy import ApprovalPolicy
from pollwarden.audit.entry import NO_REFUSALS, OperationChain
from pollwarden.core.errors import StoreError
from pollwarden.core.records import (
    ApprovalRecord,
    CheckStart,
    FollowupRecord,
    OperationRecord,
    WakeOutcome,
    WakeResult,
)
from pollwarden.core.vocabulary import (
    APPROVAL_CLOSABLE_FROM,
    ApprovalKind,
    ApprovalStatus,
    FollowupKind,
    FollowupStatus,
    Status,
)
from pollwarden.rules.fleet_pace import PaceBucket, bucket_from_row
from pollwarden.rules.gate import GateVerdict, gate_verdict
from pollwarden.store import plans, statements
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.plans import FLUSH, Append, Plan
from pollwarden.store.reads import Row, StoreReads
from pollwarden.store.rows import StoredOperation, new_operation_values, stored
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


Request = Locked | Query | Queue | CarryOut | LockPayload | LockHead
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
) -> Flow[CheckStart]:
    """Carry out the gate's verdict (`plans.check_plan`): read what it needs first — the provider's pace
    (unless the caller read it, locked), the other operations' held slots not used yet (`owed`, unless
    the caller read them in the same trip) and the principal's booked slots (fair shares)."""
    record = current.record
    step = booked = None
    if fleet is not None and plans.needs_pace(record, decision, fleet, now=now):
        if bucket is None:
            bucket = bucket_from_row((yield Query(statements.SELECT_PACE, {"provider": record.provider})))
        if owed is None:
            row = yield Query(statements.PROVIDER_OWED_SLOTS, plans.owed_params(record, fleet, now=now))
            owed = 0 if row is None else int(str(row[0]))
        step = plans.pace_step(record, decision, fleet, bucket, now=now, owed=owed)
        if plans.needs_booked_slots(step, fleet_slots):
            params = plans.booked_slots_params(record, fleet, now=now)
            booked = plans.booked_slots((yield Query(statements.PRINCIPAL_BOOKED_SLOTS, params)))
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
    return CheckStart((yield CarryOut(current, plan)), plan.decision or decision)


def must(row: Row | None, operation_id: object) -> StoredOperation:
    """The operation row read; rows are never deleted, so a missing one is a programming error."""
    if row is None:
        raise StoreError(f"operation {operation_id!r} is not in the database")
    return stored(row)


S = TypeVar("S", bound="Store")


@asynccontextmanager
async def closing(store: S, close: Callable[[], Awaitable[None]]) -> AsyncGenerator[S]:
    """Yield the opened store; on the way out write its pending refusals and `close` it, whatever happens."""
    try:
        yield store
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await store.flush_refusals()
            except StoreError:
                pass  # unreachable, locked, read-only or replaced: the counters stay in the row for the next reader
            finally:
                await close()


class Store(StoreReads):
    """One process's connection to the shared database, in domain terms: each method is one transaction.

    Every engine gives the same guarantees: the reservation is committed (durably) before the request
    leaves, anything that spends a budget or a fleet pace is guarded against every other process, the
    audit chain stays one chain, and times come from the caller's clock, never the database's.
    """

    location: DatabaseLocation  # where the database is

    async def _transact(
        self, flow: Flow[T], *, lock: str | None = None, audit: bool = True, durable: bool = True
    ) -> T:
        """Run `flow` as one transaction, `lock`'s operation row locked first (`audit`: it appends to the
        audit chain); its result. Each engine defines it (its transaction mechanism)."""
        raise NotImplementedError  # the engine class defines it; Store alone is never used

    async def _carry_out_on(self, operation_id: str, plan_of: Callable[[OperationRecord], Plan]) -> Plan:
        return await self._transact(carry_out_on(plan_of), lock=operation_id)

    # -- reads an engine may answer otherwise ------------------------------------------------------

    latest_schema: ClassVar[int] = 0  # the schema step this pollwarden needs (the engine's migrations)
    schema_version_sql: ClassVar[str] = ""  # the engine's read of the step the database is at

    async def not_ready(self) -> str | None:
        """Why the database cannot serve now (gone, replaced, schema dropped or behind), or None: ready (/readyz)."""
        try:
            row = await self._read_one(self.schema_version_sql)
            await self._read("SELECT 1 FROM operations LIMIT 1")
        except StoreError as exc:
            return str(exc)
        version = 0 if row is None else int(row[0])
        if version < self.latest_schema:
            return (
                f"the database is at schema step {version}, this pollwarden needs {self.latest_schema}: "
                "restart to migrate"
            )
        return None

    async def database_time(self) -> float | None:
        """The database server's clock (epoch s) for `pollwarden doctor`'s skew check; None: this machine's."""
        return None

    # -- the check procedure -------------------------------------------------------------------------

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
        """One round of check_status before any request, in one transaction (None: no such operation).

        Loads the operation, lets `pollwarden.rules.gate.gate_verdict` decide, and
        writes that (`plans.check_plan`): a counted refusal (not_yet, stopped), a
        stop before any request (deadline, budget), or the reservation (the
        request counted and the lease taken, or a fleet slot booked), guarded by
        the same conditions. `fleets` holds the loaded provider tables' [fleet]
        specs (None without one); `accounts` their account contexts now (a waiting
        operation recorded under another one stops with `account_context_changed`).
        `needs_person`: providers whose every status request a person approves, and
        none approved this call: the gate answers NEEDS_PERSON and nothing is written.
        `fleet_slots`: while a pace is used up, at most this many booked slots per
        principal (issue 19's fair shares). With `clock`, the time every write is
        guarded and paced by is read again once the locks are held. Each engine
        defines it (its one-statement and locked paths).
        """
        raise NotImplementedError  # the engine class defines it

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

        `changes` maps `OperationRecord` fields to their new values. Applied only while this call
        still holds the lease (`plans.answer_plan`); a late answer is audited, not applied.
        """
        plan = await self._carry_out_on(
            operation_id,
            lambda record: plans.answer_plan(
                record, owner=owner, changes=changes, at=at, payload_extra=payload_extra
            ),
        )
        return plan.record, plan.applied

    # -- creating and submitting ---------------------------------------------------------------------

    async def create_operation(
        self, values: Mapping[str, object], *, kind: str, at: float
    ) -> tuple[OperationRecord, bool]:
        """Insert the record (and its first audit row) unless the id or the job exists; (record, created).

        One job, one budget (`pollwarden.rules.job_identity`): when the id exists, or the job (provider,
        account context, provider job id) already has an operation, or the submission's payload is
        still in flight under the principal's other operation, that one is returned (its
        `operation_id` may differ from the one asked for). Atomic across processes: the payload is
        locked, the head of the audit chain too, and the INSERT does nothing when the id or the job
        (the partial UNIQUE index) is taken.
        """
        values = new_operation_values(values)
        operation_id = {"operation_id": values["operation_id"]}

        def flow() -> Flow[tuple[OperationRecord, bool]]:
            if values["submit_payload_json"] is not None:
                payload = {"request_fingerprint": values["request_fingerprint"], "owner": values["owner"]}
                yield LockPayload(values["request_fingerprint"])
                same_id, in_flight = yield (
                    Query(statements.SELECT_OPERATION, operation_id),
                    Query(statements.SELECT_PAYLOAD_IN_FLIGHT, payload),
                )
                if in_flight is not None and same_id is None:
                    return stored(in_flight).record, False
            # Its first row is a row of the one chain: the head is locked before the row is inserted (so
            # two starts of one job never wait for each other crosswise).
            yield LockHead()
            row = yield Query(statements.INSERT_OPERATION, values)
            if row is None:
                existing = yield Query(statements.SELECT_OPERATION, operation_id)
                if existing is None:
                    job = {k: values[k] for k in ("provider", "account_context", "provider_job_id")}
                    existing = yield Query(statements.SELECT_JOB_OWNER, job)
                return must(existing, values["operation_id"]).record, False
            created = stored(row).record
            first = Append(plans.opening_event(created, kind, at))
            yield CarryOut(
                StoredOperation(created, NO_REFUSALS, OperationChain(0, "")), Plan(created, (first,))
            )
            return created, True

        return await self._transact(flow(), audit=False)

    async def claim_submission(
        self, operation_id: str, *, owner: str, now: float, lease_seconds: float, allow_stale: bool, note: str
    ) -> OperationRecord | None:
        """Take the submission lease before the submit request is sent (None: not free); committed first."""
        plan = await self._carry_out_on(
            operation_id,
            lambda record: plans.claim_plan(
                record, owner=owner, now=now, lease_seconds=lease_seconds, allow_stale=allow_stale, note=note
            ),
        )
        return plan.record if plan.applied else None

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
        """Record what a submission led to; with `owner`, release its lease (None: the guard did not hold;
        `plans.finish_plan`, told the operation holding the job the provider named)."""

        def flow() -> Flow[OperationRecord | None]:
            current: StoredOperation = yield Locked()
            record = current.record
            holder = None
            job_id = changes.get("provider_job_id")
            if job_id is not None and record.status == Status.SUBMITTING:
                job = {"provider": record.provider, "account_context": record.account_context}
                found = yield Query(statements.SELECT_JOB_OWNER, {**job, "provider_job_id": job_id})
                holder = None if found is None else stored(found).record
            plan = plans.finish_plan(
                record,
                owner=owner,
                changes=changes,
                kind=kind,
                at=at,
                note=note,
                payload_extra=payload_extra,
                job_holder=holder,
            )
            yield CarryOut(current, plan)
            return plan.record if plan.applied else None

        return await self._transact(flow(), lock=operation_id)

    # -- extensions and approvals --------------------------------------------------------------------

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
        plan = await self._carry_out_on(
            operation_id,
            lambda record: plans.extension_plan(
                record,
                bound_version=bound_version,
                changes=changes,
                at=at,
                approval_id=approval_id,
                payload_extra=payload_extra,
            ),
        )
        return plan.record if plan.applied else None

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
        """Record a question for a person, bound to the operation as it is now.

        Idempotent: the same operation version and the same request return the pending approval
        already recorded (a repeated question is not a new one).
        """
        asked = ApprovalRecord(
            approval_id,
            record.operation_id,
            ApprovalKind(kind),
            ApprovalStatus.PENDING,
            json.dumps(request, sort_keys=True),
            record.version,
            at,
            at + ttl_seconds,
            None,
            None,
            None,
        )
        params = {
            "approval_id": approval_id,
            "operation_id": record.operation_id,
            "kind": asked.kind,
            "version": record.version,
            "request_json": asked.request_json,
            "at": at,
            "expires_at": asked.expires_at,
        }

        def flow() -> Flow[ApprovalRecord]:
            current, existing = yield (Locked(), Query(statements.FIND_PENDING_APPROVAL, params))
            if existing is not None:
                return ApprovalRecord.from_row(existing)
            yield Queue(statements.INSERT_APPROVAL, params)
            question = plans.question_plan(record, approval_id=approval_id, kind=kind, request=request, at=at)
            yield CarryOut(current, question)
            return asked

        return await self._transact(flow(), lock=record.operation_id)

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
        """A person's answer to a pending approval (pending → approved/denied; expired when late, void when
        stale: `plans.decision_plan`), decided once: the operation row, then the approval row, are locked.

        `method` says how the decision was authenticated; it is kept with its `signature` so the
        controller can check it again before applying it.
        """
        first = await self.get_approval(approval_id)
        if first is None:
            return None

        def flow() -> Flow[ApprovalRecord | None]:
            current, row = yield (
                Locked(),
                Query(statements.SELECT_APPROVAL, {"approval_id": approval_id}, lock=True),
            )
            approval = None if row is None else ApprovalRecord.from_row(row)
            if approval is None or approval.status != ApprovalStatus.PENDING:
                return approval
            status, plan = plans.decision_plan(
                approval, current.record, approve=approve, by=by, at=at, method=method
            )
            decided = {"status": status, "at": at, "by": by, "method": method, "signature": signature}
            yield Queue(statements.DECIDE_APPROVAL, {**decided, "approval_id": approval_id})
            yield CarryOut(current, plan)
            return dataclasses.replace(
                approval,
                status=status,
                decided_at=at,
                decided_by=by,
                decided_method=method,
                decision_signature=signature,
            )

        return await self._transact(flow(), lock=first.operation_id)

    async def close_approval(
        self, approval_id: str, *, status: str, at: float, note: str, audit_kind: str | None = None
    ) -> ApprovalRecord | None:
        """Mark an approval applied, void or expired; with `audit_kind`, tell it in the operation's story.

        Guarded: None (and nothing written) when it is no longer in a status it may be closed from
        (`vocabulary.APPROVAL_CLOSABLE_FROM`): an applied one is never voided, a decided one never expired.
        """
        first = await self.get_approval(approval_id)
        if first is None:
            return None
        allowed = (*APPROVAL_CLOSABLE_FROM.get(status, ()), None, None, None)[:3]
        params: dict[str, object] = {
            "status": ApprovalStatus(status),
            "note": note,
            "at": at,
            "approval_id": approval_id,
        }
        params.update({f"from_{n}": allowed[n] for n in range(3)})

        def flow() -> Flow[ApprovalRecord | None]:
            current, row = yield (Locked(), Query(statements.CLOSE_APPROVAL, params))
            if row is None:
                return None
            if audit_kind is not None:
                yield CarryOut(current, plans.note_plan(current.record, audit_kind, at, note=approval_id))
            return ApprovalRecord.from_row(row)

        return await self._transact(flow(), lock=first.operation_id, audit=audit_kind is not None)

    async def reopen(
        self,
        operation_id: str,
        *,
        bound_version: int,
        next_check_at: float,
        at: float,
        extra: Mapping[str, object],
    ) -> OperationRecord | None:
        """An operator reopens an operation stopped by a refusal (`job_identity.REOPENABLE`).

        Back to waiting with the same budget, deadline and counters, only while it is still at
        `bound_version` (as shown to the operator); audited as `reopened` with `extra` (reason, who,
        how authenticated). None: it changed.
        """
        plan = await self._carry_out_on(
            operation_id,
            lambda record: plans.reopen_plan(
                record, bound_version=bound_version, next_check_at=next_check_at, at=at, extra=extra
            ),
        )
        return plan.record if plan.applied else None

    # -- follow-ups and the audit --------------------------------------------------------------------

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
        plan = await self._carry_out_on(
            operation_id,
            lambda record: plans.followup_plan(
                record, followup, operation_changes=operation_changes, expect_version=expect_version
            ),
        )
        return followup if plan.applied else None

    async def audit_event(
        self, operation_id: str, *, kind: str, at: float, note: str | None, extra: Mapping[str, object]
    ) -> None:
        """Append one audit row about an operation."""
        await self._carry_out_on(
            operation_id, lambda record: plans.note_plan(record, kind, at, note=note, extra=extra)
        )

    async def flush_refusals(self, operation_id: str | None = None) -> int:
        """Write the pending summaries of refused calls (one operation's, or every one's); how many.

        Called before the story is read and when the store closes, so a looping agent shows up in
        the audit even on an operation that never changes again. Looks first without a
        transaction, so reading the story of a quiet (or read-only) database writes nothing.
        """
        if operation_id is None:
            if await self._read_one(statements.ANY_PENDING_REFUSALS) is None:
                return 0
            return await self._transact(flush_all())
        if await self._read_one(statements.ANY_PENDING_REFUSALS_OF, {"operation_id": operation_id}) is None:
            return 0
        return await self._transact(flush_one(), lock=operation_id)

    # -- webhook wake-ups ------------------------------------------------------------------------------

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
        """A verified webhook for `provider`'s job `job_id`, in one transaction.

        Unknown job: nothing is stored (not even the event id). A seen `event_id` (within
        `remember_seconds`, pruned first): a replay, nothing changes. Otherwise the id is remembered
        and every waiting operation on the job that `plans.may_wake` allows is brought forward
        (`plans.wake_plan`, audited as `woken_by_webhook`), locked in id order. Nothing else changes.
        """
        job = {"provider": provider, "job_id": job_id}
        if await self._read_one(statements.KNOWS_JOB, job) is None:
            return WakeResult(WakeOutcome.UNKNOWN_JOB, ())

        def flow() -> Flow[WakeResult]:
            yield Queue(
                statements.PRUNE_WEBHOOK_EVENTS, {"provider": provider, "before": now - remember_seconds}
            )
            event = {"provider": provider, "event_id": event_id, "now": now}
            if (yield Query(statements.REMEMBER_WEBHOOK_EVENT, event)) is None:
                return WakeResult(WakeOutcome.REPLAYED, ())
            woken: list[str] = []
            rows: list[Row] = yield Query(statements.WAITING_ON_JOB, job, lock=True, every=True)
            for row in rows:
                current = stored(row)
                plan = plans.wake_plan(current.record, now=now, event_id=event_id, event_type=event_type)
                if plan is not None:
                    yield CarryOut(current, plan)
                    woken.append(current.record.operation_id)
            return WakeResult(WakeOutcome.WOKEN if woken else WakeOutcome.NOT_WOKEN, tuple(woken))

        return await self._transact(flow())

    # -- the approval policy and the audit's seals -----------------------------------------------------

    async def write_approval_policy(
        self, policy: ApprovalPolicy, *, at: float, by: str, only_raising_to_a_key: bool
    ) -> bool:
        """Store the approval policy; whether it was written.

        `only_raising_to_a_key`: only if the stored policy requires no operator key yet (one guarded
        statement: two servers raising it at once write it once, and never lower it).
        """
        params = {
            "require": policy.require_operator_key,
            "channels": ",".join(sorted(policy.channels)),
            "keys": policy.key_lines(),
            "at": at,
            "by": by,
            "only_raising": only_raising_to_a_key,
        }

        def flow() -> Flow[bool]:
            return (yield Query(statements.WRITE_APPROVAL_POLICY, params)) is not None

        return await self._transact(flow(), audit=False)

    async def seal(self, *, at: float) -> int:
        """Seal every operation's audit chain that moved since the last seal; how many were named.

        Only where operations' later rows form chains of their own (PostgreSQL,
        `pollwarden.audit.verify`); elsewhere every row is in the one chain: nothing to seal.
        """
        del at
        return 0
