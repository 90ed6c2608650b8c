"""The PostgreSQL engine: the `Store` interface over one database shared by every instance.

Each transaction runs in pipeline mode (see `connection`), in as few round
trips as its reads allow (`base.PostgresBase._transact` runs the flows of
`pollwarden.store.planned`). The shape of most writes is two trips: the first locks the operation row (when the
provider has a [fleet] pace, its pace row too) and reads it; the second carries
the new rows and the COMMIT. The check's own writes are shorter: the
reservation, when nothing else goes with it, is one guarded `UPDATE …
RETURNING` that commits itself (autocommit, one trip), the count of a refused
call one guarded statement, and the answer to this process's own reservation
one guarded trip; the read before them is saved when this process knows the
row (`_known_row`: the guard holds only on that very row). Only the fair-share
hand-off (`sql.HAND_SLOT`) uses SKIP LOCKED, where skipping a locked row loses
one hand-off and spends nothing; a budget or the pace is never decided on a
skipped row.

The audit (`pollwarden.audit.verify`): an operation's first row joins the one
chain, whose head row its transaction locks; every later row follows that
operation's own last row, recorded on the operation's row, so answers to
different operations never wait for one another. Every time written comes
from the caller's clock.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager

import anyio

from pollwarden.audit.chain import REKEY_OPERATION, SEAL_KIND
from pollwarden.audit.entry import AuditEvent, unlinked
from pollwarden.core.records import OperationRecord, new_record
from pollwarden.store import plans, statements
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.migrations.postgres import LATEST, migrate
from pollwarden.store.planned import closing
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.check_procedure import CheckProcedure
from pollwarden.store.postgres.connection import Pool
from pollwarden.store.postgres.executor import Writer, seal_entries
from pollwarden.store.rows import StoredOperation, new_operation_values, stored

# Connections per process: concurrent tool calls of one HTTP instance each borrow one.
POOL_SIZE = 10
# Operations named by one seal row at most: a seal holds the audit head, which every start waits for.
SEAL_BATCH = 1000


class PostgresStore(CheckProcedure):
    """One process's store on a PostgreSQL database (implements `pollwarden.store.Store`).

    The check procedure is `check_procedure`'s; the one-trip start, the database's clock and the
    seals are here; every other transaction is a flow of `pollwarden.store.planned`.
    """

    latest_schema = LATEST
    schema_version_sql = "SELECT coalesce(max(version), 0) FROM pollwarden_schema"

    # -- reads (one statement, no transaction) ------------------------------------------------------

    async def get(self, operation_id: str) -> OperationRecord | None:
        """The current record, or None."""
        row = await self._pool.read_one(statements.SELECT_OPERATION, {"operation_id": operation_id})
        if row is None:
            return None
        current = stored(row)
        self._remember(current)
        return current.record

    # -- the check procedure ------------------------------------------------------------------

    async def create_operation(
        self, values: Mapping[str, object], *, kind: str, at: float
    ) -> tuple[OperationRecord, bool]:
        """`Store.create_operation`; a start that submits nothing, on an unkeyed chain, in one trip."""
        values = new_operation_values(values)
        if self._key is None and values["submit_payload_json"] is None:
            opened = await self._open_in_one_statement(values, kind=kind, at=at)
            if opened is not None:
                self._remember(opened)  # committed: its first check needs no read
                return opened.record, True
        return await super().create_operation(values, kind=kind, at=at)

    async def _open_in_one_statement(
        self, values: Mapping[str, object], *, kind: str, at: float
    ) -> StoredOperation | None:
        """A start that submits nothing, on an unkeyed chain, in one trip (`sql.OPEN_OPERATION`).

        Its first audit row is written from the record the INSERT makes (`records.new_record`), so
        the row and its audit say the same. None: nothing was inserted (the id or the job is taken,
        or the chain is keyed); the caller goes the locked way, which answers with what holds them.
        """
        record = new_record(values)
        first = unlinked(plans.opening_event(record, kind, at))
        async with self._pool.transaction() as tx:
            cursor = await tx.queue(sql.OPEN_OPERATION, {**values, **vars(first)})
        row = await cursor.fetchone()
        return None if row is None else stored(row)

    async def database_time(self) -> float | None:
        """The database server's clock (epoch s) for `pollwarden doctor`'s skew check."""
        row = await self._pool.read_one("SELECT extract(epoch FROM clock_timestamp())")
        return None if row is None else float(str(row[0]))

    async def seal(self, *, at: float, batch: int = SEAL_BATCH) -> int:
        """Seal every operation's audit chain that moved since the last seal; how many were named.

        Chain rows (`audit.SEAL_KIND`) name each such operation with its chain's row count and last
        hash (`pollwarden.audit.verify`): from then on, rows deleted from the end of any of those
        chains are caught. Nothing is written when no chain moved. Each row names at most `batch`
        operations, in id order, and is its own transaction: the head is locked first, then those
        operations' rows. One pass over the ids: an operation that moves again meanwhile waits for
        the next seal.
        """
        named, after = 0, ""
        while True:
            async with self._pool.transaction() as tx:
                writer = Writer(tx, self._key)
                await writer.head_first(lock=True)
                moved = seal_entries(await tx.all(sql.SEAL_OPERATIONS, {"after": after, "batch": batch}))
                if not moved:
                    return named
                payload = {
                    "decision": SEAL_KIND,
                    "note": f"sealed the audit chains of {len(moved)} operations",
                    "operations": moved,
                }
                await writer.append_to_chain(AuditEvent(REKEY_OPERATION, at, SEAL_KIND, payload))
                await writer.finish()
            named += len(moved)
            if len(moved) < batch:
                return named
            after = str(moved[-1][0])  # seal_entries sorts by id


@asynccontextmanager
async def open_postgres(
    location: DatabaseLocation, *, audit_key: bytes | None, busy_timeout: float
) -> AsyncGenerator[PostgresStore]:
    """Connect (migrating the schema once), and on the way out write pending refusals and close."""
    pool = Pool(location, lock_timeout=busy_timeout, max_size=POOL_SIZE)
    await pool.open()
    try:
        await migrate(pool)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await pool.close()
        raise
    async with closing(PostgresStore(pool, location, audit_key), pool.close) as store:
        yield store
