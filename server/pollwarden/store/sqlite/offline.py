"""For the offline audit commands: bring the story up to date before it is read.

`pollwarden audit show` and `export` read the file read-only; refused calls
counted since the last audit row are written first (the summary rows), when
the file can be written. A read-only copy, a keyed chain without its key or a
file an older pollwarden wrote is read as it is, and the reason is returned.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path

from pollwarden.audit.chain import AuditKeyError
from pollwarden.core.errors import StoreError
from pollwarden.store import statements
from pollwarden.store.migrations.sqlite import up_to_date
from pollwarden.store.sqlite import executor, sql
from pollwarden.store.sqlite.connection import Database, Session
from pollwarden.store.transactions import flush_all


def flush_refusals_before_reading(path: Path, *, audit_key: bytes | None, busy_timeout: float) -> str | None:
    """Write every pending summary of refused calls; None when the story is complete, else why it is not."""
    if not path.is_file():
        return None  # the reader reports the missing file
    uri = f"file:{urllib.parse.quote(str(path.resolve()), safe='/')}?mode=rw"
    try:
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, timeout=busy_timeout, check_same_thread=False
        )
    except sqlite3.Error as exc:
        return f"cannot write to {path} ({exc})"
    try:
        if not up_to_date(conn):
            return None  # an older file: a server summarises its refusals when it opens it
        conn.execute(sql.busy_timeout(busy_timeout))
        conn.execute(sql.SYNCHRONOUS_FULL)
        if (
            conn.execute(statements.ANY_PENDING_REFUSALS).fetchone() is not None
        ):  # a quiet file: nothing written
            with Session(Database(conn, path, busy_timeout)).transaction():
                executor.run_flow(conn, flush_all(), None, audit_key)
    except (sqlite3.Error, StoreError, AuditKeyError) as exc:
        return str(exc)
    finally:
        conn.close()
    return None
