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
from abc import abstractmethod
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import ClassVar, TypeVar

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
from pollwarden.store import plans, statements
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.plans import Append, Plan
from pollwarden.store.reads import Row, StoreReads
from pollwarden.store.rows import StoredOperation, new_operation_values, stored
from pollwarden.store.transactions import (
    AboutTheChain,
    CarryOut,
    CheckCall,
    Flow,
    Locked,
    LockHead,
    LockPayload,
    Query,
    Queue,
    T,
    carry_out_on,
    flush_all,
    flush_one,
    must,
)
from pollwarden_providers.table_limits import FleetSpec

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


@dataclasses.dataclass
class EngineStats:
    """Counted, not guessed, since the store opened: round trips to the database (SQLite: hops to its
    thread), commits by durability (relaxed: a refusal's counter), rollbacks."""

    trips: int = 0
    durable_commits: int = 0
    relaxed_commits: int = 0
    rollbacks: int = 0


class Store(StoreReads):
    """One process's connection to the shared database, in domain terms: each method is one transaction.

    Every engine gives the same guarantees: the reservation is committed (durably) before the request
    leaves, anything that spends a budget or a fleet pace is guarded against every other process, the
    audit chain stays one chain, and times come from the caller's clock, never the database's.
    """

    location: DatabaseLocation  # where the database is
    stats: EngineStats  # the engine's counters

    @abstractmethod
    async def _transact(
        self, flow: Flow[T], *, lock: str | None = None, audit: bool = True, durable: bool = True
    ) -> T:
        """Run `flow` as one transaction, `lock`'s operation row locked first (`audit`: it appends to the
        audit chain); its result. Each engine defines it (its transaction mechanism)."""

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
        poll_schedules: Mapping[str, tuple[float, float]] | None = None,
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
        guarded and paced by is read again once the locks are held. `poll_schedules`: each
        provider's (base, longest) delay, so a request sent while a queue waits books its next slot
        only where its agent can use it (`fleet_pace.ahead_usable`).
        """
        call = CheckCall(
            operation_id,
            now,
            wait_until,
            owner,
            lease_seconds,
            fleets,
            apply_approvals,
            clock,
            accounts,
            needs_person,
            fleet_slots,
            poll_schedules,
        )
        return await self._begin_check(call)

    @abstractmethod
    async def _begin_check(self, call: CheckCall) -> CheckStart | None:
        """`begin_check` in this engine: its one-statement and locked paths (each engine defines it)."""

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
    ) -> tuple[FollowupRecord, bool]:
        """Record one follow-up (it was sent) and its audit row, and change the operation with it if it is
        still at `expect_version`; (the follow-up, whether `operation_changes` were applied)."""
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
        return followup, plan.applied

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
            before = yield Query(statements.APPROVAL_POLICY)
            if (yield Query(statements.WRITE_APPROVAL_POLICY, params)) is None:
                return False
            changed = plans.policy_change(before, policy, at=at, by=by)
            if changed is not None:  # an operator's decision: told in the one chain, by whom and how
                yield AboutTheChain(changed)
            return True

        return await self._transact(flow(), audit=False)  # the chain's head is locked only for a change

    async def seal(self, *, at: float) -> int:
        """Seal every operation's audit chain that moved since the last seal; how many were named.

        Only where operations' later rows form chains of their own (PostgreSQL,
        `pollwarden.audit.verify`); elsewhere every row is in the one chain: nothing to seal.
        """
        del at
        return 0
