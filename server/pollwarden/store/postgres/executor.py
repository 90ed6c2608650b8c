"""What one PostgreSQL transaction writes: operation changes and audit rows, all queued.

A `Writer` works on rows its transaction locked (`… FOR UPDATE`, or the guarded
one-trip form): it computes each new record in Python from the row read, and
queues at `finish` one UPDATE per operation, guarded by the version read (a
guard that fails raises in SQL and aborts the transaction, so nothing is
committed — no extra trip to check a row count), then the audit rows.

Audit rows (`pollwarden.audit.verify`): an operation's first row is a chain row
— the transaction locks the one chain's head (`head_first(lock=True)`), links
and hashes the row here, and moves the head. Every later row of an operation is
an operation row: it follows the operation's own last row, which the locked
operation row records (`audit_rows`, `audit_hash`), so appends to different
operations never wait for each other; the head is only read (without a lock) to
refuse a key that does not match the chain. Hashes are computed here, keyed or
not: the key never goes to the database server. Everything queued goes to the
server with the COMMIT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from pollwarden.audit.chain import AuditKeyError, key_mismatch
from pollwarden.audit.entry import (
    NO_REFUSALS,
    REFUSALS_PER_SUMMARY,
    AuditEvent,
    ChainHead,
    ChainRow,
    OperationChain,
    PendingRefusals,
    link,
    link_in_operation,
    refusal_summary,
)
from pollwarden.core.errors import StoreError
from pollwarden.core.records import OperationRecord
from pollwarden.core.vocabulary import Outcome
from pollwarden.store import statements
from pollwarden.store.plans import Append, CountRefusal, Execute, Flush, HandSlot, Plan, Update
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.connection import Row, Tx
from pollwarden.store.rows import StoredOperation, stored

# The version guard of a write to a locked row, stated in SQL: zero rows written divides by zero.
_GUARDED = "WITH written AS ({update} RETURNING 1) SELECT 1 / count(*) FROM written"


def operation(row: Row | None, operation_id: str) -> StoredOperation:
    """The locked operation row; rows are never deleted, so a missing one is a caller's error."""
    if row is None:
        raise StoreError(f"operation {operation_id!r} is not in the database")
    return stored(row)


def seal_entries(rows: list[Row]) -> list[list[object]]:
    """`sql.SEAL_OPERATIONS`'s rows as a seal names them: ``[operation_id, rows, last hash]``, by id."""
    entries: list[list[object]] = [[str(op), int(n), str(last)] for op, n, last in rows]
    return sorted(entries, key=lambda entry: str(entry[0]))


def answer_statement(
    reserved: StoredOperation, plan: Plan, *, owner: str, key: bytes | None
) -> tuple[str, dict[str, object], StoredOperation]:
    """The answer `plan` to `owner`'s reservation of `reserved` as one statement: (SQL, parameters, the row after).

    The plan's `Update` is guarded by the row as reserved (still at its version, leased by `owner`, no
    refused call counted and no audit row written since: `sql.write_operation(…, unlocked=True)`); its
    audit row follows the operation's last row. If the guard fails, nothing is written
    (`sql.answer_statement`).
    """
    before = reserved.record
    if reserved.chain is None or reserved.chain.rows == 0:
        raise StoreError(f"operation {before.operation_id!r} was reserved without its audit chain")
    update = next(w for w in plan.writes if isinstance(w, Update))
    entry = next(w.entry for w in plan.writes if isinstance(w, Append))
    row = link_in_operation(reserved.chain, entry, key=key)
    params: dict[str, object] = {f"c_{c}": v for c, v in update.changes.items()}
    params.update(
        operation_id=before.operation_id,
        version=before.version,
        new_version=before.version + 1,
        at=update.at,
        owner=owner,
        rows_before=reserved.chain.rows,
        audit_rows=row.position,
        audit_hash=row.hash,
    )
    params.update({f"a_{name}": value for name, value in vars(row).items()})
    after = StoredOperation(plan.record, NO_REFUSALS, OperationChain(row.position, row.hash))
    return sql.answer_statement(tuple(update.changes)), params, after


