"""The PostgreSQL engine's shared parts: the pool, the rows this process knows, the locked transaction.

`PostgresBase` is what the engine's groups of methods (`check_procedure`, `decisions`,
and `engine` itself) are built on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio

from pollwarden.core.errors import StoreError
from pollwarden.core.records import OperationRecord
from pollwarden.core.untrusted import shown
from pollwarden.core.vocabulary import Status
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.planned import PlannedWrites
from pollwarden.store.plans import Plan
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.connection import EngineStats, Pool, Tx
from pollwarden.store.postgres.executor import Writer, operation
from pollwarden.store.reads import Row
from pollwarden.store.rows import StoredOperation

# Reservations remembered for a one-trip answer (an entry is dropped when its answer comes).
RESERVED_KEPT = 256
# Operation rows remembered as this process last saw them (the check's first trip, saved).
KNOWN_KEPT = 4096


class PostgresBase(PlannedWrites):
    """One process's store on a PostgreSQL database: what every group of its methods shares."""

    def __init__(self, pool: Pool, location: DatabaseLocation, audit_key: bytes | None) -> None:
        self._pool = pool
        self._key = audit_key
        self.location = location
        # The rows this process reserved in one statement, by (operation, lease owner): the answer
        # that follows is written in one trip if the row is still exactly that (see apply_answer).
        self._reserved: dict[tuple[str, str], StoredOperation] = {}
        # Each operation's row as this process last read or wrote it (see `_known_row`).
        self._known: OrderedDict[str, StoredOperation] = OrderedDict()
        # One transaction per provider at a time waits for its pace row (see `_pace_turn`).
        self._pace_turns: dict[str, anyio.Lock] = {}

    @asynccontextmanager
    async def _pace_turn(self, provider: str) -> AsyncGenerator[None]:
        """This process's turn at a provider's pace row: a lock held on it costs one connection, not the pool.

        The others wait here, holding no connection, at most lock_timeout (then the same error).
        """
        turn = self._pace_turns.setdefault(provider, anyio.Lock())
        with anyio.move_on_after(self._pool.lock_timeout) as waited:
            await turn.acquire()
        if waited.cancelled_caught:
            raise StoreError(
                f"PostgreSQL ({self.location.display}): the [fleet] pace row of provider {shown(provider)} "
                f"(fleet_buckets) stayed locked for more than {self._pool.lock_timeout:g} s (another check "
                "of this server was still waiting for it); nothing was changed and no request was sent — "
                "try again shortly, or end the session holding it (pg_stat_activity, pg_terminate_backend)"
            )
        try:
            yield
        finally:
            turn.release()

    per_operation_chains = True
    byte_order = ' COLLATE "C"'  # `audit.at` compared byte by byte, whatever the database's collation
    followup_order = "inserted"
    contains = "strpos"
    payload_count = "(a.payload::jsonb ->> 'count')::bigint"

    async def _carry_out_on(self, operation_id: str, plan_of: Callable[[OperationRecord], Plan]) -> Plan:
        """One transaction on the operation row locked first: `plan_of` the row as read, carried out."""
        async with self._locked(operation_id) as (writer, tx, cursor):
            current = operation(await tx.read(cursor), operation_id)
            plan = plan_of(current.record)
            await writer.carry_out(current, plan)
            return plan

    async def _read(self, statement: str, params: Mapping[str, object] | None = None) -> list[Row]:
        """One read statement outside a transaction (autocommit)."""
        return await self._pool.read(statement, params or {})

    def _remember(self, current: StoredOperation) -> None:
        """Keep `current` as the row this process knows last (bounded: the oldest go first)."""
        op_id = current.record.operation_id
        self._known[op_id] = current
        self._known.move_to_end(op_id)
        while len(self._known) > KNOWN_KEPT:
            self._known.popitem(last=False)

    def _forget(self, operation_id: str) -> None:
        self._known.pop(operation_id, None)

    @property
    def stats(self) -> EngineStats:
        """Round trips and commits since the store opened."""
        return self._pool.stats

    @asynccontextmanager
    async def _locked(
        self, operation_id: str | None = None, *, audit: bool = True, durable: bool = True
    ) -> AsyncGenerator[tuple[Writer, Tx, Any]]:
        """A transaction that locks the operation row first (and reads the audit head); yields the row's cursor."""
        async with self._pool.transaction(durable=durable) as tx:
            writer = Writer(tx, self._key)
            cursor = None
            if operation_id is not None:
                self._forget(operation_id)  # written on the locked row: read afresh next time
                cursor = await tx.queue(sql.LOCK_OPERATION, {"operation_id": operation_id})
            if audit:
                await writer.head_first()
            yield writer, tx, cursor
            await writer.finish()

    def _known_row(self, operation_id: str) -> StoredOperation | None:
        """The row as this process last saw it, while it is waiting (an escalated one's approvals
        live in other rows, read on every check)."""
        known = self._known.get(operation_id)
        return known if known is not None and known.record.status == Status.WAITING else None
