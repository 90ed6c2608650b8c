"""The PostgreSQL connections (a psycopg 3 pool), one transaction at a time on one of them.

Every store operation borrows a connection and runs one transaction on it in
pipeline mode (`Tx`): statements are queued, and only reading a result or the
COMMIT costs a round trip, so a transaction is as many trips as it has
results it must read before deciding what to write, plus one. A write that is
one statement and needs no other (the reservation) runs alone in autocommit:
one trip, no BEGIN or COMMIT to send (`Pool.write_one`).

Durability: `synchronous_commit` is on for every transaction except the one
that only counts a refused call (the same trade as SQLite's NORMAL: nothing
that decides a budget reads that counter). If the connection is lost during a
COMMIT, its outcome is unknown; the error reaches the controller, which sends
nothing (a reservation that did commit holds its lease until it expires, as
after a crash).

Errors become `StoreError`s that say what happened and what to do; the URL in
them has its password masked, and no SQL parameter is ever quoted.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from enum import Enum
from typing import Any, LiteralString, cast

import psycopg
import psycopg.errors
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pollwarden.core.errors import StoreError
from pollwarden.ops import observe
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.planned import EngineStats
from pollwarden.store.postgres.errors import describe, locked_table
from pollwarden.store.postgres.sql import dialect

Connection = AsyncConnection[TupleRow]
Row = tuple[Any, ...]
Params = Mapping[str, object] | Sequence[object]


def _value(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, str) and "\x00" in value:
        # PostgreSQL text cannot hold NUL; SQLite can. Stored as U+FFFD (a lookup by such an id finds nothing).
        return value.replace("\x00", "\ufffd")
    return value


def plain(params: Params) -> Params:
    """Parameters as PostgreSQL takes them: vocabulary words as their text, NUL as U+FFFD."""
    if isinstance(params, Mapping):
        return {k: _value(v) for k, v in params.items()}
    return [_value(v) for v in params]


def _query(text: str) -> LiteralString:
    # Every statement is a constant of `statements` or `sql`, or built there from validated column names.
    return cast("LiteralString", dialect(text))


# A read waits for a connection of its own pool, never for one a lock waiter holds; a write waits
# for a connection longer than any lock wait lasts (lock_timeout), so it gets one when they end.
READ_POOL_SHARE = 2  # the read pool has half as many connections as the writers' (at least 2)
POOL_WAIT_MARGIN_SECONDS = 5.0
# The sessions that hold a row lock on a table (a row lock takes RowShareLock on its table), oldest first.
LOCK_HOLDERS = (
    "SELECT a.pid, a.application_name, a.state, extract(epoch from now() - a.xact_start) "
    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.relation = to_regclass(%s) "
    "AND l.granted AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL "
    "ORDER BY a.xact_start LIMIT 1"
)


class Tx:
    """One transaction on one connection in pipeline mode: queued statements, one trip per result read."""

    def __init__(self, conn: Connection, stats: EngineStats) -> None:
        self.conn = conn
        self._stats = stats
        self._unsent = False  # statements queued since the last trip

    async def queue(self, sql: str, params: Params = ()) -> AsyncCursor[TupleRow]:
        """Queue a statement (no trip); its cursor holds the result once one is read."""
        cur = self.conn.cursor()
        await cur.execute(_query(sql), plain(params))
        self._unsent = True
        return cur

    def _trip(self) -> None:
        # Reading a result sends what is queued; results of statements sent with it come back with it.
        if self._unsent:
            self._stats.trips += 1
            self._unsent = False

    async def one(self, sql: str, params: Params = ()) -> Row | None:
        """Run a statement and read its first row (one trip, with everything queued before it)."""
        cur = await self.queue(sql, params)
        return await self.read(cur)

    async def read(self, cur: AsyncCursor[TupleRow]) -> Row | None:
        """The first row of a queued statement (a trip unless it was sent with one already made)."""
        self._trip()
        return await cur.fetchone()

    async def all(self, sql: str, params: Params = ()) -> list[Row]:
        """Run a statement and read every row (one trip)."""
        return await self.read_all(await self.queue(sql, params))

    async def read_all(self, cur: AsyncCursor[TupleRow]) -> list[Row]:
        """Every row of a queued statement (a trip unless it was sent with one already made)."""
        self._trip()
        return await cur.fetchall()


class Pool:
    """The process's connections to one database, with the settings every session needs."""

    def __init__(self, location: DatabaseLocation, *, lock_timeout: float, max_size: int) -> None:
        self.location = location
        self.lock_timeout = lock_timeout
        self.stats = EngineStats()
        self._pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            location.dsn,
            min_size=1,
            max_size=max_size,
            kwargs={"autocommit": True, "application_name": "pollwarden"},
            configure=self._configure,
            timeout=lock_timeout + POOL_WAIT_MARGIN_SECONDS,
            open=False,
            name="pollwarden",
        )
        # Reads (autocommit snapshots) never wait for a row lock; with a pool of their own they never
        # wait behind writers that do, either: a lock held on one provider's row costs reads nothing.
        self._reads: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            location.dsn,
            min_size=0,
            max_size=max(2, max_size // READ_POOL_SHARE),
            kwargs={"autocommit": True, "application_name": "pollwarden"},
            configure=self._configure,
            timeout=lock_timeout + POOL_WAIT_MARGIN_SECONDS,
            open=False,
            name="pollwarden-reads",
        )

    async def _configure(self, conn: Connection) -> None:
        # lock_timeout bounds every wait for another session's row lock, like SQLite's busy timeout;
        # synchronous_commit on: a committed reservation is on disk before the request leaves.
        # jit off: every statement here touches a few rows, but a small table the planner has no
        # statistics for yet (the one-row audit head, thousands of dead versions after a busy minute)
        # is estimated large enough to be compiled, which cost each start 15 ms at 30,000 operations.
        await conn.execute(
            _query(
                f"SET lock_timeout = {int(self.lock_timeout * 1000)}; SET synchronous_commit = on; SET jit = off"
            )
        )

    async def open(self) -> None:
        """Connect (the first connection must work: a wrong URL is reported at start)."""
        try:
            await self._pool.open(wait=True, timeout=max(self.lock_timeout, 5.0))
        except (PoolTimeout, psycopg.Error) as exc:
            await self._pool.close()
            raise self.describe(await self._why_not(exc)) from None
        await self._reads.open(wait=False)

    async def _why_not(self, exc: BaseException) -> BaseException:
        # The pool says only that it timed out; one direct attempt names the cause (refused, auth, …).
        try:
            conn = await psycopg.AsyncConnection.connect(self.location.dsn, connect_timeout=5)
        except psycopg.Error as direct:
            return direct
        await conn.close()
        return exc

    async def close(self) -> None:
        """Close every connection."""
        await self._reads.close()
        await self._pool.close()

    def describe(self, exc: BaseException) -> StoreError:
        """`describe` for this pool's database."""
        return describe(exc, self.location, self.lock_timeout)

    async def _forget_broken(self) -> None:
        # After a lost connection (a restarted server), drop every idle connection that is dead too,
        # so the next call connects afresh instead of failing on the next dead one.
        with suppress(psycopg.Error, PoolTimeout):
            await self._pool.check()
        with suppress(psycopg.Error, PoolTimeout):
            await self._reads.check()

    async def _failed(self, exc: BaseException) -> StoreError:
        """A write's driver error described (with the lock's holder); a lost connection's dead peers dropped."""
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            await self._forget_broken()
        return describe(exc, self.location, self.lock_timeout, await self.lock_holder(exc))

    async def lock_holder(self, exc: BaseException) -> str | None:
        """For a lock_timeout: the oldest open transaction holding row locks on that table, described."""
        table = locked_table(exc)
        if not isinstance(exc, psycopg.errors.LockNotAvailable) or table is None:
            return None
        try:
            async with self._reads.connection(timeout=1.0) as conn:
                cur = await conn.execute(_query(LOCK_HOLDERS), (table,))
                row = await cur.fetchone()
        except (psycopg.Error, PoolTimeout):
            return None
        if row is None:
            return None
        pid, application, state, seconds = row
        return (
            f"session {pid} (application {application or 'unnamed'!r}, {state}, "
            f"its transaction open {float(seconds or 0):.0f} s)"
        )

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncGenerator[Tx]:
        """BEGIN … COMMIT in pipeline mode (ROLLBACK on any exception); the COMMIT is the last trip.

        `durable=False` commits with synchronous_commit off (only for counting a refused call).
        """
        try:
            async with self._pool.connection() as conn, observe.db_transaction("postgres"):
                try:
                    async with conn.pipeline():
                        tx = Tx(conn, self.stats)
                        await tx.queue("BEGIN")
                        if not durable:
                            await tx.queue("SET LOCAL synchronous_commit = off")
                        yield tx
                        await tx.queue("COMMIT")
                    self.stats.trips += 1
                    if durable:
                        self.stats.durable_commits += 1
                    else:
                        self.stats.relaxed_commits += 1
                except BaseException:
                    self.stats.rollbacks += 1
                    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        with suppress(psycopg.Error):  # the pool discards a broken connection
                            await conn.rollback()
                    raise
        except (psycopg.Error, PoolTimeout) as exc:
            raise await self._failed(exc) from None

    async def write_one(self, sql: str, params: Params = (), *, durable: bool = True) -> Row | None:
        """One statement as a transaction of its own, in one trip; its first row.

        Autocommit: the statement's implicit transaction is committed (synchronous_commit on, unless
        the statement turns it off for itself: `durable=False` counts it so) before its result comes
        back. Never retried: after a lost connection its outcome is unknown.
        """
        try:
            async with self._pool.connection() as conn:
                self.stats.trips += 1
                cur = await conn.execute(_query(sql), plain(params))
                row = await cur.fetchone()
                if durable:
                    self.stats.durable_commits += 1
                else:
                    self.stats.relaxed_commits += 1
                return row
        except (psycopg.Error, PoolTimeout) as exc:
            raise await self._failed(exc) from None

    async def read(self, sql: str, params: Params = ()) -> list[Row]:
        """One statement outside a transaction (autocommit snapshot); retried once on a dead connection."""
        for attempt in (1, 2):
            try:
                async with self._reads.connection() as conn:
                    self.stats.trips += 1
                    cur = await conn.execute(_query(sql), plain(params))
                    return await cur.fetchall()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                await self._forget_broken()
                if attempt == 2:
                    raise self.describe(exc) from None
                observe.db_retry("postgres")
            except (psycopg.Error, PoolTimeout) as exc:
                raise self.describe(exc) from None
        raise AssertionError("unreachable")

    async def read_one(self, sql: str, params: Params = ()) -> Row | None:
        """The first row of `read`, or None."""
        found = await self.read(sql, params)
        return found[0] if found else None
