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

from pollwarden.errors import StoreError
from pollwarden.files import prepare_database_file
from pollwarden.records import ApprovalRecord, CheckStart, FollowupRecord, OperationRecord, WakeResult
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.reads import Row, StoreReads
from pollwarden.store.sqlite import check_procedure, wakes, writes
from pollwarden.store.sqlite.connection import Database, EngineStats, connect
from pollwarden.vocabulary import ApprovalKind, ApprovalStatus, FollowupKind, FollowupStatus
from pollwarden_providers.table_limits import FleetSpec


class SQLiteStore(StoreReads):
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

    async def _read(self, statement: str, params: Mapping[str, object] | None = None) -> list[Row]:
        """One read statement in one hop, outside any transaction."""
        return await self._db.run(lambda s: s.conn.execute(statement, params or {}).fetchall())

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

    async def claim_submission(
        self, operation_id: str, *, owner: str, now: float, lease_seconds: float, allow_stale: bool, note: str
    ) -> OperationRecord | None:
        """Take the submission lease before the submit request is sent (None: not free)."""
        return await self._db.run(
            partial(
                writes.claim_submission,
                operation_id=operation_id,
                owner=owner,
                now=now,
                lease_seconds=lease_seconds,
                allow_stale=allow_stale,
                note=note,
                key=self._key,
            )
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
        return await self._db.run(
            partial(
                writes.apply_extension,
                operation_id=operation_id,
                bound_version=bound_version,
                changes=changes,
                at=at,
                approval_id=approval_id,
                payload_extra=payload_extra,
                key=self._key,
            )
        )

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
        return await self._db.run(
            partial(
                writes.record_followup,
                followup_id=followup_id,
                operation_id=operation_id,
                kind=FollowupKind(kind),
                status=FollowupStatus(status),
                at=at,
                approval_id=approval_id,
                http_status=http_status,
                answer=answer,
                note=note,
                operation_changes=operation_changes,
                expect_version=expect_version,
                key=self._key,
            )
        )

    async def audit_event(
        self, operation_id: str, *, kind: str, at: float, note: str | None, extra: Mapping[str, object]
    ) -> None:
        """Append one audit row about an operation."""
        await self._db.run(
            partial(
                writes.audit_event,
                operation_id=operation_id,
                kind=kind,
                at=at,
                note=note,
                extra=extra,
                key=self._key,
            )
        )

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
        return await self._db.run(
            partial(
                writes.reopen,
                operation_id=operation_id,
                bound_version=bound_version,
                next_check_at=next_check_at,
                at=at,
                extra=extra,
                key=self._key,
            )
        )

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

    async def seal(self, *, at: float) -> int:
        """Nothing to seal: every SQLite row is in the one chain (`pollwarden.audit_verify`)."""
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
