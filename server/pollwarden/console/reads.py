"""What the console reads that the store does not offer: a filtered, paged list and the fleet's pace.

Read-only SQLite (``mode=ro``), like the offline audit readers: the console
never writes through these. Decisions go through the store
(`pollwarden.operator_decision`).
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from collections.abc import Generator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pollwarden.errors import StoreError
from pollwarden.timefmt import iso

__all__ = [
    "OperationRow",
    "Page",
    "list_operations",
    "polled_times",
    "providers_in_use",
    "stop_reasons_in_use",
]


@dataclass(frozen=True)
class OperationRow:
    """One line of the Operations table."""

    operation_id: str
    provider: str
    provider_job_id: str | None
    status: str
    stop_reason: str | None
    state: str | None
    status_requests_used: int
    max_status_requests: int
    deadline_at: float
    next_check_at: float
    created_at: float


@dataclass(frozen=True)
class Page:
    """One page of operations, newest first, and how many match in all."""

    rows: list[OperationRow]
    total: int
    page: int
    page_size: int

    @property
    def pages(self) -> int:
        """How many pages the matching operations fill (at least 1)."""
        return max(1, -(-self.total // self.page_size))


@contextmanager
def _read_only(db_path: Path) -> Generator[sqlite3.Connection]:
    if not db_path.is_file():
        raise StoreError(f"no database at {db_path}; pass the server's --db")
    uri = "file:" + urllib.parse.quote(str(db_path.resolve()), safe="/") + "?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as conn:
        yield conn


_COLUMNS = (
    "operation_id, provider, provider_job_id, status, stop_reason, state, status_requests_used, "
    "max_status_requests, deadline_at, next_check_at, created_at"
)


def list_operations(
    db_path: Path,
    *,
    status: str | None = None,
    provider: str | None = None,
    stop_reason: str | None = None,
    page: int = 1,
    page_size: int = 25,
) -> Page:
    """Operations matching every filter given, newest first, one page of them."""
    where: list[str] = []
    params: list[object] = []
    for column, value in (("status", status), ("provider", provider), ("stop_reason", stop_reason)):
        if value:
            where.append(f"{column} = ?")
            params.append(value)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    page = max(1, page)
    with _read_only(db_path) as conn:
        total = int(conn.execute(f"SELECT count(*) FROM operations {clause}", params).fetchone()[0])
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM operations {clause} ORDER BY created_at DESC, operation_id "
            "LIMIT ? OFFSET ?",
            [*params, page_size, (page - 1) * page_size],
        ).fetchall()
    return Page([OperationRow(*row) for row in rows], total, page, page_size)


def _distinct(db_path: Path, column: str) -> list[str]:
    with _read_only(db_path) as conn:
        found = conn.execute(
            f"SELECT DISTINCT {column} FROM operations WHERE {column} IS NOT NULL ORDER BY 1"
        ).fetchall()
    return [str(row[0]) for row in found]


def providers_in_use(db_path: Path) -> list[str]:
    """Every provider some operation names (for the filter)."""
    return _distinct(db_path, "provider")


def stop_reasons_in_use(db_path: Path) -> list[str]:
    """Every stop reason some operation has (for the filter)."""
    return _distinct(db_path, "stop_reason")


def _first_seq_at_or_after(conn: sqlite3.Connection, since: str) -> int:
    """The first audit seq written at or after `since`, by binary search on seq.

    Rows are appended in time order (each process's clock, so up to the skew
    between processes); searching keeps the pace chart from scanning the whole chain.
    """
    low_high = conn.execute("SELECT min(seq), max(seq) FROM audit").fetchone()
    if low_high[0] is None:
        return 1
    low, high = int(low_high[0]), int(low_high[1]) + 1
    while low < high:
        mid = (low + high) // 2
        row = conn.execute("SELECT at FROM audit WHERE seq >= ? ORDER BY seq LIMIT 1", (mid,)).fetchone()
        if row is None or str(row[0]) >= since:
            high = mid
        else:
            low = mid + 1
    return low


def polled_times(db_path: Path, providers: Sequence[str], *, since: float) -> dict[str, list[float]]:
    """When each status request of each provider in `providers` was answered, since `since` (epoch s)."""
    out: dict[str, list[float]] = {name: [] for name in providers}
    if not providers:
        return out
    since_text = iso(since) or ""
    with _read_only(db_path) as conn:
        first = _first_seq_at_or_after(conn, since_text)
        marks = ", ".join("?" for _ in providers)
        found = conn.execute(
            "SELECT o.provider, a.at FROM audit a JOIN operations o ON o.operation_id = a.operation_id "
            f"WHERE a.seq >= ? AND a.kind = 'polled' AND a.at >= ? AND o.provider IN ({marks}) ORDER BY a.seq",
            [first, since_text, *providers],
        ).fetchall()
    for provider, at in found:
        try:
            out[str(provider)].append(datetime.fromisoformat(str(at).replace("Z", "+00:00")).timestamp())
        except ValueError:
            continue
    return out
