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

The audit (`pollwarden.audit.verify`): an operation's first row joins the one
chain, whose head row its transaction locks; every later row follows that
operation's own last row, recorded on the operation's row, so answers to
different operations never wait for one another. Every time written comes
from the caller's clock.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager

import anyio

from pollwarden.access.approval_policy import ApprovalPolicy
from pollwarden.audit.chain import REKEY_OPERATION, SEAL_KIND
from pollwarden.audit.entry import (
    NO_REFUSALS,
    AuditEvent,
    OperationChain,
    unlinked,
)
from pollwarden.core.errors import StoreError
from pollwarden.core.records import (
    OperationRecord,
    WakeOutcome,
    WakeResult,
    new_record,
)
from pollwarden.core.vocabulary import (
    Status,
)
from pollwarden.store import plans, statements
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.migrations.postgres import LATEST, migrate
from pollwarden.store.planned import approval_policy_params
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.check_procedure import CheckProcedure
from pollwarden.store.postgres.connection import Pool
from pollwarden.store.postgres.decisions import Decisions
from pollwarden.store.postgres.executor import Writer, operation, seal_entries
from pollwarden.store.rows import StoredOperation, new_operation_values, stored

# Connections per process: concurrent tool calls of one HTTP instance each borrow one.
POOL_SIZE = 10
# Operations named by one seal row at most: a seal holds the audit head, which every start waits for.
SEAL_BATCH = 1000


