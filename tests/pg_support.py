"""PostgreSQL for the tests: one server from one environment variable, one schema per test, dropped after.

`POLLWARDEN_TEST_PG` (default postgresql://postgres@127.0.0.1:5432/test) names
the server and database. Each test's database is a schema of its own there,
selected with `search_path` in the URL, so every engine's tables are the test's
alone. When the server cannot be reached the PostgreSQL copies of the tests
skip with the reason (shown once in the summary), except under CI=1, where
they fail: in CI they must run.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from functools import cache
from pathlib import Path

import psycopg

PG_ENV = "POLLWARDEN_TEST_PG"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
START_HINT = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"

_created: set[str] = set()


def server_url() -> str:
    """The test server's URL."""
    return os.environ.get(PG_ENV) or DEFAULT_URL


def in_ci() -> bool:
    """CI=1: PostgreSQL tests must run, never skip."""
    return os.environ.get("CI", "") not in ("", "0", "false")


@cache
def unreachable() -> str | None:
    """Why the test server cannot be used, or None."""
    try:
        with psycopg.connect(server_url(), connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"PostgreSQL at {server_url()} ({PG_ENV}) is unreachable: {first}. Start it with: {START_HINT}"
    return None


def with_schema(url: str, schema: str) -> str:
    """`url` with `search_path` set to `schema` (libpq's options parameter)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    query = [(k, v) for k, v in query if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(
        parts._replace(query=urllib.parse.urlencode(query, quote_via=urllib.parse.quote))
    )


def schema_for(tmp: Path) -> str:
    """The schema of a test's directory (the same directory, the same database)."""
    return "pwt_" + hashlib.sha1(str(tmp).encode()).hexdigest()[:20]


def database_url(tmp: Path) -> str:
    """The URL of the test database for `tmp`, created on first use."""
    schema = schema_for(tmp)
    if schema not in _created:
        with psycopg.connect(server_url(), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.execute(f"CREATE SCHEMA {schema}")
        _created.add(schema)
    return with_schema(server_url(), schema)


def drop_schemas() -> None:
    """Drop every schema the test created."""
    if not _created:
        return
    with psycopg.connect(server_url(), autocommit=True) as conn:
        for schema in sorted(_created):
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    _created.clear()


def with_options(url: str, *settings: str) -> str:
    """`url` with more server settings in its options (e.g. ``statement_timeout=200``)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    options = " ".join([v for k, v in query if k == "options"] + [f"-c{s}" for s in settings])
    query = [(k, v) for k, v in query if k != "options"] + [("options", options)]
    return urllib.parse.urlunsplit(
        parts._replace(query=urllib.parse.urlencode(query, quote_via=urllib.parse.quote))
    )


def cluster_command(action: str) -> None:
    """Stop or start the local PostgreSQL 15 cluster (the fault tests stop it mid-run)."""
    import subprocess

    version = sorted(os.listdir("/etc/postgresql"))[-1]
    args = ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action]
    if action == "stop":
        args += ["-m", "fast"]
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def wait_until_reachable(seconds: float = 30.0) -> None:
    """Bounded wait for the server to accept connections again."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            with psycopg.connect(server_url(), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
