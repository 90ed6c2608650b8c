"""The store: what the controller asks of a database, in the controller's terms.

`Store` is the whole interface: each method is one transaction on the engine
(reserve a request, apply an answer, count a refusal, stop, create, approve,
append to the audit), returning the record it wrote. An engine implements it
with the same guarantees: the reservation is committed (durably) before the
request leaves, anything that spends a budget or a fleet pace is guarded
against every other process, the audit chain stays one chain, and times come
from the caller's clock, never the database's. `open_store` picks the engine
from the database location: SQLite (`store/sqlite/`, the embedded default) or
PostgreSQL (`store/postgres/`, the optional extra ``pollwarden[postgres]``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

from pollwarden.access.approval_policy import ApprovalPolicy
from pollwarden.audit.chain import AuditRow
from pollwarden.core.errors import StoreError
from pollwarden.core.records import ApprovalRecord, CheckStart, FollowupRecord, OperationRecord, WakeResult
from pollwarden.store.browse import MetricsSnapshot, OperationFacets, OperationFilter, OperationPage
from pollwarden.store.location import DatabaseLocation, Engine
from pollwarden.store.sqlite.engine import open_sqlite
from pollwarden_providers.table_limits import FleetSpec

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_SECONDS",
    "DatabaseLocation",
    "Engine",
    "MetricsSnapshot",
    "OperationFacets",
    "OperationFilter",
    "OperationPage",
    "Store",
    "new_lease_owner",
    "open_store",
]

# How long a write waits for another process's lock before giving up with a clear error.
DEFAULT_BUSY_TIMEOUT_SECONDS = 5.0


def new_lease_owner() -> str:
    """A lease owner id for one call: this process's id (for a person reading the row) and a random part."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


