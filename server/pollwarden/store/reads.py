"""The store's reads, written once for both engines: each one statement (or a few) outside a transaction.

`StoreReads` implements the read half of `pollwarden.store.Store` over one
method an engine provides, `_read` (a statement of `store.statements` and its
named parameters; its rows). SQLite runs each in one hop to its database
thread (a WAL reader sees the last commit and never waits for a writer);
PostgreSQL as one autocommit statement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pollwarden.access.approval_policy import ApprovalPolicy
from pollwarden.audit.chain import AuditRow, audit_row, audit_rows_sql
from pollwarden.core.records import ApprovalRecord, FollowupRecord, OperationRecord
from pollwarden.core.timefmt import iso
from pollwarden.store import browse, statements
from pollwarden.store.browse import MetricsSnapshot, OperationFacets, OperationFilter, OperationPage
from pollwarden.store.rows import stored

Row = tuple[Any, ...]


class StoreReads(ABC):
    """The reads of `pollwarden.store.Store`, over an engine's `_read`."""

    # The engine keeps per-operation audit chains (PostgreSQL: `pollwarden.audit.verify`).
    per_operation_chains: ClassVar[bool] = False
    # A collation that compares the fixed-width RFC 3339 `audit.at` text byte by byte, where the
    # engine's default may not.
    byte_order: ClassVar[str] = ""
    # How the follow-ups of one operation keep their insertion order among equal times.
    followup_order: ClassVar[str] = "rowid"
    # The engine's function of (text, part): where part occurs in text (0: nowhere), case-sensitive.
    contains: ClassVar[str] = "instr"
    # The engine's read of a summary audit row's payload count (a metrics scrape).
    payload_count: ClassVar[str] = "json_extract(a.payload, '$.count')"

    @abstractmethod
    async def _read(self, statement: str, params: Mapping[str, object] | None = None) -> list[Row]:
        """Run one read statement (named parameters); its rows. Each engine defines it (its one read hop)."""

    async def _read_one(self, statement: str, params: Mapping[str, object] | None = None) -> Row | None:
        found = await self._read(statement, params)
        return found[0] if found else None

    async def get(self, operation_id: str) -> OperationRecord | None:
        """The current record, or None."""
        row = await self._read_one(statements.SELECT_OPERATION, {"operation_id": operation_id})
        return None if row is None else stored(row).record

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
        given = (name for name in ("status", "provider", "owner") if params[name] is not None)
        return [stored(row).record for row in await self._read(statements.list_operations(*given), params)]

    async def operations_of_fingerprint(self, fingerprint: str, *, limit: int = 20) -> list[OperationRecord]:
        """The operations recorded with this request fingerprint, newest first."""
        found = await self._read(statements.LIST_BY_FINGERPRINT, {"fingerprint": fingerprint, "limit": limit})
        return [stored(row).record for row in found]

    async def count_operations(self) -> int:
        """How many operations the database holds."""
        row = await self._read_one(statements.COUNT_OPERATIONS)
        return 0 if row is None else int(row[0])

    async def principal_usage(self, owner: str, *, since: float) -> tuple[int, int]:
        """(active operations, operations created after `since`) of one principal."""
        active = await self._read_one(statements.COUNT_ACTIVE_OF_OWNER, {"owner": owner})
        started = await self._read_one(
            statements.COUNT_CREATED_SINCE_BY_OWNER, {"owner": owner, "since": since}
        )
        return (0 if active is None else int(active[0])), (0 if started is None else int(started[0]))

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        """One approval by id."""
        row = await self._read_one(statements.SELECT_APPROVAL, {"approval_id": approval_id})
        return None if row is None else ApprovalRecord.from_row(row)

    async def list_approvals(
        self, *, status: str | None = None, operation_id: str | None = None
    ) -> list[ApprovalRecord]:
        """Approvals, newest first."""
        if operation_id is not None:
            query = statements.LIST_APPROVALS_OF if status is None else statements.LIST_APPROVALS_OF_BY_STATUS
        else:
            query = statements.LIST_APPROVALS if status is None else statements.LIST_APPROVALS_BY_STATUS
        found = await self._read(query, {"status": status, "operation_id": operation_id})
        return [ApprovalRecord.from_row(row) for row in found]

    async def list_followups(self, operation_id: str) -> list[FollowupRecord]:
        """The follow-ups of one operation, oldest first."""
        query = (
            f"SELECT {statements.FOLLOWUP_ROW} FROM followups WHERE operation_id = :operation_id "
            f"ORDER BY requested_at, {self.followup_order}"
        )
        return [
            FollowupRecord.from_row(row) for row in await self._read(query, {"operation_id": operation_id})
        ]

    # -- reads for a person looking at everything (the console; see `pollwarden.store.browse`) ---

    async def operations_page(self, filters: OperationFilter, *, page: int, page_size: int) -> OperationPage:
        """One page (from 1; past the end: the last) of the operations matching `filters`, newest first,
        how many match, and how many match each status."""
        params = browse.filter_params(filters)
        counted = await self._read_one(browse.count_sql(filters, self.contains), params)
        counts = await self._read(browse.status_counts_sql(filters, self.contains), params)
        total = 0 if counted is None else int(counted[0])
        page = browse.clamp_page(page, total, page_size)
        paged = {**params, "limit": page_size, "offset": (page - 1) * page_size}
        found = await self._read(browse.page_sql(filters, self.contains), paged)
        records = [stored(row).record for row in found]
        return OperationPage(records, total, page, page_size, {str(s): int(n) for s, n in counts})

    async def metrics_snapshot(self, *, now: float, principals: bool = False) -> MetricsSnapshot:
        """What a metrics scrape reads (`pollwarden.ops.metrics`): aggregates over every process's work."""
        cutoff = {"cutoff": now - browse.OVERDUE_AFTER_SECONDS}
        return browse.metrics_snapshot(
            await self._read(browse.OPERATIONS_BY_STATUS),
            await self._read_one(browse.PENDING_APPROVALS),
            await self._read_one(browse.OVERDUE, cutoff),
            await self._read(browse.REQUESTS_BY_PROVIDER),
            await self._read(browse.summarized_refusals_sql(self.payload_count)),
            await self._read(browse.OPERATIONS_BY_PRINCIPAL) if principals else None,
        )

    async def approval_policy(self) -> ApprovalPolicy:
        """The database's approval policy (`pollwarden.access.approval_policy`): the one row every process reads."""
        row = await self._read_one(statements.APPROVAL_POLICY)
        return ApprovalPolicy.from_row(row)

    async def operation_facets(self) -> OperationFacets:
        """Every provider, stop reason and owner some operation has (to filter by)."""

        async def distinct(column: str) -> list[str]:
            query = f"SELECT DISTINCT {column} FROM operations WHERE {column} IS NOT NULL ORDER BY 1"
            return [str(row[0]) for row in await self._read(query)]

        return OperationFacets(
            providers=await distinct("provider"),
            stop_reasons=await distinct("stop_reason"),
            owners=await distinct("owner"),
        )

    async def audit_rows(self, operation_id: str) -> list[AuditRow]:
        """One operation's audit rows in chain order (its story and timeline)."""
        query = (
            audit_rows_sql(per_operation=self.per_operation_chains)
            + " WHERE operation_id = :operation_id ORDER BY seq"
        )
        return [audit_row(raw) for raw in await self._read(query, {"operation_id": operation_id})]

    async def polled_times(self, providers: Sequence[str], *, since: float) -> dict[str, list[float]]:
        """When each status request of `providers` was answered since `since` (epoch s), per provider.

        Found without scanning the whole chain (a binary search on seq for where the window starts).
        """
        if not providers:
            return {}
        at = iso(since) or ""
        bounds = await self._read_one(browse.AUDIT_BOUNDS)
        if bounds is None or bounds[0] is None:
            return browse.polled_times_from((), providers)

        async def probe(seq: int) -> str | None:
            row = await self._read_one(browse.PROBE, {"seq": seq})
            return None if row is None else str(row[0])

        first = await browse.search(browse.first_seq_at_or_after(at, int(bounds[0]), int(bounds[1])), probe)
        query, names = browse.polled_sql(providers, text_order=self.byte_order)
        params: dict[str, object] = {"seq": first, "since": at, **dict(zip(names, providers, strict=True))}
        return browse.polled_times_from(await self._read(query, params), providers)
