"""The Store's reads for a person looking at everything (the operator console), engine-neutral parts.

A filtered, paged list of operations, the values there are to filter by, the
audit rows of one operation, and when each status request of a provider was
answered over a recent window (the fleet's pace): the SQL (named parameters)
that `store.reads` runs on either engine; where the pace window starts is
found by a binary search on the audit's `seq` (`first_seq_at_or_after`), so a
chart never scans the whole chain.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from pollwarden.core.records import OperationRecord
from pollwarden.store.statements import OPERATION_ROW

__all__ = [
    "OperationFacets",
    "OperationFilter",
    "OperationPage",
    "clamp_page",
    "count_sql",
    "filter_params",
    "first_seq_at_or_after",
    "page_sql",
    "polled_sql",
    "polled_times_from",
    "search",
    "search_sync",
    "status_counts_sql",
]


@dataclass(frozen=True)
class OperationFilter:
    """Which operations a list shows: every filter given must match (None: any)."""

    status: str | None = None
    provider: str | None = None
    stop_reason: str | None = None
    owner: str | None = None  # the principal that started it (issue 19; `local` over stdio)
    search: str | None = None  # part of the operation id or of the provider's job id

    def given(self) -> dict[str, str]:
        """The filters that are set, column → value (column names are these fields, never caller text)."""
        values = {
            "status": self.status,
            "provider": self.provider,
            "stop_reason": self.stop_reason,
            "owner": self.owner,
        }
        return {column: value for column, value in values.items() if value}


@dataclass(frozen=True)
class OperationPage:
    """One page of operations, newest first, and how many match in all."""

    records: list[OperationRecord]
    total: int
    page: int
    page_size: int
    # How many match each status, under every filter but the status (the tabs a person picks from).
    status_counts: dict[str, int] = field(default_factory=dict[str, int])

    @property
    def pages(self) -> int:
        """How many pages the matching operations fill (at least 1)."""
        return max(1, -(-self.total // self.page_size))


@dataclass(frozen=True)
class OperationFacets:
    """The values some operation has, to filter by."""

    providers: list[str]
    stop_reasons: list[str]
    owners: list[str]


# Where a value occurs in a column, case-sensitive on both engines: the engine's function of
# (text, part), SQLite's instr or PostgreSQL's strpos (LIKE ignores case on SQLite and not on
# PostgreSQL, and would need its wildcards escaped).


def _where(filters: OperationFilter, contains: str, *, status: bool = True) -> str:
    clauses = [f"{c} = :{c}" for c in filters.given() if status or c != "status"]
    if filters.search:
        clauses.append(f"({contains}(operation_id, :search) > 0 OR {contains}(provider_job_id, :search) > 0)")
    return f"WHERE {' AND '.join(clauses)}" if clauses else ""


def filter_params(filters: OperationFilter) -> dict[str, object]:
    """The parameters `page_sql`, `count_sql` and `status_counts_sql` name for `filters`."""
    return {**filters.given(), **({"search": filters.search} if filters.search else {})}


def page_sql(filters: OperationFilter, contains: str) -> str:
    """One page of the operations matching `filters`, newest first (parameters: the filters, limit, offset)."""
    return (
        f"SELECT {OPERATION_ROW} FROM operations {_where(filters, contains)} "
        "ORDER BY created_at DESC, operation_id LIMIT :limit OFFSET :offset"
    )


def count_sql(filters: OperationFilter, contains: str) -> str:
    """How many operations match `filters`."""
    return f"SELECT count(*) FROM operations {_where(filters, contains)}"


def status_counts_sql(filters: OperationFilter, contains: str) -> str:
    """How many operations match `filters` but the status, per status (rows: status, count)."""
    return (
        f"SELECT status, count(*) FROM operations {_where(filters, contains, status=False)} GROUP BY status"
    )


def clamp_page(page: int, total: int, page_size: int) -> int:
    """`page` within 1 … the last page (a page past the end shows the last one)."""
    return max(1, min(page, -(-total // page_size)))


AUDIT_BOUNDS = "SELECT min(seq), max(seq) FROM audit"
# The `at` of the first audit row at or after a seq.
PROBE = "SELECT at FROM audit WHERE seq >= :seq ORDER BY seq LIMIT 1"


def polled_sql(providers: Sequence[str], *, text_order: str = "") -> tuple[str, list[str]]:
    """When each status request of `providers` was answered, from a seq on; (statement, provider parameters).

    Parameters: seq, since (RFC 3339 text; fixed width, so text order is time order: `text_order`
    names a collation that compares it byte by byte where the engine's default may not), and
    each name in the returned list for one provider.
    """
    names = [f"p{i}" for i in range(len(providers))]
    return (
        "SELECT o.provider, a.at FROM audit a JOIN operations o ON o.operation_id = a.operation_id "
        f"WHERE a.seq >= :seq AND a.kind = 'polled' AND a.at{text_order} >= :since "
        f"AND o.provider IN ({', '.join(':' + n for n in names)}) ORDER BY a.seq",
        names,
    )


def first_seq_at_or_after(since: str, low: int, high: int) -> Generator[int, str | None, int]:
    """Binary search for the first audit seq in [low, high] written at or after `since` (RFC 3339 text).

    Yields a seq to probe; is sent the `at` of the first row at or after that
    seq (None: there is none); returns the seq found (`high` + 1: none). Rows
    are appended in time order (each process's clock, so up to the skew
    between processes).
    """
    high += 1
    while low < high:
        mid = (low + high) // 2
        at = yield mid
        if at is None or at >= since:
            high = mid
        else:
            low = mid + 1
    return low


def search_sync(search: Generator[int, str | None, int], probe: Callable[[int], str | None]) -> int:
    """Run `first_seq_at_or_after` with a blocking probe."""
    try:
        seq = next(search)
        while True:
            seq = search.send(probe(seq))
    except StopIteration as done:
        return int(done.value)


async def search(
    search: Generator[int, str | None, int], probe: Callable[[int], Awaitable[str | None]]
) -> int:
    """Run `first_seq_at_or_after` with a probe that awaits (one statement each)."""
    try:
        seq = next(search)
        while True:
            seq = search.send(await probe(seq))
    except StopIteration as done:
        return int(done.value)


def polled_times_from(
    found: Iterable[tuple[object, object]], providers: Sequence[str]
) -> dict[str, list[float]]:
    """(provider, `at` text) rows as each provider's answer times in epoch seconds (unreadable times skipped)."""
    out: dict[str, list[float]] = {name: [] for name in providers}
    for provider, at in found:
        try:
            when = datetime.fromisoformat(str(at).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        out.setdefault(str(provider), []).append(when)
    return out


# -- what `pollwarden.ops.metrics` reads at each scrape (every process's work, counted once) -----------

# A waiting operation whose next allowed check passed this long ago counts as overdue (its agent
# stopped asking): an agent that asks on time is seconds late at most.
OVERDUE_AFTER_SECONDS = 60.0

OPERATIONS_BY_STATUS = (
    "SELECT status, COALESCE(stop_reason, ''), count(*) FROM operations GROUP BY status, stop_reason"
)
OPERATIONS_BY_PRINCIPAL = "SELECT owner, status, count(*) FROM operations GROUP BY owner, status"
PENDING_APPROVALS = "SELECT count(*), min(asked_at) FROM approvals WHERE status = 'pending'"
REQUESTS_BY_PROVIDER = (
    "SELECT provider, COALESCE(sum(status_requests_used), 0), COALESCE(sum(refused_count), 0) "
    "FROM operations GROUP BY provider"
)


# Waiting operations whose next allowed check is before a cutoff: how many, and the earliest.
OVERDUE = (
    "SELECT count(*), min(next_check_at) FROM operations WHERE status = 'waiting' AND next_check_at < :cutoff"
)


def summarized_refusals_sql(count_of_payload: str) -> str:
    """Refused calls already summarized in the audit, per provider (`count_of_payload`: the engine's JSON read)."""
    return (
        f"SELECT o.provider, COALESCE(sum({count_of_payload}), 0) FROM audit a "
        "JOIN operations o ON o.operation_id = a.operation_id "
        "WHERE a.kind IN ('not_yet_summary', 'stopped_summary') GROUP BY o.provider"
    )


@dataclass(frozen=True)
class MetricsSnapshot:
    """What the database holds now, for a scrape (times in epoch seconds)."""

    operations: dict[tuple[str, str], int]  # (status, stop_reason or "") → how many
    pending_approvals: int
    oldest_pending_asked_at: float | None
    overdue: int  # waiting, next allowed check more than OVERDUE_AFTER_SECONDS ago
    most_overdue_next_check_at: float | None
    status_requests: dict[str, int]  # provider → status requests counted, ever
    refusals: dict[str, int]  # provider → refused check_status calls, ever (summarized and pending)
    by_principal: dict[tuple[str, str], int] | None = None  # (owner, status) → how many; only when asked


def metrics_snapshot(
    by_status: Iterable[Sequence[object]],
    pending: Sequence[object] | None,
    overdue: Sequence[object] | None,
    by_provider: Iterable[Sequence[object]],
    summarized: Iterable[Sequence[object]],
    by_principal: Iterable[Sequence[object]] | None = None,
) -> MetricsSnapshot:
    """The snapshot from the rows of the statements above (each engine runs them its own way)."""
    refusals: dict[str, int] = {}
    requests: dict[str, int] = {}
    for provider, used, refused in by_provider:
        requests[str(provider)] = _int(used)
        refusals[str(provider)] = _int(refused)
    for provider, count in summarized:
        refusals[str(provider)] = refusals.get(str(provider), 0) + _int(count)
    return MetricsSnapshot(
        operations={(str(s), str(r)): _int(n) for s, r, n in by_status},
        pending_approvals=_int(pending[0]) if pending else 0,
        oldest_pending_asked_at=_float(pending[1]) if pending else None,
        overdue=_int(overdue[0]) if overdue else 0,
        most_overdue_next_check_at=_float(overdue[1]) if overdue else None,
        status_requests=requests,
        refusals=refusals,
        by_principal=None
        if by_principal is None
        else {(str(o), str(s)): _int(n) for o, s, n in by_principal},
    )


def _int(value: object) -> int:
    # PostgreSQL's sum() of bigint is numeric (a Decimal here).
    return int(value) if isinstance(value, int | float | str | Decimal) else 0


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float | Decimal) else None
