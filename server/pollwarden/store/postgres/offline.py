"""For the operator commands on PostgreSQL: re-key the audit; any other work on an opened store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

import anyio

from pollwarden.audit.chain import REKEY_KIND, REKEY_OPERATION, AuditError
from pollwarden.audit.entry import ChainHead, chain_row
from pollwarden.core.errors import StoreError
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.executor import seal_entries
from pollwarden.store.postgres.read_only import connect

if TYPE_CHECKING:
    from pollwarden.store.postgres.engine import PostgresStore

T = TypeVar("T")


def rekey(
    location: DatabaseLocation,
    key: bytes,
    *,
    at: datetime,
    payload_of: Callable[[list[list[object]]], dict[str, object]],
) -> int:
    """`pollwarden.audit.verify.rekey_chain` on PostgreSQL; the re-key row's seq.

    Locks the head's table (EXCLUSIVE: plain reads go on, every chain row waits), then the audit
    table against every insert (SHARE), in the order every writer takes them (an operation's first
    row locks the head before it touches the audit), and takes no row lock: nothing deadlocks with
    it. So nothing is appended while the unkeyed chain verifies and until the keyed re-key row
    commits, and appends waiting meanwhile then see the chain keyed. The re-key row seals every
    operation's chain not sealed yet (read under those locks), so their unkeyed rows are linked to
    it; the next seal names them again, which is harmless.
    """
    with connect(location) as conn, conn.transaction():
        conn.execute("LOCK TABLE audit_head IN EXCLUSIVE MODE")
        conn.execute("LOCK TABLE audit IN SHARE MODE")
        head = conn.execute(sql.READ_AUDIT_HEAD).fetchone()
        if head is None:
            raise AuditError(f"no audit head in {location.display}")
        moved = seal_entries(conn.execute(sql.MOVED_OPERATIONS).fetchall())
        row = chain_row(
            ChainHead(int(head[0]), str(head[1]), bool(head[2])),
            operation_id=REKEY_OPERATION,
            at=at,
            kind=REKEY_KIND,
            payload=payload_of(moved),
            key=key,
        )
        inserted = conn.execute(sql.INSERT_CHAIN_ROW + " RETURNING seq", vars(row)).fetchone()
        assert inserted is not None
        conn.execute(sql.SET_AUDIT_HEAD, {"seq": row.position, "hash": row.hash, "keyed": row.keyed})
        return int(inserted[0])


def on_store(
    location: DatabaseLocation,
    work: Callable[[PostgresStore], Awaitable[T]],
    *,
    audit_key: bytes | None,
    busy_timeout: float,
) -> tuple[T | None, str | None]:
    """Open the store and run `work` on it (an operator command: a seal, the refusals written before
    the story is read); (its result, None), or (None, why it could not)."""
    from pollwarden.audit.chain import AuditKeyError as KeyProblem
    from pollwarden.store.postgres.engine import open_postgres

    async def opened() -> T:
        async with open_postgres(location, audit_key=audit_key, busy_timeout=busy_timeout) as store:
            return await work(store)

    try:
        return anyio.run(opened), None
    except (StoreError, KeyProblem) as exc:
        return None, str(exc)
