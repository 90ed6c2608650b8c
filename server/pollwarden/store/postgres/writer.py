"""What one locked PostgreSQL transaction writes: operation changes and audit rows, all queued.

A `Writer` works on rows its transaction locked (`… FOR UPDATE`): it computes
each new record in Python from the locked row and queues the UPDATE, guarded by
the version read (a guard that fails raises in SQL and aborts the transaction,
so nothing is committed — no extra trip to check a row count). Audit rows are
linked to the chain head, which the transaction also locks: appends from every
process form one chain. Everything queued goes to the server with the COMMIT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from pollwarden.audit_entry import AuditEvent, ChainHead, link, refusal_summary
from pollwarden.errors import StoreError
from pollwarden.records import OperationRecord
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.connection import Row, Tx
from pollwarden.store.sqlite.rows import StoredOperation, stored

# The version guard of a write to a locked row, stated in SQL: zero rows written divides by zero.
_GUARDED = "WITH written AS ({update} RETURNING 1) SELECT 1 / count(*) FROM written"


def operation(row: Row | None, operation_id: str) -> StoredOperation:
    """The locked operation row; rows are never deleted, so a missing one is a caller's error."""
    if row is None:
        raise StoreError(f"operation {operation_id!r} is not in the database")
    return stored(row)


class Writer:
    """The writes of one transaction on locked rows, queued until its COMMIT."""

    def __init__(self, tx: Tx, key: bytes | None) -> None:
        self.tx = tx
        self._key = key
        self._head_cursor: AsyncCursor[TupleRow] | None = None
        self._head: ChainHead | None = None
        self._head_read = False
        self._head_moved = False
        self._unreset: set[str] = set()

    async def lock_head(self) -> None:
        """Queue the lock of the audit head now (read with the transaction's first result)."""
        if self._head_cursor is None:
            self._head_cursor = await self.tx.queue(sql.LOCK_AUDIT_HEAD)

    async def append(self, entry: AuditEvent) -> int:
        """Append one row to the chain after the locked head; its seq."""
        if not self._head_read:
            await self.lock_head()
            assert self._head_cursor is not None
            head = await self.tx.read(self._head_cursor)
            if head is None:
                raise StoreError("the audit head row is missing; the database was not created by pollwarden")
            self._head = None if int(head[0]) == 0 else ChainHead(int(head[0]), str(head[1]), bool(head[2]))
            self._head_read = True
        row = link(self._head, entry, key=self._key)
        await self.tx.queue(sql.INSERT_AUDIT_ROW, dataclasses.asdict(row))
        self._head = ChainHead(row.seq, row.hash, row.keyed)
        self._head_moved = True
        return row.seq

    async def flush(self, current: StoredOperation) -> bool:
        """Append the pending summary of refused calls (if any); the counters reset with the next write."""
        pending = current.refusals
        if pending.count == 0:
            return False
        await self.append(refusal_summary(current.record, pending))
        self._unreset.add(current.record.operation_id)
        return True

    async def write(
        self, current: StoredOperation, changes: Mapping[str, Any], *, at: float
    ) -> OperationRecord:
        """Write `changes` to the locked operation (version + 1); the new record."""
        before = current.record
        op_id = before.operation_id
        reset = op_id in self._unreset
        self._unreset.discard(op_id)
        columns = tuple(changes)
        params: dict[str, object] = {f"c_{c}": v for c, v in changes.items()}
        params.update(operation_id=op_id, version=before.version, new_version=before.version + 1, at=at)
        update = sql.write_operation(columns, reset)
        await self.tx.queue(_GUARDED.format(update=update), params)
        return dataclasses.replace(before, **changes, version=before.version + 1, updated_at=at)

    async def finish(self) -> None:
        """Queue what is still owed: the counters of summarised refusals, and the chain head."""
        for op_id in sorted(self._unreset):
            await self.tx.queue(sql.RESET_REFUSALS, {"operation_id": op_id})
        self._unreset.clear()
        if self._head_moved and self._head is not None:
            await self.tx.queue(
                sql.SET_AUDIT_HEAD,
                {"seq": self._head.seq, "hash": self._head.hash, "keyed": self._head.keyed},
            )
