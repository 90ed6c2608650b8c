"""The SQLite engine: the `Store` interface over one file shared by every server process.

Each method is one hop to the database thread (`Database.run`) that runs one
whole transaction there: see `checks` (the check procedure), `writes` (every
other change) and `queries` (the SQL). Reads run without a transaction (WAL
readers see the last commit and never wait for a writer).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio

from pollwarden.approval_policy import ApprovalPolicy
from pollwarden.audit import AuditRow
from pollwarden.errors import StoreError
from pollwarden.files import prepare_database_file
from pollwarden.records import ApprovalRecord, CheckStart, FollowupRecord, OperationRecord, WakeResult
from pollwarden.store.browse import MetricsSnapshot, OperationFacets, OperationFilter, OperationPage
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.sqlite import browse, checks, queries, rows, wakes, writes
from pollwarden.store.sqlite.connection import Database, EngineStats, Session, connect
from pollwarden.timefmt import iso
from pollwarden.vocabulary import ApprovalKind, ApprovalStatus, FollowupKind, FollowupStatus
from pollwarden_providers.table_limits import FleetSpec


class SQLiteStore:
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

    # -- reads ------------------------------------------------------------------------------

    async def get(self, operation_id: str) -> OperationRecord | None:
        """The current record, or None."""

        def work(s: Session) -> OperationRecord | None:
            found = rows.fetch(s.conn, operation_id)
            return None if found is None else found.record

        return await self._db.run(work)

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
        sql = queries.list_operations(
            *(name for name in ("status", "provider", "owner") if params[name] is not None)
        )

        def work(s: Session) -> list[OperationRecord]:
            return [rows.stored(row).record for row in s.conn.execute(sql, params).fetchall()]

        return await self._db.run(work)

    async def operations_of_fingerprint(self, fingerprint: str, *, limit: int = 20) -> list[OperationRecord]:
        """The operations recorded with this request fingerprint, newest first."""
        params = {"fingerprint": fingerprint, "limit": limit}

        def work(s: Session) -> list[OperationRecord]:
            found = s.conn.execute(queries.LIST_BY_FINGERPRINT, params).fetchall()
            return [rows.stored(row).record for row in found]

        return await self._db.run(work)

    async def count_operations(self) -> int:
        """How many operations the database holds."""

        def work(s: Session) -> int:
            row = s.conn.execute(queries.COUNT_OPERATIONS).fetchone()
            return int(row[0]) if row else 0

        return await self._db.run(work)

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        """One approval by id."""

        def work(s: Session) -> ApprovalRecord | None:
            row = s.conn.execute(queries.SELECT_APPROVAL, (approval_id,)).fetchone()
            return None if row is None else ApprovalRecord.from_row(row)

        return await self._db.run(work)

    async def list_approvals(
        self, *, status: str | None = None, operation_id: str | None = None
    ) -> list[ApprovalRecord]:
        """Approvals, newest first."""
        if operation_id is not None:
            sql = queries.LIST_APPROVALS_OF if status is None else queries.LIST_APPROVALS_OF_BY_STATUS
        else:
            sql = queries.LIST_APPROVALS if status is None else queries.LIST_APPROVALS_BY_STATUS
        params = {"status": status, "operation_id": operation_id}

        def work(s: Session) -> list[ApprovalRecord]:
            return [ApprovalRecord.from_row(row) for row in s.conn.execute(sql, params).fetchall()]

        return await self._db.run(work)

    async def list_followups(self, operation_id: str) -> list[FollowupRecord]:
        """The follow-ups of one operation, oldest first."""

        def work(s: Session) -> list[FollowupRecord]:
            found = s.conn.execute(queries.LIST_FOLLOWUPS, (operation_id,)).fetchall()
            return [FollowupRecord.from_row(row) for row in found]

        return await self._db.run(work)

    # -- reads for a person looking at everything (the console; see `pollwarden.store.browse`) ---

    async def operations_page(self, filters: OperationFilter, *, page: int, page_size: int) -> OperationPage:
        """One page of the operations matching `filters`, newest first, and how many match."""
        return await self._db.run(lambda s: browse.operations_page(s.conn, filters, max(1, page), page_size))

    async def operation_facets(self) -> OperationFacets:
        """Every provider, stop reason and owner some operation has (to filter by)."""
        return await self._db.run(lambda s: browse.facets(s.conn))

    async def audit_rows(self, operation_id: str) -> list[AuditRow]:
        """One operation's audit rows in chain order (its story and timeline)."""
        return await self._db.run(lambda s: browse.audit_rows(s.conn, operation_id))

    async def polled_times(self, providers: Sequence[str], *, since: float) -> dict[str, list[float]]:
        """When each status request of `providers` was answered since `since` (epoch s), per provider."""
        at = iso(since) or ""
        return await self._db.run(lambda s: browse.polled_times(s.conn, providers, at))

    async def not_ready(self) -> str | None:
        """Why the database cannot serve now (gone, replaced, schema dropped or behind), or None: ready."""
        try:
            return await self._db.run(browse.not_ready)
        except StoreError as exc:
            return str(exc)

    async def database_time(self) -> float | None:
        """The database server's clock (epoch s) for `pollwarden doctor`'s skew check; None: this machine's."""
        return None  # the file is on this machine: its clock is this clock

    async def metrics_snapshot(self, *, now: float, principals: bool = False) -> MetricsSnapshot:
        """What a metrics scrape reads (`pollwarden.metrics`): aggregates over every process's work."""
        return await self._db.run(lambda s: browse.metrics_snapshot(s.conn, now, principals))

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
                checks.begin_check,
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

    async def principal_usage(self, owner: str, *, since: float) -> tuple[int, int]:
        """(active operations, operations created after `since`) of one principal."""

        def work(s: Session) -> tuple[int, int]:
            active = s.conn.execute(queries.COUNT_ACTIVE_OF_OWNER, (owner,)).fetchone()
            started = s.conn.execute(queries.COUNT_CREATED_SINCE_BY_OWNER, (owner, since)).fetchone()
            return int(active[0]), int(started[0])

        return await self._db.run(work)

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
                checks.apply_answer,
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

    async def approval_policy(self) -> ApprovalPolicy:
        """The database's approval policy (`pollwarden.approval_policy`)."""

        def work(s: Session) -> ApprovalPolicy:
            row = s.conn.execute(queries.APPROVAL_POLICY).fetchone()
            return ApprovalPolicy() if row is None else ApprovalPolicy.stored(bool(row[0]), row[1], row[2])

        return await self._db.run(work)

    async def write_approval_policy(
        self, policy: ApprovalPolicy, *, at: float, by: str, only_raising_to_a_key: bool
    ) -> bool:
        """Store the approval policy (guarded, one statement); whether it was written."""
        params = (
            int(policy.require_operator_key),
            ",".join(sorted(policy.channels)),
            policy.key_lines(),
            at,
            by,
            int(only_raising_to_a_key),
        )

        def work(s: Session) -> bool:
            with s.transaction() as conn:
                return conn.execute(queries.WRITE_APPROVAL_POLICY, params).rowcount == 1

        return await self._db.run(work)

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
