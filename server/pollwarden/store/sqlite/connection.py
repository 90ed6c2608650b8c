"""The SQLite connection, the thread it is used from, and one transaction at a time on it.

pollwarden owns the connection (plain `sqlite3`) and the thread explicitly, as
aiosqlite does: one thread per connection takes units of work from a queue and
hands each result back to the event loop (`call_soon_threadsafe`); every use is
one hop, and a store operation runs its whole transaction (BEGIN IMMEDIATE …
COMMIT or ROLLBACK) inside that one hop. (anyio's worker threads cost about
twice as much per hop: `benchmarks/results/check_cost_issue28.md`.) A
caller cancelled before its turn leaves at once, and its work is never begun;
one cancelled later waits for its work to end: no transaction is ever left
open, whatever happens to the caller. A caller cancelled while BEGIN
waited for another process's lock is noticed right after BEGIN: the
transaction is rolled back (nothing written) and the caller's cancellation
re-raised. A transaction already past BEGIN runs to its end and its outcome
is returned (a committed reservation's request is still sent); the caller's
cancellation lands at its next checkpoint. A shielded caller (recording an
answer that arrived) is never interrupted.

Durability: the connection runs WAL at `synchronous=FULL`, so a commit is on
disk before the call returns (the reservation before the request leaves; the
answer, approvals and every audit row). A transaction that only counts a
refused call runs at `synchronous=NORMAL`: nothing that decides a budget, a
deadline or a lease reads that counter, and a NORMAL commit survives the
process being killed (it is in the OS page cache); only a power loss can lose
it, which costs at most a few uncounted refusals. SQLite refuses to change
`synchronous` inside a transaction, so each transaction sets the level it
needs just before its BEGIN, in the same hop, when the connection is not
already there (a run of refusals stays at NORMAL; the next durable write
sets FULL again before it begins).
"""

from __future__ import annotations

import asyncio
import math
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio

from pollwarden.core.errors import StoreError
from pollwarden.ops import observe
from pollwarden.store.migrations.sqlite import migrate
from pollwarden.store.planned import EngineStats
from pollwarden.store.sqlite import sql

T = TypeVar("T")


class CallerGone(BaseException):
    """The caller was cancelled while BEGIN waited: the transaction was rolled back."""


class _Hop:
    """One unit of work for the database thread, and where its outcome goes."""

    __slots__ = ("future", "gone", "lock", "loop", "started", "work")
    work: Callable[[], Any]  # set once its session exists

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.lock = threading.Lock()  # `started` and `gone` are decided together
        self.started = False
        self.gone = False  # its caller was cancelled (and is not shielded)

    def start(self) -> bool:
        """In the database thread: whether to run the work (its caller has not left)."""
        with self.lock:
            self.started = not self.gone
            return self.started

    def leave(self) -> bool:
        """In the event loop, for a cancelled caller: whether its work began (then it is waited for)."""
        with self.lock:
            self.gone = True
            return self.started

    def settle(self, value: Any, error: BaseException | None) -> None:
        """Hand the outcome to the waiting caller (in the event loop)."""
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(value)


def _serve(hops: queue.SimpleQueue[_Hop | None]) -> None:
    """The database thread: each unit of work in turn, until the connection closes."""
    while (hop := hops.get()) is not None:
        if not hop.start():
            continue  # its caller left before its turn: nothing begun, nobody waits
        try:
            value, error = hop.work(), None
        except BaseException as exc:  # handed to the caller, raised there
            value, error = None, exc
        with suppress(RuntimeError):  # the caller's event loop closed: nobody is left to tell
            hop.loop.call_soon_threadsafe(hop.settle, value, error)


