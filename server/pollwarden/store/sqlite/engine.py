"""The SQLite engine: the `Store` interface over one file shared by every server process.

Each transaction is one hop to the database thread (`Database.run`) that runs
it whole there, under the write lock: the check procedure (`check_procedure`),
and every other one a flow of `pollwarden.store.planned` that `executor` runs.
Reads (`pollwarden.store.reads`) run without a transaction (WAL readers see the
last commit and never wait for a writer).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio

from pollwarden.core.errors import StoreError
from pollwarden.core.files import prepare_database_file
from pollwarden.core.records import CheckStart
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.migrations.sqlite import LATEST
from pollwarden.store.planned import Store, T, closing
from pollwarden.store.reads import Row
from pollwarden.store.sqlite import check_procedure, executor
from pollwarden.store.sqlite.connection import Database, EngineStats, Session, connect
from pollwarden.store.transactions import CheckCall, Flow


class SQLiteStore(Store):
    """One process's store on a SQLite file (implements `pollwarden.store.Store`)."""

    latest_schema = LATEST
    schema_version_sql = "PRAGMA user_version"

    def __init__(self, db: Database, location: DatabaseLocation, audit_key: bytes | None) -> None:
        self._db = db
        self._key = audit_key
        self.location = location
        self.stats: EngineStats = db.stats  # hops to the database thread and commits by durability

    @property
    def path(self) -> Path:
        """The SQLite file (the offline audit readers open it read-only)."""
        return self._db.path

    async def _transact(
        self, flow: Flow[T], *, lock: str | None = None, audit: bool = True, durable: bool = True
    ) -> T:
        """The flow as one transaction in one hop, under the write lock (which holds every row)."""
        del audit  # every row of SQLite's chain is appended under the write lock

        def work(s: Session) -> T:
            with s.transaction(durable=durable) as conn:
                return executor.run_flow(conn, flow, lock, self._key)

        return await self._db.run(work)

    async def _read(self, statement: str, params: Mapping[str, object] | None = None) -> list[Row]:
        """One read statement in one hop, outside any transaction."""
        return await self._db.run(lambda s: s.conn.execute(statement, params or {}).fetchall())

    async def not_ready(self) -> str | None:
        """`Store.not_ready`, and the path must still name the file opened (not deleted nor replaced)."""
        try:
            await self._db.run(lambda s: s.db.check_identity())
        except StoreError as exc:
            return str(exc)
        return await super().not_ready()

    async def _begin_check(self, call: CheckCall) -> CheckStart | None:
        """Decide one round of check_status and write it, in one hop (`check_procedure.begin_check`)."""
        return await self._db.run(partial(check_procedure.begin_check, call=call, key=self._key))


@asynccontextmanager
async def open_sqlite(
    location: DatabaseLocation, *, audit_key: bytes | None, busy_timeout: float
) -> AsyncGenerator[SQLiteStore]:
    """Open (creating and migrating) the file; on the way out, write pending refusals and close it."""
    path = location.path
    if not path.parent.exists():
        raise StoreError(
            f"the directory {path.parent} for the database does not exist; create it, or point --db / "
            "POLLWARDEN_DB at a writable location"
        )
    prepare_database_file(path)  # private (0600), never another user's or group-writable (files.py)
    db = await anyio.to_thread.run_sync(connect, path, busy_timeout)
    async with closing(SQLiteStore(db, location, audit_key), db.close) as store:
        yield store