class PostgresStore(CheckProcedure, Decisions):
    """One process's store on a PostgreSQL database (implements `pollwarden.store.Store`).

    The check procedure is `check_procedure`'s, what people decide `decisions`'; the reads,
    creating and submitting, webhook wake-ups, seals and refusal summaries are here.
    """

    # -- reads (one statement, no transaction) ------------------------------------------------------

    async def get(self, operation_id: str) -> OperationRecord | None:
        """The current record, or None."""
        row = await self._pool.read_one(statements.SELECT_OPERATION, {"operation_id": operation_id})
        if row is None:
            return None
        current = stored(row)
        self._remember(current)
        return current.record

    # -- the check procedure ------------------------------------------------------------------

    async def create_operation(
        self, values: Mapping[str, object], *, kind: str, at: float
    ) -> tuple[OperationRecord, bool]:
        """Insert the record and its first audit row unless the id or the job exists; (record, created).

        Guarantee: one job, one budget across processes — the INSERT does nothing
        when the id or the job (the partial UNIQUE index) is taken, waiting for a
        concurrent insert of either to commit; then the operation holding the id,
        else the job's holder, is returned (pollwarden.rules.job_identity). A submission
        first takes its payload's advisory lock and, unless its id exists, is
        answered with the payload's operation still in flight if there is one.
        """
        values = new_operation_values(values)
        operation_id = str(values["operation_id"])
        if self._key is None and values["submit_payload_json"] is None:
            opened = await self._open_in_one_statement(values, kind=kind, at=at)
            if opened is not None:
                self._remember(opened)  # committed: its first check needs no read
                return opened.record, True
        async with self._locked(audit=False) as (writer, tx, _):
            if values["submit_payload_json"] is not None:
                payload = {"request_fingerprint": values["request_fingerprint"]}
                await tx.queue(sql.LOCK_PAYLOAD, payload)
                same_id = await tx.queue(statements.SELECT_OPERATION, {"operation_id": operation_id})
                in_flight = await tx.one(
                    statements.SELECT_PAYLOAD_IN_FLIGHT, {**payload, "owner": values["owner"]}
                )
                if in_flight is not None and await tx.read(same_id) is None:
                    return stored(in_flight).record, False
            # Its first row is a row of the one chain: the head is locked before the row is inserted, as
            # in the one-statement start (so two starts of one job never wait for each other crosswise).
            await writer.head_first(lock=True)
            inserted = await tx.queue(sql.INSERT_OPERATION, dict(values))
            row = await tx.read(inserted)
            if row is None:
                existing = await tx.one(statements.SELECT_OPERATION, {"operation_id": operation_id})
                if existing is None and values["provider_job_id"] is not None:
                    job = {k: values[k] for k in ("provider", "account_context", "provider_job_id", "owner")}
                    existing = await tx.one(statements.SELECT_JOB_OWNER, job)
                return operation(existing, operation_id).record, False
            created = stored(row).record
            await writer.append(
                plans.opening_event(created, kind, at),
                on=StoredOperation(created, NO_REFUSALS, OperationChain(0, "")),
            )
            await writer.finish()
            opened = StoredOperation(created, NO_REFUSALS, writer.chain_of(operation_id))
        self._remember(opened)  # committed: its first check needs no read
        return created, True

    async def _open_in_one_statement(
        self, values: Mapping[str, object], *, kind: str, at: float
    ) -> StoredOperation | None:
        """A start that submits nothing, on an unkeyed chain, in one trip (`sql.OPEN_OPERATION`).

        Its first audit row is written from the record the INSERT makes (`records.new_record`), so
        the row and its audit say the same. None: nothing was inserted (the id or the job is taken,
        or the chain is keyed); the caller goes the locked way, which answers with what holds them.
        """
        record = new_record(values)
        first = unlinked(plans.opening_event(record, kind, at))
        async with self._pool.transaction() as tx:
            cursor = await tx.queue(sql.OPEN_OPERATION, {**values, **vars(first)})
        row = await cursor.fetchone()
        return None if row is None else stored(row)

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
            holder = None
            job_id = changes.get("provider_job_id")
            if job_id is not None and record.status == Status.SUBMITTING:
                job = {
                    "provider": record.provider,
                    "account_context": record.account_context,
                    "owner": record.owner,
                }
                found = await tx.one(statements.SELECT_JOB_OWNER, {**job, "provider_job_id": job_id})
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
            record = await writer.carry_out(current, plan)
            return record if plan.applied else None

    # -- extensions and approvals ---------------------------------------------------------------

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
        if await self._pool.read_one(statements.KNOWS_JOB, job) is None:
            return WakeResult(WakeOutcome.UNKNOWN_JOB, ())
        async with self._locked() as (writer, tx, _):
            await tx.queue(
                statements.PRUNE_WEBHOOK_EVENTS, {"provider": provider, "before": now - remember_seconds}
            )
            remembered = await tx.one(
                statements.REMEMBER_WEBHOOK_EVENT, {"provider": provider, "event_id": event_id, "now": now}
            )
            if remembered is None:
                return WakeResult(WakeOutcome.REPLAYED, ())
            woken: list[str] = []
            for row in await tx.all(sql.LOCK_WAITING_ON_JOB, job):
                current = stored(row)
                plan = plans.wake_plan(current.record, now=now, event_id=event_id, event_type=event_type)
                if plan is not None:
                    self._forget(current.record.operation_id)
                    await writer.carry_out(current, plan)
                    woken.append(current.record.operation_id)
            return WakeResult(WakeOutcome.WOKEN if woken else WakeOutcome.NOT_WOKEN, tuple(woken))

    async def write_approval_policy(
        self, policy: ApprovalPolicy, *, at: float, by: str, only_raising_to_a_key: bool
    ) -> bool:
        """Store the approval policy (guarded, one statement); whether it was written."""
        params = approval_policy_params(policy, at=at, by=by, only_raising_to_a_key=only_raising_to_a_key)
        return await self._pool.write_one(sql.WRITE_APPROVAL_POLICY, params) is not None

    async def not_ready(self) -> str | None:
        """Why the database cannot serve now (unreachable, schema dropped or behind), or None: ready."""
        try:
            row = await self._pool.read_one("SELECT coalesce(max(version), 0) FROM pollwarden_schema")
            await self._pool.read("SELECT 1 FROM operations LIMIT 1")
        except StoreError as exc:
            return str(exc)
        version = 0 if row is None else int(row[0])
        if version < LATEST:
            return f"the database is at schema step {version}, this pollwarden needs {LATEST}: restart to migrate"
        return None

    async def database_time(self) -> float | None:
        """The database server's clock (epoch s) for `pollwarden doctor`'s skew check."""
        row = await self._pool.read_one("SELECT extract(epoch FROM clock_timestamp())")
        return None if row is None else float(str(row[0]))

    async def seal(self, *, at: float, batch: int = SEAL_BATCH) -> int:
        """Seal every operation's audit chain that moved since the last seal; how many were named.

        Chain rows (`audit.SEAL_KIND`) name each such operation with its chain's row count and last
        hash (`pollwarden.audit.verify`): from then on, rows deleted from the end of any of those
        chains are caught. Nothing is written when no chain moved. Each row names at most `batch`
        operations, in id order, and is its own transaction: the head is locked first, then those
        operations' rows. One pass over the ids: an operation that moves again meanwhile waits for
        the next seal.
        """
        named, after = 0, ""
        while True:
            async with self._pool.transaction() as tx:
                writer = Writer(tx, self._key)
                await writer.head_first(lock=True)
                moved = seal_entries(await tx.all(sql.SEAL_OPERATIONS, {"after": after, "batch": batch}))
                if not moved:
                    return named
                payload = {
                    "decision": SEAL_KIND,
                    "note": f"sealed the audit chains of {len(moved)} operations",
                    "operations": moved,
                }
                await writer.append_to_chain(AuditEvent(REKEY_OPERATION, at, SEAL_KIND, payload))
                await writer.finish()
            named += len(moved)
            if len(moved) < batch:
                return named
            after = str(moved[-1][0])  # seal_entries sorts by id

    async def flush_refusals(self, operation_id: str | None = None) -> int:
        """Write pending summaries of refused calls (one operation's, or all); how many were written."""
        if operation_id is None:
            if await self._pool.read_one(statements.ANY_PENDING_REFUSALS) is None:
                return 0
            async with self._locked() as (writer, tx, _):
                written = 0
                for row in await tx.all(sql.LOCK_PENDING_REFUSALS):
                    self._forget(stored(row).record.operation_id)
                    # A row another flush emptied while this one waited for its lock writes nothing.
                    written += 1 if await writer.flush(stored(row)) else 0
                return written
        if (
            await self._pool.read_one(statements.ANY_PENDING_REFUSALS_OF, {"operation_id": operation_id})
            is None
        ):
            return 0
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            return 1 if await writer.flush(current) else 0


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
