"""The PostgreSQL engine's seam under `Store`: the pool, the rows this process knows, and flows run
on rows locked `FOR UPDATE` (`_transact`, `_drive`); `check_procedure` and `engine` build on it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pollwarden.audit.entry import NO_REFUSALS, OperationChain
from pollwarden.core.errors import StoreError
from pollwarden.core.vocabulary import Status
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.planned import Store, T
from pollwarden.store.plans import CountRefusal, Flush, Plan, Update
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.connection import EngineStats, Pool, Tx
from pollwarden.store.postgres.executor import Writer, operation
from pollwarden.store.postgres.pace_turn import PaceTurn, PaceTurnStuck
from pollwarden.store.reads import Row
from pollwarden.store.rows import StoredOperation
from pollwarden.store.transactions import (
    AboutTheChain,
    CarryOut,
    Flow,
    Locked,
    LockHead,
    LockPayload,
    Query,
    Queue,
    Request,
)
from pollwarden.surface.tool_errors import shown

# Reservations remembered for a one-trip answer (an entry is dropped when its answer comes).
RESERVED_KEPT = 256
# Operation rows remembered as this process last saw them (the check's first trip, saved).
KNOWN_KEPT = 4096


@dataclass
class Held:
    """A transaction a flow runs in: its writer, the locked row's cursor, the plans carried out."""

    writer: Writer
    tx: Tx
    cursor: Any
    lock: str | None
    carried: list[tuple[StoredOperation, Plan]]


