"""A read-only session for the audit's offline readers (`pollwarden.audit.chain`) on PostgreSQL.

The audit readers write their SQL with ``?`` placeholders for SQLite; `read_only` gives them a
read-only session that takes the same statements. Nothing here prints the URL's password.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from contextlib import contextmanager
from typing import Any, LiteralString, cast

import psycopg
from psycopg.rows import TupleRow

from pollwarden.core.errors import AuditError
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.postgres.errors import describe


class ReadOnlySession:
    """A read-only PostgreSQL session that runs the audit readers' ``?`` statements."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[TupleRow]:
        """Run one statement (``?`` placeholders) and return its cursor."""
        return self._conn.execute(cast("LiteralString", sql.replace("?", "%s")), list(parameters))


def connect(location: DatabaseLocation) -> psycopg.Connection[TupleRow]:
    try:
        return psycopg.connect(location.dsn, autocommit=True, application_name="pollwarden-audit")
    except psycopg.Error as exc:
        raise AuditError(str(describe(exc, location, 5.0))) from None


@contextmanager
def read_only(location: DatabaseLocation) -> Generator[ReadOnlySession]:
    """A read-only session on the database, every read in one snapshot (a verification sees rows and
    the operations' records of them as of one moment); AuditError when it cannot be reached or has no audit."""
    with connect(location) as conn:
        try:
            conn.execute(
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
            )
            conn.execute("SELECT 1 FROM audit LIMIT 1").fetchall()
        except psycopg.Error as exc:
            raise AuditError(f"no readable audit table in {location.display}: {exc}") from None
        with conn.transaction():
            yield ReadOnlySession(conn)
