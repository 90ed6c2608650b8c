"""The store: what the controller asks of a database, in the controller's terms.

`Store` (`pollwarden.store.planned`, its reads `pollwarden.store.reads`) is the
whole interface: each method is one transaction on the engine (reserve a
request, apply an answer, count a refusal, stop, create, approve, append to the
audit), returning the record it wrote. `open_store` picks the engine from the
database location: SQLite (`store/sqlite/`, the embedded default) or PostgreSQL
(`store/postgres/`, the optional extra ``pollwarden[postgres]``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio.to_thread

from pollwarden.audit.chain import wrong_key
from pollwarden.core.errors import StoreError
from pollwarden.store.browse import MetricsSnapshot, OperationFacets, OperationFilter, OperationPage
from pollwarden.store.location import DatabaseLocation, Engine
from pollwarden.store.planned import Store
from pollwarden.store.sqlite.engine import open_sqlite

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_SECONDS",
    "DatabaseLocation",
    "Engine",
    "MetricsSnapshot",
    "OperationFacets",
    "OperationFilter",
    "OperationPage",
    "Store",
    "new_lease_owner",
    "open_store",
]

# How long a write waits for another process's lock before giving up with a clear error.
DEFAULT_BUSY_TIMEOUT_SECONDS = 5.0


def new_lease_owner() -> str:
    """A lease owner id for one call: this process's id (for a person reading the row) and a random part."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


@asynccontextmanager
async def open_store(
    location: DatabaseLocation | Path | str,
    *,
    audit_key: bytes | None = None,
    busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
) -> AsyncGenerator[Store]:
    """Open (creating and migrating) the database at `location`: a path, a URL, or a `DatabaseLocation`.

    With `audit_key`, a keyed chain must have been written with that key (`audit.chain.wrong_key`):
    `StoreError` otherwise, before anything is written.
    """
    where = location if isinstance(location, DatabaseLocation) else DatabaseLocation.parse(location)
    async with _opened(where, audit_key, busy_timeout_seconds) as store:
        if audit_key is not None and (problem := await anyio.to_thread.run_sync(wrong_key, where, audit_key)):
            raise StoreError(problem)
        yield store


@asynccontextmanager
async def _opened(
    where: DatabaseLocation, audit_key: bytes | None, busy_timeout_seconds: float
) -> AsyncGenerator[Store]:
    if where.engine == Engine.POSTGRES:
        try:
            from pollwarden.store.postgres.engine import open_postgres
        except ImportError as exc:
            raise StoreError(
                f"{where} is a PostgreSQL database, but the PostgreSQL driver is not installed ({exc.name}); "
                "install the extra; from a clone: .venv/bin/pip install -e '.[postgres]' (or pip install 'pollwarden[postgres]')"
            ) from None
        async with open_postgres(where, audit_key=audit_key, busy_timeout=busy_timeout_seconds) as pg:
            yield pg
        return
    async with open_sqlite(where, audit_key=audit_key, busy_timeout=busy_timeout_seconds) as store:
        yield store