class Store(Protocol):
    """One process's connection to the shared database, in domain terms."""

    @property
    def location(self) -> DatabaseLocation:
        """Where the database is."""
        ...

    # -- reads (no transaction) ----------------------------------------------------------------

    async def get(self, operation_id: str) -> OperationRecord | None:
        """The current record, or None."""
        ...

    async def list_operations(
        self,
        *,
        status: str | None = None,
        provider: str | None = None,
        limit: int = 50,
        owner: str | None = None,
    ) -> list[OperationRecord]:
        """Most recent operations first (only `owner`'s when given)."""
        ...

    async def operations_of_fingerprint(self, fingerprint: str, *, limit: int = 20) -> list[OperationRecord]:
        """The operations recorded with this request fingerprint (one payload, one account), newest first."""
        ...

    async def count_operations(self) -> int:
        """How many operations the database holds."""
        ...

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        """One approval by id."""
        ...

    async def list_approvals(
        self, *, status: str | None = None, operation_id: str | None = None
    ) -> list[ApprovalRecord]:
        """Approvals, newest first."""
        ...

    async def list_followups(self, operation_id: str) -> list[FollowupRecord]:
        """The follow-ups of one operation, oldest first."""
        ...

    # -- reads for a person looking at everything (the operator console; `pollwarden.store.browse`) --

    async def operations_page(self, filters: OperationFilter, *, page: int, page_size: int) -> OperationPage:
        """One page (from 1) of the operations matching `filters`, newest first, and how many match."""
        ...

    async def operation_facets(self) -> OperationFacets:
        """Every provider, stop reason and owner some operation has (to filter by)."""
        ...

    async def audit_rows(self, operation_id: str) -> list[AuditRow]:
        """One operation's audit rows in chain order (its story and timeline)."""
        ...

    async def polled_times(self, providers: Sequence[str], *, since: float) -> dict[str, list[float]]:
        """When each status request of `providers` was answered since `since` (epoch s), per provider.

        Found without scanning the whole chain (a binary search on seq for where the window starts).
        """
        ...

    async def not_ready(self) -> str | None:
        """Why the database cannot serve now (gone, replaced, schema dropped or behind), or None: ready (/readyz)."""
        ...

    async def database_time(self) -> float | None:
        """The database server's clock (epoch s) for `pollwarden doctor`'s skew check; None: this machine's."""
        ...

    async def metrics_snapshot(self, *, now: float, principals: bool = False) -> MetricsSnapshot:
        """Aggregates for a metrics scrape: operations by status, pending approvals, overdue checks, per provider.

        `principals`: also operations per owner and status (only when the operator enables it).
        """
        ...

    # -- the check procedure ---------------------------------------------------------------------

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

        `needs_person`: providers whose every status request a person approves, and none approved
        this call: where a request would go out, the gate answers NEEDS_PERSON and nothing is written.

        Loads the operation, lets `pollwarden.rules.gate.decide_check` decide, and
        writes that: a counted refusal (not_yet, stopped), a stop before any
        request (deadline, budget), or the reservation (the request counted and
        the lease taken, or a fleet slot booked), guarded by the same conditions.
        `fleets` holds the loaded provider tables' [fleet] specs (None without one);
        `accounts` their account contexts now (a waiting operation recorded under
        another one stops with `account_context_changed`, nothing sent).
        `fleet_slots`: while a pace is used up, at most this many booked slots per principal
        (issue 19's fair shares; the principal's other checks wait for the earliest of them).
        """
        ...

    async def principal_usage(self, owner: str, *, since: float) -> tuple[int, int]:
        """(active operations, operations created after `since`) of one principal."""
        ...

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

        `changes` maps `OperationRecord` fields to their new values.
        """
        ...

    # -- creating and submitting -------------------------------------------------------------

    async def create_operation(
        self, values: Mapping[str, object], *, kind: str, at: float
    ) -> tuple[OperationRecord, bool]:
        """Insert the record (and its first audit row) unless the id or the job exists; (record, created).

        One job, one budget (`pollwarden.rules.job_identity`): when the job (provider,
        account context, provider job id) already has an operation, that one is
        returned, with an `operation_id` other than the one asked for. Atomic
        across processes: two starts of one job make one operation.
        """
        ...

    async def claim_submission(
        self, operation_id: str, *, owner: str, now: float, lease_seconds: float, allow_stale: bool, note: str
    ) -> OperationRecord | None:
        """Take the submission lease before the submit request is sent (None: not free)."""
        ...

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
        ...

    # -- extensions and approvals ----------------------------------------------------------------

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
        ...

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
        ...

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
        ...

    async def close_approval(
        self, approval_id: str, *, status: str, at: float, note: str, audit_kind: str | None = None
    ) -> ApprovalRecord | None:
        """Mark an approval applied, void or expired; with `audit_kind`, tell it in the operation's story.

        Guarded: None (and nothing written) when it is no longer in a status it may be closed from —
        an applied one is never voided, a decided one never expired.
        """
        ...

    # -- follow-ups and the audit ---------------------------------------------------------------

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
        ...

    async def audit_event(
        self, operation_id: str, *, kind: str, at: float, note: str | None, extra: Mapping[str, object]
    ) -> None:
        """Append one audit row about an operation."""
        ...

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

        Back to waiting with the same budget, deadline and counters, only while
        it is still at `bound_version` (as shown to the operator); audited as
        `reopened` with `extra` (reason, who, how authenticated). None: it changed.
        """
        ...

    # -- webhook wake-ups ----------------------------------------------------------------------

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

        Unknown job: nothing is stored. A seen `event_id` (within `remember_seconds`):
        a replay, nothing changes. Otherwise the id is remembered and every operation
        on the job that is waiting, not on a booked fleet slot, not in flight and before
        its deadline gets `next_check_at` = now, or its `not_before_at` if later
        (`pollwarden.rules.schedule.not_before`), when that is earlier than planned (audited
        as `woken_by_webhook`). Nothing else ever changes.
        """
        ...

    async def flush_refusals(self, operation_id: str | None = None) -> int:
        """Write the pending summaries of refused calls (one operation's, or every one's); how many.

        Called before the story is read and when the store closes, so a looping
        agent shows up in the audit even on an operation that never changes again.
        """
        ...

    async def approval_policy(self) -> ApprovalPolicy:
        """The database's approval policy (`pollwarden.access.approval_policy`): the one row every process reads."""
        ...

    async def write_approval_policy(
        self, policy: ApprovalPolicy, *, at: float, by: str, only_raising_to_a_key: bool
    ) -> bool:
        """Store the approval policy; whether it was written.

        `only_raising_to_a_key`: only if the stored policy requires no operator key yet (one guarded
        statement: two servers raising it at once write it once, and never lower it).
        """
        ...

    async def seal(self, *, at: float) -> int:
        """Seal every operation's audit chain that moved since the last seal; how many were named.

        Only where operations' later rows form chains of their own (PostgreSQL,
        `pollwarden.audit.verify`): from the seal on, rows deleted from the end of
        those chains are caught. A server seals periodically; `audit anchor` seals first.
        """
        ...


@asynccontextmanager
async def open_store(
    location: DatabaseLocation | Path | str,
    *,
    audit_key: bytes | None = None,
    busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
) -> AsyncGenerator[Store]:
    """Open (creating and migrating) the database at `location`: a path, a URL, or a `DatabaseLocation`."""
    where = location if isinstance(location, DatabaseLocation) else DatabaseLocation.parse(location)
    if where.engine == Engine.POSTGRES:
        try:
            from pollwarden.store.postgres.engine import open_postgres
        except ImportError as exc:
            raise StoreError(
                f"{where} is a PostgreSQL database, but the PostgreSQL driver is not installed ({exc.name}); "
                "install the extra; from a clone: .venv/bin/pip install -e '.[postgres]' (or pip install 'pollwarden[postgres]')"
            ) from None
        async with open_postgres(where, audit_key=audit_key, busy_timeout=busy_timeout_seconds) as pg:
            yield pg
        return
    async with open_sqlite(where, audit_key=audit_key, busy_timeout=busy_timeout_seconds) as store:
        yield store
