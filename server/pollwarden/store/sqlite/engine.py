"""The SQLite engine: the `Store` interface over one file shared by every server process.

Each method is one hop to the database thread (`Database.run`) that runs one
whole transaction there: see `check_procedure`, `writes` (every other change)
and `wakes`; each reads what its plan (`pollwarden.store.plans`) needs and
`executor` carries the plan out. Reads (`pollwarden.store.reads`) run without
a transaction (WAL readers see the last commit and never wait for a writer).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio

from pollwarden.access.approval_policy import ApprovalPolicy
from pollwarden.core.errors import StoreError
from pollwarden.core.files import prepare_database_file
from pollwarden.core.records import ApprovalRecord, CheckStart, OperationRecord, WakeResult
from pollwarden.core.vocabulary import ApprovalKind, ApprovalStatus
from pollwarden.store import statements
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.migrations.sqlite import LATEST, schema_version
from pollwarden.store.planned import PlannedWrites, approval_policy_params
from pollwarden.store.plans import Plan
from pollwarden.store.reads import Row
from pollwarden.store.sqlite import check_procedure, executor, wakes, writes
from pollwarden.store.sqlite.connection import Database, EngineStats, Session, connect
from pollwarden_providers.table_limits import FleetSpec


class SQLiteStore(PlannedWrites):
    """One process's store on a SQLite file (implements `pollwarden.store.Store`)."""

    def __init__(self, db: Database, location: DatabaseLocation, audit_key: bytes | None) -> None:
        self._db = db
        self._key = audit_key
        self.location = location

    @property
    def path(self) -> Path:
        """The SQLite file (the offline audit readers open it read-only)."""
        return self._db.path

    @property
    def stats(self) -> EngineStats:
        """Hops to the database thread and commits by durability, since the store opened."""
        return self._db.stats

    async def _carry_out_on(self, operation_id: str, plan_of: Callable[[OperationRecord], Plan]) -> Plan:
        """One transaction in one hop, under the write lock: `plan_of` the row as read, carried out."""

        def work(s: Session) -> Plan:
            with s.transaction() as conn:
                current = executor.must_fetch(conn, operation_id)
                plan = plan_of(current.record)
                executor.carry_out(conn, current, plan, self._key)
                return plan

        return await self._db.run(work)

    async def _read(self, statement: str, params: Mapping[str, object] | None = None) -> list[Row]:
        """One read statement in one hop, outside any transaction."""
        return await self._db.run(lambda s: s.conn.execute(statement, params or {}).fetchall())

    async def not_ready(self) -> str | None:
        """Why the database cannot serve now (gone, replaced, schema dropped or behind), or None: ready."""

        def work(s: Session) -> str | None:
            s.db.check_identity()
            version = schema_version(s.conn)
            if version < LATEST:
                return f"the database is at schema step {version}, this pollwarden needs {LATEST}: restart to migrate"
            s.conn.execute("SELECT 1 FROM operations LIMIT 1").fetchall()
            return None

        try:
            return await self._db.run(work)
        except StoreError as exc:
            return str(exc)

    async def database_time(self) -> float | None:
        """The database server's clock (epoch s) for `pollwarden doctor`'s skew check; None: this machine's."""
        return None  # the file is on this machine: its clock is this clock

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
        """Decide one round of check_status and write it, in one transaction (None: no such operation)."""
        return await self._db.run(
            partial(
                check_procedure.begin_check,
                needs_person=needs_person,
                operation_id=operation_id,
                now=now,
                wait_until=wait_until,
                owner=owner,
                lease_seconds=lease_seconds,
                fleets=fleets,
                apply_approvals=apply_approvals,
                key=self._key,
                clock=clock,
                accounts=accounts,
                fleet_slots=fleet_slots,
            )
        )

    async def apply_answer(
        self,
        operation_id: str,
        *,
        owner: str,
        changes: Mapping[str, object],
        at: float,
        payload_extra: Mapping[str, object],
    ) -> tuple[OperationRecord, bool]:
        """Persist what one status answer meant and release the lease; (record, applied)."""
        return await self._db.run(
            partial(
                check_procedure.apply_answer,
                operation_id=operation_id,
                owner=owner,
                changes=changes,
                at=at,
                payload_extra=payload_extra,
                key=self._key,
            )
        )

    # -- creating and submitting ---------------------------------------------------------------

    async def create_operation(
        self, values: Mapping[str, object], *, kind: str, at: float
    ) -> tuple[OperationRecord, bool]:
        """Insert the record (and its first audit row) unless the id exists; (record, created)."""
        return await self._db.run(
            partial(writes.create_operation, values=values, kind=kind, at=at, key=self._key)
        )

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
        """Record what a submission led to; with `owner`, release its lease (None: the guard did not hold)."""
        return await self._db.run(
            partial(
                writes.finish_submission,
                operation_id=operation_id,
                owner=owner,
                changes=changes,
                kind=kind,
                at=at,
                note=note,
                payload_extra=payload_extra,
                key=self._key,
            )
        )

    # -- extensions and approvals ---------------------------------------------------------------

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
        return await self._db.run(
            partial(
                writes.open_approval,
                approval_id=approval_id,
                record=record,
                kind=ApprovalKind(kind),
                request=request,
                at=at,
                ttl_seconds=ttl_seconds,
                key=self._key,
            )
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
        """A person's answer to a pending approval (pending → approved/denied; expired when late)."""
        return await self._db.run(
            partial(
                writes.decide_approval,
                approval_id=approval_id,
                approve=approve,
                by=by,
                at=at,
                method=method,
                signature=signature,
                key=self._key,
            )
        )

    async def close_approval(
        self, approval_id: str, *, status: str, at: float, note: str, audit_kind: str | None = None
    ) -> ApprovalRecord | None:
        """Mark an approval applied, void or expired; with `audit_kind`, tell it in the operation's story.

        None when it was no longer in a status it may be closed from (another call got there first).
        """
        return await self._db.run(
            partial(
                writes.close_approval,
                approval_id=approval_id,
                status=ApprovalStatus(status),
                at=at,
                note=note,
                audit_kind=audit_kind,
                key=self._key,
            )
        )

    # -- follow-ups and the audit ------------------------------------------------------------------

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
        """Remember a verified webhook's id and bring the job's waiting operations forward (one transaction)."""
        return await self._db.run(
            partial(
                wakes.wake,
                provider=provider,
                job_id=job_id,
                event_id=event_id,
                event_type=event_type,
                now=now,
                remember_seconds=remember_seconds,
                key=self._key,
            )
        )

    async def flush_refusals(self, operation_id: str | None = None) -> int:
        """Write pending summaries of refused calls (one operation's, or all); how many were written."""
        return await self._db.run(partial(writes.flush_refusals, operation_id=operation_id, key=self._key))

    async def write_approval_policy(
        self, policy: ApprovalPolicy, *, at: float, by: str, only_raising_to_a_key: bool
    ) -> bool:
        """Store the approval policy (guarded, one statement); whether it was written."""
        params = approval_policy_params(policy, at=at, by=by, only_raising_to_a_key=only_raising_to_a_key)

        def work(s: Session) -> bool:
            with s.transaction() as conn:
                return conn.execute(statements.WRITE_APPROVAL_POLICY, params).fetchone() is not None

        return await self._db.run(work)

    async def seal(self, *, at: float) -> int:
        """Nothing to seal: every SQLite row is in the one chain (`pollwarden.audit.verify`)."""
        del at
        return 0


@asynccontextmanager
async def open_sqlite(
    location: DatabaseLocation, *, audit_key: bytes | None, busy_timeout: float
) -> AsyncGenerator[SQLiteStore]:
    """Open (creating and migrating) the file; on the way out, write pending refusals and close it."""
    path = location.path
    if not path.parent.exists():
        raise StoreError(
            f"the directory {path.parent} for the database does not exist; create it, or point --db / "
            "POLLWARDEN_DB at a writable location"
        )
    prepare_database_file(path)  # private (0600), never another user's or group-writable (files.py)
    db = await anyio.to_thread.run_sync(connect, path, busy_timeout)
    store = SQLiteStore(db, location, audit_key)
    try:
        yield store
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await store.flush_refusals()
            except StoreError:
                pass  # locked, read-only or replaced: the counters stay in the row for the next reader
            finally:
                await db.run(lambda s: s.db.close())
