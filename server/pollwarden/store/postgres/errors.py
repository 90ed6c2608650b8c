"""The PostgreSQL engine's error mapping: a driver error as the problem and its fix.

Its own module (psycopg, nothing of the store): the audit's offline readers use it too.
"""

from __future__ import annotations

import psycopg
import psycopg.errors
from psycopg_pool import PoolTimeout

from pollwarden.core.errors import StoreError
from pollwarden.store.location import DatabaseLocation


class GuardFailed(StoreError):
    """A guarded write found the row other than it was read; the transaction was rolled back."""


# What each table's locked row is, for the lock_timeout message (issue 29).
LOCKED_ROWS = {
    "fleet_buckets": "a provider's [fleet] pace row",
    "operations": "an operation's row",
    "audit_head": "the audit chain's head",
    "approvals": "an approval's row",
}


def locked_table(exc: BaseException) -> str | None:
    """The table whose row a lock_timeout error waited for (from its CONTEXT line), if it says."""
    context = getattr(getattr(exc, "diag", None), "context", None) or ""
    for table in LOCKED_ROWS:
        if f'relation "{table}"' in context:
            return table
    return None


def describe(
    exc: BaseException, location: DatabaseLocation, lock_timeout: float, holder: str | None = None
) -> StoreError:
    """A driver error as the problem and its fix; the transaction was rolled back (nothing changed).

    `holder`: for a lock_timeout, the session that holds the lock, as `Pool.lock_holder` found it.
    """
    where = location.display
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        table = locked_table(exc)
        what = "a row this call needed" if table is None else f"{LOCKED_ROWS[table]} ({table})"
        by = "another session" if holder is None else holder
        return StoreError(
            f"PostgreSQL ({where}): {what} stayed locked by {by} for more than {lock_timeout:g} s "
            "(lock_timeout); nothing was changed and no request was sent — try again shortly, or end "
            "the session holding it (pg_stat_activity, pg_terminate_backend)"
        )
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StoreError(
            f"PostgreSQL ({where}) cancelled a statement (statement_timeout or an operator's cancel); "
            "nothing was changed and no request was sent — try again, or raise statement_timeout for "
            "this role or database"
        )
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return StoreError(
            f"PostgreSQL ({where}) runs this session read-only (default_transaction_read_only, or a "
            "standby); nothing was changed and no request was sent — point --db at the primary, or "
            "turn read-only mode off"
        )
    if isinstance(exc, psycopg.errors.DivisionByZero):
        return GuardFailed(
            f"PostgreSQL ({where}): an operation row changed under this transaction's lock (a guarded "
            "write found another version); nothing was changed — try again"
        )
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return StoreError(
            f"PostgreSQL ({where}): the role may not do this ({_first_line(exc)}); nothing was changed — "
            "grant it, or connect as the role that owns pollwarden's tables"
        )
    if isinstance(exc, PoolTimeout | psycopg.OperationalError | psycopg.InterfaceError):
        return StoreError(
            f"cannot use PostgreSQL at {where} ({_first_line(exc)}); nothing was sent to the provider "
            "without a committed reservation — check that the server is up and reachable, then try "
            "again (pollwarden reconnects by itself)"
        )
    return StoreError(f"PostgreSQL error on {where}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
