"""The console's reads on PostgreSQL (`pollwarden.store.browse`): single statements outside a transaction."""

from __future__ import annotations

from collections.abc import Sequence

from pollwarden.audit import AuditRow, audit_row, audit_rows_sql
from pollwarden.store import browse
from pollwarden.store.browse import OperationFacets, OperationFilter, OperationPage
from pollwarden.store.postgres.connection import Pool
from pollwarden.store.rows import stored

# `audit.at` is fixed-width RFC 3339 text: compared byte by byte, whatever the database's collation.
_BYTE_ORDER = ' COLLATE "C"'


def _mark(name: str) -> str:
    return f"%({name})s"


async def operations_page(pool: Pool, filters: OperationFilter, page: int, page_size: int) -> OperationPage:
    """One page of the operations matching `filters`, newest first, and how many match."""
    params: dict[str, object] = {**filters.given(), "limit": page_size, "offset": (page - 1) * page_size}
    counted = await pool.read_one(browse.count_sql(filters, _mark), params)
    found = await pool.read(browse.page_sql(filters, _mark), params)
    total = 0 if counted is None else int(counted[0])
    return OperationPage([stored(row).record for row in found], total, page, page_size)


async def facets(pool: Pool) -> OperationFacets:
    """Every provider, stop reason and owner some operation has."""

    async def distinct(column: str) -> list[str]:
        sql = f"SELECT DISTINCT {column} FROM operations WHERE {column} IS NOT NULL ORDER BY 1"
        return [str(row[0]) for row in await pool.read(sql)]

    return OperationFacets(
        providers=await distinct("provider"),
        stop_reasons=await distinct("stop_reason"),
        owners=await distinct("owner"),
    )


async def audit_rows(pool: Pool, operation_id: str) -> list[AuditRow]:
    """One operation's audit rows in chain order."""
    sql = audit_rows_sql(per_operation=True) + f" WHERE operation_id = {_mark('operation_id')} ORDER BY seq"
    return [audit_row(raw) for raw in await pool.read(sql, {"operation_id": operation_id})]


async def polled_times(pool: Pool, providers: Sequence[str], since: str) -> dict[str, list[float]]:
    """When each status request of `providers` was answered at or after `since` (RFC 3339)."""
    if not providers:
        return {}
    bounds = await pool.read_one(browse.AUDIT_BOUNDS)
    if bounds is None or bounds[0] is None:
        return browse.polled_times_from((), providers)

    async def probe(seq: int) -> str | None:
        row = await pool.read_one(browse.probe_sql(_mark), {"seq": seq})
        return None if row is None else str(row[0])

    search = browse.first_seq_at_or_after(since, int(bounds[0]), int(bounds[1]))
    first = await browse.search_async(search, probe)
    sql, names = browse.polled_sql(providers, _mark, text_order=_BYTE_ORDER)
    params: dict[str, object] = {"seq": first, "since": since, **dict(zip(names, providers, strict=True))}
    return browse.polled_times_from(await pool.read(sql, params), providers)
