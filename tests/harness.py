"""Test harness: provider tables for the fake provider, and a server on an injected clock."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mcp.client import Client
from mcp_types import CallToolResult

import pg_support
from pollwarden.access.operator_keys import PUBKEYS_ENV, OperatorPolicy, generate_key_file, load_public_keys
from pollwarden.config import ServerConfig
from pollwarden.core.clock import FakeClock, RandomSource
from pollwarden.core.records import OperationRecord
from pollwarden.core.vocabulary import Category, DelaySource, Status
from pollwarden.provider_io.provider_http import HttpLimits
from pollwarden.store import DatabaseLocation, Engine
from pollwarden.surface.server import build_server, controller_factory
from pollwarden_providers import ProviderTable, TableError, load_table
from tests.support.fake_provider import FakeProvider
from tests.support.live import ALL_RESPONSE_FIELDS, fake_provider_table, table_toml, write_table

# The engine the running test stores its records in: conftest's `database_engine`
# fixture sets it, once per engine, for every store-touching test.
_current_engine = Engine.SQLITE


def use_engine(engine: Engine) -> None:
    """Run the harness's servers on `engine` (set per test by conftest)."""
    global _current_engine
    _current_engine = engine


def current_engine() -> Engine:
    """The engine the running test stores its records in."""
    return _current_engine


def database_in(tmp: Path) -> DatabaseLocation:
    """The test's database on the current engine: a SQLite file in `tmp`, or a PostgreSQL schema of its own."""
    if _current_engine == Engine.POSTGRES:
        return DatabaseLocation.postgres(pg_support.database_url(tmp))
    return DatabaseLocation.sqlite(tmp / "pollwarden.db")


def base_table(base_url: str, name: str = "acme") -> dict[str, Any]:
    """A provider table for the fake provider with a small, fast schedule, submit and a 404 grace window."""
    return {
        **fake_provider_table(
            name,
            base_url,
            response=ALL_RESPONSE_FIELDS,
            schedule={"base_delay_seconds": 5, "max_delay_seconds": 120},
            limits={
                "default_deadline_seconds": 2400,
                "max_deadline_seconds": 86400,
                "default_max_status_requests": 12,
                "max_status_requests": 200,
                "max_transport_failures": 3,
                "max_rate_limited": 3,
            },
        ),
        "submit": {
            "path": "/v1/jobs",
            "method": "POST",
            "idempotency_header": "Idempotency-Key",
            "job_id_field": "id",
        },
        "not_found": {"grace_seconds": 30},
    }


def acme_table(tmp_path: Path, overrides: Mapping[str, Any]) -> ProviderTable:
    """The `acme` table (on https://api.acme.example) with `overrides`, written to TOML and loaded."""
    path = tmp_path / "acme.toml"
    path.write_text(table_toml(merge(base_table("https://api.acme.example"), overrides)))
    return load_table(path)


def acme_refusal(tmp_path: Path, overrides: Mapping[str, Any]) -> TableError:
    """The TableError refusing the `acme` table with `overrides` (fails if it loads)."""
    try:
        acme_table(tmp_path, overrides)
    except TableError as error:
        return error
    raise AssertionError("the table loaded, but a refusal was expected")


def merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `overrides` into a copy of `base`; a None value deletes the key."""
    out = json.loads(json.dumps(base))
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)  # type: ignore[arg-type]
        else:
            out[key] = value
    return out


# The harness's servers draw their jitter from real, seeded random numbers: a server that never
# jitters (or always waits the full delay) fails the tests that check times. A test that pins
# exact times chooses its draws explicitly (`SteppedRandom`, or its own seed).
HARNESS_SEED = 20250418


class SteppedRandom:
    """A random source that returns the given values in turn (then repeats the last)."""

    def __init__(self, *values: float) -> None:
        self.values = list(values) or [0.5]
        self.i = 0

    def random(self) -> float:
        value = self.values[min(self.i, len(self.values) - 1)]
        self.i += 1
        return value


def full_delays() -> SteppedRandom:
    """Jitter draws of 1.0: every delay is its raw maximum. For a test that pins exact times."""
    return SteppedRandom(1.0)


@dataclass
class Harness:
    """A server on a fake clock, its database, and the fake provider it talks to."""

    tmp: Path
    fake: FakeProvider
    clock: FakeClock
    rng: RandomSource
    table: dict[str, Any]
    environ: dict[str, str] = field(default_factory=dict[str, str])
    http_limits: HttpLimits | None = None  # caps on provider requests (None: the defaults)
    approval_mode: str = "elicitation"
    app_channel: bool = False  # Approve/Deny on the MCP App card (`--approval app`)
    operator: OperatorPolicy = field(default_factory=OperatorPolicy)  # operator public keys, key required
    busy_timeout_seconds: float = 5.0  # how long a write waits for another session's lock
    database_override: DatabaseLocation | None = None  # another location than the test's own
    tasks: bool = False  # serve MCP Tasks (`serve --tasks`)

    @property
    def database(self) -> DatabaseLocation:
        return self.database_override or database_in(self.tmp)

    @property
    def db_path(self) -> Any:
        """The SQLite file (the audit readers and the CLI open it directly); on PostgreSQL, the location."""
        where = self.database
        return where.path if where.is_sqlite else where

    @property
    def tables_dir(self) -> Path:
        return self.tmp / "tables"

    def config(self) -> ServerConfig:
        return ServerConfig(
            database=self.database,
            provider_dirs=(self.tables_dir,),
            approval_mode=self.approval_mode,  # type: ignore[arg-type]
            app_channel=self.app_channel,
            operator=self.operator,
            busy_timeout_seconds=self.busy_timeout_seconds,
        )

    def server(self) -> Any:
        write_table(self.tables_dir, self.table)
        factory = controller_factory(
            self.config(), clock=self.clock, rng=self.rng, environ=self.environ, http_limits=self.http_limits
        )
        return build_server(factory, tasks=self.tasks)

    @asynccontextmanager
    async def client(self, **client_kwargs: Any) -> AsyncGenerator[Client]:
        """An in-process SDK client (2026-07-28 by default; mode='legacy' for the handshake era)."""
        async with Client(self.server(), **client_kwargs) as client:
            yield client


def make_harness(
    tmp: Path,
    fake: FakeProvider,
    *,
    table: Mapping[str, Any] | None = None,
    rng: RandomSource | None = None,
    clock: FakeClock | None = None,
    environ: dict[str, str] | None = None,
    http_limits: HttpLimits | None = None,
) -> Harness:
    """A harness whose provider table `acme` points at `fake`; jitter drawn from `random.Random(HARNESS_SEED)` by default."""
    return Harness(
        tmp=tmp,
        fake=fake,
        clock=clock or FakeClock(),
        rng=rng or random.Random(HARNESS_SEED),
        table=merge(base_table(fake.base_url), table or {}),
        environ=environ or {},
        http_limits=http_limits,
    )


def view(result: CallToolResult) -> dict[str, Any]:
    """The structured output of a tool call, failing loudly on a tool error."""
    assert not result.is_error, f"tool error: {result.content}"
    assert isinstance(result.structured_content, dict)
    return result.structured_content  # type: ignore[return-value]


def error_text(result: CallToolResult) -> str:
    """The text of a tool error."""
    assert result.is_error, f"expected a tool error, got {result.structured_content}"
    return " ".join(getattr(block, "text", "") for block in result.content)


async def track(client: Any, job_id: str, **extra: Any) -> dict[str, Any]:
    """start_operation on provider `acme` tracking `job_id` as operation `op-<job_id>`."""
    args = {"provider": "acme", "operation_id": f"op-{job_id}", "provider_job_id": job_id, **extra}
    return view(await client.call_tool("start_operation", args))


async def check(client: Any, job_id: str, wait: float = 0) -> dict[str, Any]:
    """One check_status on `op-<job_id>`; `wait` lets the server wait (on the fake clock) for the allowed time."""
    args = {"operation_id": f"op-{job_id}", "wait_seconds": wait}
    return view(await client.call_tool("check_status", args))


@dataclass(frozen=True)
class Operator:
    """An operator key pair, as `pollwarden operator-key init` makes it, and the public keys file."""

    key_file: Path
    pubkeys_file: Path

    def policy(self, *, require_key: bool = False) -> OperatorPolicy:
        """The server's view: these public keys, a signature required or not."""
        return OperatorPolicy(keys=load_public_keys(self.pubkeys_file), require_key=require_key)

    def env(self) -> dict[str, str]:
        """The environment `pollwarden approve` needs to accept this key."""
        return {PUBKEYS_ENV: str(self.pubkeys_file)}


