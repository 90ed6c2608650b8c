"""The console's reads on SQLite (`pollwarden.store.browse`): each a few statements on the engine's connection.

Run in the database thread like every other read, without a transaction (a
WAL reader sees the last commit and never waits for a writer).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from pollwarden.audit import AuditRow, audit_row, audit_rows_sql
from pollwarden.errors import StoreError
from pollwarden.store import browse
from pollwarden.store.browse import OperationFacets, OperationFilter, OperationPage
from pollwarden.store.sqlite import rows
from pollwarden.store.sqlite.connection import Session
from pollwarden.store.sqlite.migrations import LATEST, schema_version


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


def metrics_snapshot(conn: sqlite3.Connection, now: float, principals: bool) -> browse.MetricsSnapshot:
    """What a metrics scrape reads: a handful of aggregate statements."""
    cutoff = {"cutoff": now - browse.OVERDUE_AFTER_SECONDS}
    return browse.metrics_snapshot(
        conn.execute(browse.OPERATIONS_BY_STATUS).fetchall(),
        conn.execute(browse.PENDING_APPROVALS).fetchone(),
        conn.execute(browse.overdue_sql(_mark), cutoff).fetchone(),
        conn.execute(browse.REQUESTS_BY_PROVIDER).fetchall(),
        conn.execute(browse.summarized_refusals_sql("json_extract(a.payload, '$.count')")).fetchall(),
        conn.execute(browse.OPERATIONS_BY_PRINCIPAL).fetchall() if principals else None,
    )


def not_ready(s: Session) -> str | None:
    """Why this database cannot serve now (file gone or replaced, schema behind), or None."""
    try:
        s.db.check_identity()
    except StoreError as exc:
        return str(exc)
    version = schema_version(s.conn)
    if version < LATEST:
        return f"the database is at schema step {version}, this pollwarden needs {LATEST}: restart to migrate"
    s.conn.execute("SELECT 1 FROM operations LIMIT 1").fetchall()
    return None