class PostgresBase(Store):
    """One process's store on a PostgreSQL database: what every group of its methods shares."""

    def __init__(self, pool: Pool, location: DatabaseLocation, audit_key: bytes | None) -> None:
        self._pool = pool
        self._key = audit_key
        self.location = location
        self.stats: EngineStats = pool.stats  # round trips and commits since the store opened
        # The rows this process reserved in one statement, by (operation, lease owner): the answer
        # that follows is written in one trip if the row is still exactly that (see apply_answer).
        self._reserved: dict[tuple[str, str], StoredOperation] = {}
        # Each operation's row as this process last read or wrote it (see `_known_row`).
        self._known: OrderedDict[str, StoredOperation] = OrderedDict()
        # One transaction per provider at a time waits for its pace row (see `_pace_turn`).
        self._pace_turns: dict[str, PaceTurn] = {}

    @asynccontextmanager
    async def _pace_turn(self, provider: str) -> AsyncGenerator[None]:
        """This process's turn at a provider's pace row: a lock held on it costs one connection, not the pool.

        The others wait here, holding no connection, at most lock_timeout: then `PaceTurnBusy` when
        turns went by meanwhile (this process's checks come faster than they reach the row), else the
        lock_timeout error (the row, or the turn, is held).
        """
        turn = self._pace_turns.setdefault(provider, PaceTurn())
        try:
            async with turn.take(self._pool.lock_timeout):
                yield
        except PaceTurnStuck:
            raise StoreError(
                f"PostgreSQL ({self.location.display}): the [fleet] pace row of provider {shown(provider)} "
                f"(fleet_buckets) stayed locked for more than {self._pool.lock_timeout:g} s (another check "
                "of this server was still waiting for it); nothing was changed and no request was sent — "
                "try again shortly, or end the session holding it (pg_stat_activity, pg_terminate_backend)"
            ) from None

    per_operation_chains = True
    byte_order = ' COLLATE "C"'  # `audit.at` compared byte by byte, whatever the database's collation
    followup_order = "inserted"
    contains = "strpos"
    payload_count = "(a.payload::jsonb ->> 'count')::bigint"

    async def _transact(
        self, flow: Flow[T], *, lock: str | None = None, audit: bool = True, durable: bool = True
    ) -> T:
        """The flow as one transaction in pipeline mode: `lock`'s row locked first (`FOR UPDATE`), every
        request of a tuple sent in one trip. After the COMMIT, each row a plan left is known (`_known_row`)."""
        carried: list[tuple[StoredOperation, Plan]] = []
        async with self._locked(lock, audit=audit, durable=durable) as (writer, tx, cursor):
            result = await self._drive(flow, Held(writer, tx, cursor, lock, carried))
        for current, plan in carried:
            self._known_after(current, plan, writer.chain_of(current.record.operation_id))
        return result

    async def _drive(self, flow: Flow[T], held: Held | None = None) -> T:
        """Answer `flow`'s requests in the transaction `held` (None: its queries alone, each autocommit)."""

        async def send(request: Request) -> Any:
            if held is None:
                assert isinstance(request, Query), "outside a transaction a flow only reads"
                return await (self._pool.read if request.every else self._pool.read_one)(
                    request.statement, request.params
                )
            tx, writer = held.tx, held.writer
            if isinstance(request, Query):
                return await tx.queue(
                    request.statement + (" FOR UPDATE" if request.lock else ""), request.params
                )
            if isinstance(request, Queue):
                await tx.queue(request.statement, request.params)
            elif isinstance(request, CarryOut):
                self._forget(request.current.record.operation_id)
                held.carried.append((request.current, request.plan))
                return await writer.carry_out(request.current, request.plan)
            elif isinstance(request, LockPayload):
                await tx.queue(sql.LOCK_PAYLOAD, {"request_fingerprint": request.request_fingerprint})
            elif isinstance(request, LockHead):
                await writer.head_first(lock=True)
            elif isinstance(request, AboutTheChain):
                await writer.append_to_chain(request.entry)
            return None

        async def read(request: Request, sent: Any) -> Any:
            if held is None:
                return sent
            if isinstance(request, Locked):
                return operation(await held.tx.read(held.cursor), str(held.lock))
            if isinstance(request, Query):
                return await held.tx.read_all(sent) if request.every else await held.tx.read(sent)
            return sent

        reply: Any = None
        while True:
            try:
                asked = flow.send(reply)
            except StopIteration as done:
                return done.value
            requests = asked if isinstance(asked, tuple) else (asked,)
            sent = [await send(request) for request in requests]
            replies = [await read(request, s) for request, s in zip(requests, sent, strict=True)]
            reply = tuple(replies) if isinstance(asked, tuple) else replies[0]

    def _known_after(self, current: StoredOperation, plan: Plan, chain: OperationChain | None) -> None:
        """Remember the row a committed plan left, when the plan says exactly what it is."""
        if not plan.applied or any(isinstance(w, CountRefusal) for w in plan.writes):
            return
        record = plan.record if any(isinstance(w, Update) for w in plan.writes) else current.record
        flushed = any(isinstance(w, Flush) for w in plan.writes)
        self._remember(
            StoredOperation(record, NO_REFUSALS if flushed else current.refusals, chain or current.chain)
        )

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

    @asynccontextmanager
    async def _locked(
        self,
        operation_id: str | None = None,
        *,
        audit: bool = True,
        durable: bool = True,
        if_free: bool = False,
    ) -> AsyncGenerator[tuple[Writer, Tx, Any]]:
        """A transaction that locks the operation row first (and reads the audit head); yields the row's
        cursor (`if_free`: no row when another transaction holds it, instead of waiting)."""
        async with self._pool.transaction(durable=durable) as tx:
            writer = Writer(tx, self._key)
            cursor = None
            if operation_id is not None:
                self._forget(operation_id)  # written on the locked row: read afresh next time
                lock = sql.LOCK_OPERATION_IF_FREE if if_free else sql.LOCK_OPERATION
                cursor = await tx.queue(lock, {"operation_id": operation_id})
            if audit:
                await writer.head_first()
            yield writer, tx, cursor
            await writer.finish()

    def _known_row(self, operation_id: str) -> StoredOperation | None:
        """The row as this process last saw it, while it is waiting (an escalated one's approvals
        live in other rows, read on every check)."""
        known = self._known.get(operation_id)
        return known if known is not None and known.record.status == Status.WAITING else None