def make_operator(directory: Path, name: str = "operator") -> Operator:
    """An operator key in `directory` (made on first use) and a public keys file listing it."""
    directory.mkdir(parents=True, exist_ok=True)
    key_file = directory / f"{name}.key"
    pubkeys = directory / f"{name}.pubkeys"
    if not key_file.exists():
        public = generate_key_file(key_file, f"{name} (test)")
        pubkeys.write_text(public.line() + "\n")
    return Operator(key_file, pubkeys)


def provider_table(overrides: Mapping[str, Any] | None = None) -> ProviderTable:
    """The `acme` table on http://127.0.0.1:9 (nothing listens there) with `overrides`, built in code."""
    return ProviderTable.model_validate(merge(base_table("http://127.0.0.1:9"), overrides or {}))


def operation_record(**changes: Any) -> OperationRecord:
    """An `OperationRecord` of provider `acme` (started at 1000.0, deadline 3400.0, 12 requests) with `changes`."""
    base = OperationRecord(
        operation_id="op",
        provider="acme",
        provider_job_id="job-1",
        account_context="http://127.0.0.1:9 as anonymous",
        request_fingerprint="f",
        idempotency_key=None,
        expected_terminal_state="succeeded",
        status=Status.WAITING,
        stop_reason=None,
        stop_detail=None,
        state="running",
        category=Category.PENDING,
        started_at=1000.0,
        deadline_at=3400.0,
        business_deadline_at=None,
        max_status_requests=12,
        max_transport_failures=3,
        max_rate_limited=3,
        status_requests_used=12,
        transport_failures_used=0,
        rate_limited_used=0,
        polls_completed=12,
        next_check_at=1005.0,
        delay_source=DelaySource.LOCAL_BACKOFF,
        retry_after_seconds=None,
        last_http_status=200,
        last_http_at=1500.0,
        provider_request_id=None,
        provider_expires_at=None,
        error=None,
        result_json=None,
        lease_owner=None,
        lease_expires_at=None,
        extensions_used=0,
        stopped_at=1500.0,
        submit_payload_json=None,
        created_at=1000.0,
        updated_at=1500.0,
        version=5,
        fleet_slot_at=None,
    )
    return replace(base, **changes)


def polling_record(now: float = 1500.0, **changes: Any) -> OperationRecord:
    """A waiting `operation_record` as `interpret_status_answer` sees it: reloaded under the lease, this
    request counted (3 used, 2 polls completed), the lease held until `now` + 60."""
    base: dict[str, Any] = {
        "status": Status.WAITING,
        "stop_reason": None,
        "stopped_at": None,
        "status_requests_used": 3,
        "polls_completed": 2,
        "lease_owner": "me",
        "lease_expires_at": now + 60,
    }
    return operation_record(**{**base, **changes})


def _connect(db: Path | DatabaseLocation) -> Any:
    """A plain connection to the test's database, SQLite or PostgreSQL (autocommit)."""
    if isinstance(db, DatabaseLocation) and not db.is_sqlite:
        import psycopg

        return psycopg.connect(db.dsn, autocommit=True)
    path = db.path if isinstance(db, DatabaseLocation) else db
    return sqlite3.connect(path, isolation_level=None, timeout=10)


def _placeholders(db: Path | DatabaseLocation, sql: str) -> str:
    return sql.replace("?", "%s") if isinstance(db, DatabaseLocation) and not db.is_sqlite else sql


def db_rows(db: Path | DatabaseLocation, sql: str, *params: object) -> list[dict[str, Any]]:
    """Rows of one statement (``?`` placeholders) on either engine, as dicts: what the test reads directly."""
    conn = _connect(db)
    try:
        cursor = conn.execute(_placeholders(db, sql), params)
        names = [str(d[0]) for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        conn.close()


def db_write(db: Path | DatabaseLocation, sql: str, *params: object) -> None:
    """One statement written by hand (what someone with write access to the database could do)."""
    conn = _connect(db)
    try:
        conn.execute(_placeholders(db, sql), params)
    finally:
        conn.close()


def db_snapshot(db: Path | DatabaseLocation) -> tuple[Any, ...]:
    """Every table's rows, in a stable order: what a refused call must leave as it was (one connection)."""
    postgres = isinstance(db, DatabaseLocation) and not db.is_sqlite
    listing = (
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1"
        if postgres
        else "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
    )
    conn = _connect(db)
    try:
        tables = [str(row[0]) for row in conn.execute(listing).fetchall()]
        return tuple(
            (table, sorted(map(repr, conn.execute(f'SELECT * FROM "{table}"').fetchall())))
            for table in tables
        )
    finally:
        conn.close()
