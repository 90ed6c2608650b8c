"""For the operator commands on PostgreSQL: read the audit read-only, re-key it, flush refusals.

The audit readers (`pollwarden.audit`) write their SQL with ``?``
placeholders for SQLite; `read_only` gives them a read-only session that takes
the same statements. Nothing here prints the URL's password.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, LiteralString, cast

import anyio
import psycopg
from psycopg.rows import TupleRow

from pollwarden.audit import (
    REKEY_KIND,
    REKEY_OPERATION,
    AuditError,
    refuse_unless_rekeyable,
    verify_chain,
)
from pollwarden.audit_entry import ChainHead, chain_row
from pollwarden.errors import StoreError
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.connection import describe


class ReadOnlySession:
    """A read-only PostgreSQL session that runs the audit readers' ``?`` statements."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[TupleRow]:
        """Run one statement (``?`` placeholders) and return its cursor."""
        return self._conn.execute(cast("LiteralString", sql.replace("?", "%s")), list(parameters))


def _connect(location: DatabaseLocation) -> psycopg.Connection[TupleRow]:
    try:
        return psycopg.connect(location.dsn, autocommit=True, application_name="pollwarden-audit")
    except psycopg.Error as exc:
        raise AuditError(str(describe(exc, location, 5.0))) from None


@contextmanager
def read_only(location: DatabaseLocation) -> Generator[ReadOnlySession]:
    """A read-only session on the database; AuditError when it cannot be reached or has no audit."""
    with _connect(location) as conn:
        try:
            conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            conn.execute("SELECT 1 FROM audit LIMIT 1").fetchall()
        except psycopg.Error as exc:
            raise AuditError(f"no readable audit table in {location.display}: {exc}") from None
        yield ReadOnlySession(conn)


def rekey(location: DatabaseLocation, key: bytes, *, by: str, at: datetime) -> int:
    """`pollwarden.audit.rekey_chain` on PostgreSQL: verify under the head's lock, then append the re-key row."""
    with _connect(location) as conn, conn.transaction():
        head = conn.execute(sql.LOCK_AUDIT_HEAD).fetchone()
        if head is None:
            raise AuditError(f"no audit head in {location.display}")
        result = verify_chain(location, None)
        refuse_unless_rekeyable(result)
        row = chain_row(
            ChainHead(int(head[0]), str(head[1]), bool(head[2])),
            operation_id=REKEY_OPERATION,
            at=at,
            kind=REKEY_KIND,
            payload={
                "decision": REKEY_KIND,
                "note": f"re-keyed by {by}: rows after this one are HMAC-keyed",
                "by": by,
                "unkeyed_rows": result.head_seq,
                "unkeyed_head_hash": result.head_hash,
            },
            key=key,
        )
        conn.execute(sql.INSERT_AUDIT_ROW, row.__dict__)
        conn.execute(sql.SET_AUDIT_HEAD, {"seq": row.seq, "hash": row.hash, "keyed": row.keyed})
        return row.seq


def flush_refusals_before_reading(
    location: DatabaseLocation, *, audit_key: bytes | None, busy_timeout: float
) -> str | None:
    """Write every pending summary of refused calls; None when the story is complete, else why it is not."""
    from pollwarden.audit import AuditKeyError as KeyProblem
    from pollwarden.store.postgres.engine import open_postgres

    async def flush() -> None:
        async with open_postgres(location, audit_key=audit_key, busy_timeout=busy_timeout) as store:
            await store.flush_refusals()

    try:
        anyio.run(flush)
    except (StoreError, KeyProblem) as exc:
        return str(exc)
    return None
