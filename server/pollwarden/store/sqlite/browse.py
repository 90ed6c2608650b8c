"""The console's reads on SQLite (`pollwarden.store.browse`): each a few statements on the engine's connection.

Run in the database thread like every other read, without a transaction (a
WAL reader sees the last commit and never waits for a writer).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from pollwarden.audit import AuditRow, audit_row, audit_rows_sql
from pollwarden.store import browse
from pollwarden.store.browse import OperationFacets, OperationFilter, OperationPage
from pollwarden.store.sqlite import rows


def _contains(column: str, value: str) -> str:
    return f"instr({column}, {value}) > 0"


def _mark(name: str) -> str:
    return f":{name}"


def operations_page(
    conn: sqlite3.Connection, filters: OperationFilter, page: int, page_size: int
) -> OperationPage:
    """One page of the operations matching `filters`, newest first (past the end: the last), and counts."""
    params = browse.filter_params(filters)
    total = int(conn.execute(browse.count_sql(filters, _mark, _contains), params).fetchone()[0])
    counts = conn.execute(browse.status_counts_sql(filters, _mark, _contains), params).fetchall()
    page = browse.clamp_page(page, total, page_size)
    paged = {**params, "limit": page_size, "offset": (page - 1) * page_size}
    found = conn.execute(browse.page_sql(filters, _mark, _contains), paged).fetchall()
    records = [rows.stored(row).record for row in found]
    return OperationPage(records, total, page, page_size, {str(s): int(n) for s, n in counts})


def facets(conn: sqlite3.Connection) -> OperationFacets:
    """Every provider, stop reason and owner some operation has."""

    def distinct(column: str) -> list[str]:
        sql = f"SELECT DISTINCT {column} FROM operations WHERE {column} IS NOT NULL ORDER BY 1"
        return [str(row[0]) for row in conn.execute(sql).fetchall()]

    return OperationFacets(
        providers=distinct("provider"), stop_reasons=distinct("stop_reason"), owners=distinct("owner")
    )


def audit_rows(conn: sqlite3.Connection, operation_id: str) -> list[AuditRow]:
    """One operation's audit rows in chain order."""
    sql = audit_rows_sql(per_operation=False) + f" WHERE operation_id = {_mark('operation_id')} ORDER BY seq"
    return [audit_row(raw) for raw in conn.execute(sql, {"operation_id": operation_id}).fetchall()]


def polled_times(conn: sqlite3.Connection, providers: Sequence[str], since: str) -> dict[str, list[float]]:
    """When each status request of `providers` was answered at or after `since` (RFC 3339)."""
    if not providers:
        return {}
    low, high = conn.execute(browse.AUDIT_BOUNDS).fetchone()
    if low is None:
        return browse.polled_times_from((), providers)

    def probe(seq: int) -> str | None:
        row = conn.execute(browse.probe_sql(_mark), {"seq": seq}).fetchone()
        return None if row is None else str(row[0])

    first = browse.search_sync(browse.first_seq_at_or_after(since, int(low), int(high)), probe)
    sql, names = browse.polled_sql(providers, _mark)
    params: dict[str, object] = {"seq": first, "since": since, **dict(zip(names, providers, strict=True))}
    return browse.polled_times_from(conn.execute(sql, params).fetchall(), providers)
