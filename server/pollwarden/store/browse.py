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
from dataclasses import dataclass
from datetime import datetime

from pollwarden.records import OperationRecord
from pollwarden.store.statements import OPERATION_ROW

__all__ = [
    "OperationFacets",
    "OperationFilter",
    "OperationPage",
    "count_sql",
    "first_seq_at_or_after",
    "page_sql",
    "polled_sql",
    "polled_times_from",
    "search",
    "search_sync",
]


@dataclass(frozen=True)
class OperationFilter:
    """Which operations a list shows: every filter given must match (None: any)."""

    status: str | None = None
    provider: str | None = None
    stop_reason: str | None = None
    owner: str | None = None  # the principal that started it (issue 19; `local` over stdio)

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


def _where(filters: OperationFilter) -> str:
    given = filters.given()
    return f"WHERE {' AND '.join(f'{c} = :{c}' for c in given)}" if given else ""


def page_sql(filters: OperationFilter) -> str:
    """One page of the operations matching `filters`, newest first (parameters: the filters, limit, offset)."""
    return (
        f"SELECT {OPERATION_ROW} FROM operations {_where(filters)} "
        "ORDER BY created_at DESC, operation_id LIMIT :limit OFFSET :offset"
    )


def count_sql(filters: OperationFilter) -> str:
    """How many operations match `filters`."""
    return f"SELECT count(*) FROM operations {_where(filters)}"


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