@dataclass
class _Pending:
    """What this transaction owes one operation's row at `finish`."""

    before: StoredOperation
    changes: dict[str, Any] = field(default_factory=dict[str, Any])
    new_version: int | None = None
    at: float = 0.0
    reset_refusals: bool = False
    chain_moved: bool = False


class Writer:
    """The writes of one transaction on locked rows, queued until its COMMIT."""

    def __init__(self, tx: Tx, key: bytes | None) -> None:
        self.tx = tx
        self._key = key
        self._head_cursor: AsyncCursor[TupleRow] | None = None
        self._head_locked = False
        self._head: ChainHead | None = None
        self._head_read = False
        self._head_moved = False
        self._pending: dict[str, _Pending] = {}
        # Each operation's audit chain as this transaction's rows leave it (kept across `finish`).
        self._chains: dict[str, OperationChain] = {}
        # Audit rows to insert at `finish`, after the operation rows: an operation row takes its seq
        # only once its operation's row is locked (or its guarded write waited for the lock).
        self._rows: list[tuple[str, ChainRow]] = []

    async def head_first(self, *, lock: bool = False) -> None:
        """Queue the chain head's read now, to come back with the transaction's first result.

        `lock`: this transaction appends a chain row (an operation's first), so the head is locked
        (FOR UPDATE) until the COMMIT; otherwise it is only read, to check the key against it.
        """
        if self._head_cursor is None:
            self._head_cursor = await self.tx.queue(sql.LOCK_AUDIT_HEAD if lock else sql.READ_AUDIT_HEAD)
            self._head_locked = lock

    async def _read_head(self, *, lock: bool) -> ChainHead | None:
        if lock and self._head_cursor is not None and not self._head_locked:
            # Read without the lock: lock it and read it again now (a chain row no one expected; the
            # head read before may have moved since).
            self._head_cursor = None
            self._head_read = False
        await self.head_first(lock=lock)
        assert self._head_cursor is not None
        if not self._head_read:
            head = await self.tx.read(self._head_cursor)
            if head is None:
                raise StoreError("the audit head row is missing; the database was not created by pollwarden")
            self._head = None if int(head[0]) == 0 else ChainHead(int(head[0]), str(head[1]), bool(head[2]))
            self._head_read = True
        return self._head

    def _entry(self, current: StoredOperation) -> _Pending:
        op_id = current.record.operation_id
        pending = self._pending.get(op_id)
        if pending is None:
            pending = self._pending[op_id] = _Pending(current)
        return pending

    async def append(self, entry: AuditEvent, *, on: StoredOperation) -> None:
        """Append one row about `on`'s operation: its first as a chain row, any later one after its own last.

        The head is read (without a lock) to refuse a key that does not match the chain, with the fix.
        """
        pending = self._entry(on)
        chain = self._chains.get(entry.operation_id) or on.chain
        if chain is None:
            raise StoreError(f"operation {entry.operation_id!r} was read without its audit chain")
        if chain.rows == 0:
            await self.append_to_chain(entry)
            assert self._head is not None
            row = self._rows[-1][1]
        else:
            head = await self._read_head(lock=False)
            problem = None if head is None else key_mismatch(head.seq, head.keyed, self._key)
            if problem is not None:
                raise AuditKeyError(problem)
            row = link_in_operation(chain, entry, key=self._key)
            self._rows.append((sql.INSERT_OPERATION_ROW, row))
        # A chain row's position is its place in the one chain; the operation counts its own rows.
        self._chains[entry.operation_id] = OperationChain(chain.rows + 1, row.hash)
        pending.chain_moved = True

    def chain_of(self, operation_id: str) -> OperationChain | None:
        """An operation's audit chain as this transaction's rows leave it (None: no row written for it)."""
        return self._chains.get(operation_id)

    async def append_to_chain(self, entry: AuditEvent) -> None:
        """Append a row about the chain itself (a seal): a chain row of no operation."""
        row = link(await self._read_head(lock=True), entry, key=self._key)
        self._rows.append((sql.INSERT_CHAIN_ROW, row))
        self._head = ChainHead(row.position, row.hash, row.keyed)
        self._head_moved = True

    async def flush(self, current: StoredOperation) -> bool:
        """Append the pending summary of refused calls (if any); the counters reset with the next write."""
        refusals = current.refusals
        if refusals.count == 0 or self._entry(current).reset_refusals:
            return False
        await self.append(refusal_summary(current.record, refusals), on=current)
        self._entry(current).reset_refusals = True
        return True

    async def carry_out(self, current: StoredOperation, plan: Plan) -> OperationRecord:
        """Queue `plan`'s writes, made from `current` (a row this transaction locked); the record it leaves."""
        for write in plan.writes:
            if isinstance(write, Flush):
                await self.flush(current)
            elif isinstance(write, Update):
                await self.write(current, write.changes, at=write.at)
            elif isinstance(write, Append):
                await self.append(write.entry, on=current)
            elif isinstance(write, CountRefusal):
                await self._count_refusal(current, write.outcome, write.at)
            elif isinstance(write, Execute):
                await self.tx.queue(write.statement, write.params)
            elif isinstance(write, HandSlot):
                statement = sql.HAND_SLOT if write.after is None else sql.HAND_SLOT_AFTER
                await self.tx.queue(statement, write.params())
            else:  # SetPace
                await self.tx.queue(
                    sql.SET_FLEET_TAT,
                    {"provider": write.provider, "tat": write.tat, "sent_tat": write.sent_tat},
                )
        return plan.record

    async def _count_refusal(self, current: StoredOperation, outcome: Outcome, at: float) -> None:
        """Count one refused call on the locked row, writing the summary rows that are due."""
        pending = current.refusals
        if pending.must_flush_before(outcome):
            await self.flush(current)
            await self.finish()  # the counters reset before this call is counted
            pending = NO_REFUSALS
        after = PendingRefusals(pending.count + 1, outcome, pending.first_at if pending.count else at, at)
        if after.count >= REFUSALS_PER_SUMMARY:
            await self.flush(dataclasses.replace(current, refusals=after))
            return
        counters = {
            "count": after.count,
            "outcome": outcome,
            "first_at": after.first_at,
            "last_at": after.last_at,
        }
        await self.tx.queue(sql.SET_REFUSALS, {**counters, "operation_id": current.record.operation_id})

    async def write(
        self, current: StoredOperation, changes: Mapping[str, Any], *, at: float
    ) -> OperationRecord:
        """Write `changes` to the locked operation (version + 1, queued until `finish`); the new record."""
        before = current.record
        pending = self._entry(current)
        if pending.new_version is not None:
            raise StoreError(f"operation {before.operation_id!r} written twice in one transaction")
        pending.changes = dict(changes)
        pending.new_version = before.version + 1
        pending.at = at
        return dataclasses.replace(before, **changes, version=before.version + 1, updated_at=at)

    async def finish(self) -> None:
        """Queue what is still owed: each operation's row (its changes, its refusal counters, its audit
        chain), and the chain head."""
        for op_id in sorted(self._pending):
            pending = self._pending.pop(op_id)
            await self._queue_row(op_id, pending)
        for statement, row in self._rows:
            await self.tx.queue(statement, vars(row))
        self._rows.clear()
        if self._head_moved and self._head is not None:
            head = {"seq": self._head.seq, "hash": self._head.hash, "keyed": self._head.keyed}
            await self.tx.queue(sql.SET_AUDIT_HEAD, head)
            self._head_moved = False

    async def _queue_row(self, op_id: str, pending: _Pending) -> None:
        chain: dict[str, object] = {}
        if pending.chain_moved:
            now = self._chains[op_id]
            chain = {"audit_rows": now.rows, "audit_hash": now.hash}
        if pending.new_version is None:
            if chain or pending.reset_refusals:
                statement = sql.move_chain(pending.reset_refusals) if chain else statements.RESET_REFUSALS
                await self.tx.queue(statement, {"operation_id": op_id, **chain})
            return
        before = pending.before
        params: dict[str, object] = {f"c_{c}": v for c, v in pending.changes.items()}
        params.update(
            operation_id=op_id, version=before.record.version, new_version=pending.new_version, at=pending.at
        )
        params.update(chain)
        update = sql.write_operation(tuple(pending.changes), pending.reset_refusals, bool(chain))
        await self.tx.queue(_GUARDED.format(update=update), params)