def describe(exc: sqlite3.Error, path: Path, busy_timeout: float) -> StoreError:
    """A SQLite error as the problem and its fix; nothing was changed (the transaction rolled back)."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreError(
            f"the database {path} stayed locked by another process for more than {busy_timeout:g} s; "
            "nothing was changed — try again shortly, or find the process holding it"
        )
    if "readonly" in text or "read-only" in text:
        return StoreError(
            f"the database {path} is read-only; nothing was changed — give the server write access to the "
            "file and its directory (SQLite needs to create -wal and -shm files beside it)"
        )
    if "unable to open" in text:
        return StoreError(
            f"cannot open the database {path}: does its directory exist and is it writable? "
            "Set --db or POLLWARDEN_DB to a writable location"
        )
    return StoreError(f"database error on {path}: {text}")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


class Database:
    """One process's connection to the shared file, used from one thread hop at a time."""

    def __init__(self, conn: sqlite3.Connection, path: Path, busy_timeout: float) -> None:
        self.conn = conn
        self.path = path
        self.busy_timeout = busy_timeout
        self.stats = EngineStats()
        # One connection per process, shared by concurrent tool calls: its own thread, one hop at a time.
        self._hops: queue.SimpleQueue[_Hop | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        # The connection's synchronous level (FULL at open; set per transaction, see the module docstring).
        self.synchronous_full = True
        # The file this connection has open; a different file at the path (or none) is refused.
        self._opened = _identity(path)

    async def run(self, work: Callable[[Session], T]) -> T:
        """Run `work` in the database thread: one hop, whatever it reads and writes."""
        if self._closed:
            raise StoreError(f"the database {self.path} was closed; nothing was changed")
        if self._thread is None:
            self._thread = threading.Thread(target=_serve, args=(self._hops,), name="pollwarden-sqlite")
            self._thread.daemon = True  # an unclosed store does not hold the process open
            self._thread.start()
        hop = _Hop(asyncio.get_running_loop())
        hop.work = partial(self._in_thread, work, Session(self, hop))
        self.stats.trips += 1
        self._hops.put(hop)
        try:
            return await asyncio.shield(hop.future)
        except anyio.get_cancelled_exc_class():
            if not hop.leave():
                raise  # not begun, and now never will be
            # Begun: a transaction still waiting for BEGIN is rolled back (`CallerGone`).
            with anyio.CancelScope(shield=True):  # the unit of work ends before the caller goes on
                await asyncio.wait((hop.future,))
            if (
                isinstance(hop.future.exception(), CallerGone)
                or anyio.current_effective_deadline() > -math.inf
            ):
                raise  # nothing written; or a cancellation from outside anyio, which would not come again
            # It ran to its end (a reservation committed, say): its outcome stands, and the caller's
            # cancelled scope stops it at its next checkpoint (a reservation's request is still sent).
            return hop.future.result()

    async def close(self) -> None:
        """Close the connection in its thread, and end the thread (once; later uses are refused)."""
        if self._closed:
            return
        try:
            await self.run(lambda s: s.conn.close())
        finally:
            self._closed = True
            self._hops.put(None)

    def _in_thread(self, work: Callable[[Session], T], session: Session) -> T:
        try:
            return work(session)
        except sqlite3.Error as exc:
            raise describe(exc, self.path, self.busy_timeout) from exc

    def check_identity(self) -> None:
        """Refuse to write when the path no longer names the file opened (replaced or deleted)."""
        now = _identity(self.path)
        if now == self._opened:
            return
        what = "was deleted" if now is None else "was replaced by another file"
        raise StoreError(
            f"the database file {self.path} {what} while this server was running; nothing was changed "
            "and no request was sent. Its records are not in the file there now: restore the file, "
            "or restart the pollwarden server to use the new one (it starts without the old operations)"
        )


class Session:
    """What a unit of work in the database thread uses: the connection and its transactions."""

    def __init__(self, db: Database, hop: _Hop | None = None) -> None:
        self.db = db
        self.conn = db.conn
        self._hop = hop  # None: not a hop of an async caller (an offline command)
        self.durable = True  # of the transaction open now (or the last one)

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Generator[sqlite3.Connection]:
        """`BEGIN IMMEDIATE` … `COMMIT`, or `ROLLBACK` on any exception; the write lock is taken up front.

        `durable=False` commits at `synchronous=NORMAL` (see the module docstring).
        """
        db = self.db
        conn = self.conn
        db.check_identity()
        self.durable = durable
        if durable != db.synchronous_full:
            conn.execute(sql.SYNCHRONOUS_FULL if durable else sql.SYNCHRONOUS_NORMAL)
            db.synchronous_full = durable
        self._leave_if_cancelled()  # left before BEGIN: nothing begun
        with observe.db_transaction("sqlite"):  # from BEGIN (waiting for the lock) to COMMIT
            try:
                conn.execute(sql.BEGIN_IMMEDIATE)
            except sqlite3.Error:
                self._leave_if_cancelled()  # left while BEGIN waited: its cancellation, not the lock's error
                raise
            try:
                self._leave_if_cancelled()
                yield conn
                conn.execute(sql.COMMIT)
            except BaseException:
                if conn.in_transaction:
                    with suppress(sqlite3.Error):
                        conn.execute(sql.ROLLBACK)
                db.stats.rollbacks += 1
                raise
        if durable:
            db.stats.durable_commits += 1
        else:
            db.stats.relaxed_commits += 1

    def _leave_if_cancelled(self) -> None:
        # BEGIN may have waited seconds for another process's lock; a caller that
        # was cancelled meanwhile (and is not shielded) gets nothing written.
        if self._hop is not None and self._hop.gone:
            raise CallerGone


def connect(path: Path, busy_timeout: float) -> Database:
    """Open (creating and migrating) the SQLite file; runs in the database thread."""
    try:
        conn = sqlite3.connect(
            str(path),
            isolation_level=None,
            timeout=busy_timeout,
            check_same_thread=False,
            cached_statements=256,
        )
    except sqlite3.Error as exc:
        raise describe(exc, path, busy_timeout) from exc
    try:
        conn.execute(sql.busy_timeout(busy_timeout))
        conn.execute(sql.JOURNAL_MODE_WAL).fetchone()
        # FULL: the reservation must be on disk before the request leaves.
        conn.execute(sql.SYNCHRONOUS_FULL)
        migrate(conn)
        conn.execute(sql.FOREIGN_KEYS_ON)
    except sqlite3.Error as exc:
        conn.close()
        raise describe(exc, path, busy_timeout) from exc
    except BaseException:
        conn.close()
        raise
    return Database(conn, path, busy_timeout)
