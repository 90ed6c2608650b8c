"""What one locked PostgreSQL transaction writes: operation changes and audit rows, all queued.

A `Writer` works on rows its transaction locked (`… FOR UPDATE`): it computes
each new record in Python from the locked row and queues the UPDATE, guarded by
the version read (a guard that fails raises in SQL and aborts the transaction,
so nothing is committed — no extra trip to check a row count). Audit rows are
linked to the chain head, which the transaction also locks: appends from every
process form one chain. Unkeyed, the row is linked and hashed by the statement
that inserts it, so the head is locked only from that statement to the COMMIT
sent with it; keyed, the head is locked with the transaction's first trip and
the HMAC computed here (the key never goes to the server). Everything queued
goes to the server with the COMMIT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from pollwarden.audit import AuditKeyError, key_mismatch
from pollwarden.audit_entry import AuditEvent, ChainHead, link, refusal_summary, unlinked
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

    async def head_first(self) -> None:
        """Queue the audit head's read now, to come back with the transaction's first result.

        Keyed, the head is locked here (the HMAC is computed in Python, from the head it read);
        unkeyed, it is only read, and locked by the append itself (`sql.APPEND_AUDIT_ROW`).
        """
        if self._head_cursor is None:
            query = sql.READ_AUDIT_HEAD if self._key is None else sql.LOCK_AUDIT_HEAD
            self._head_cursor = await self.tx.queue(query)

    async def _read_head(self) -> ChainHead | None:
        await self.head_first()
        assert self._head_cursor is not None
        head = await self.tx.read(self._head_cursor)
        if head is None:
            raise StoreError("the audit head row is missing; the database was not created by pollwarden")
        self._head_read = True
        return None if int(head[0]) == 0 else ChainHead(int(head[0]), str(head[1]), bool(head[2]))

    async def append(self, entry: AuditEvent, *, unread: bool = False) -> None:
        """Append one row to the chain after the head (one chain for every process).

        `unread` (unkeyed only): append without reading the head first; a keyed head then fails the
        statement's guard instead of raising `AuditKeyError` (the caller retries on the locked path).
        """
        if self._key is None:
            if not self._head_read and not unread:
                head = await self._read_head()
                problem = None if head is None else key_mismatch(head.seq, head.keyed, None)
                if problem is not None:
                    raise AuditKeyError(problem)
            await self.tx.queue(sql.APPEND_AUDIT_ROW, dataclasses.asdict(unlinked(entry)))
            await self.tx.queue(sql.MOVE_AUDIT_HEAD)
            return
        if not self._head_read:
            self._head = await self._read_head()
        row = link(self._head, entry, key=self._key)
        await self.tx.queue(sql.INSERT_AUDIT_ROW, dataclasses.asdict(row))
        self._head = ChainHead(row.seq, row.hash, row.keyed)
        self._head_moved = True

    async def flush(self, current: StoredOperation) -> bool:
        """Append the pending summary of refused calls (if any); the counters reset with the next write."""
        pending = current.refusals
        if pending.count == 0:
            return False
        await self.append(refusal_summary(current.record, pending))
        self._unreset.add(current.record.operation_id)
        return True

    async def write(
        self, current: StoredOperation, changes: Mapping[str, Any], *, at: float, owner: str | None = None
    ) -> OperationRecord:
        """Write `changes` to the locked operation (version + 1); the new record.

        With `owner`, the row need not be locked: the write holds only if the row is still at the
        version read, leased by `owner`, with no refused calls counted (else the transaction fails).
        """
        before = current.record
        op_id = before.operation_id
        reset = op_id in self._unreset
        self._unreset.discard(op_id)
        columns = tuple(changes)
        params: dict[str, object] = {f"c_{c}": v for c, v in changes.items()}
        params.update(operation_id=op_id, version=before.version, new_version=before.version + 1, at=at)
        if owner is not None:
            params["owner"] = owner
        update = sql.write_operation(columns, reset, unlocked=owner is not None)
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
