"""``pollwarden doctor``: check a deployment from the command line, one line per finding.

Checks the database (present, reachable, migrated; a SQLite file is only read,
never created, migrated or changed here; a PostgreSQL database is opened as a
server opens it), the
provider tables, each table's credential and webhook secret (present or not:
a value is never printed, not even its length), the operator keys, the audit
key against the chain, and this machine's clock against the database server's
(a skewed clock moves every deadline and allowed check it writes). Exit 0 when
nothing failed (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TextIO

import anyio

from pollwarden.audit.chain import audit_key_from_env, key_problem, open_read_only
from pollwarden.cli.options import add_database_options, require_existing_database, with_examples
from pollwarden.config import ServerConfig, load_config, load_provider_tables
from pollwarden.core.errors import PollwardenError
from pollwarden.store import DatabaseLocation, open_store
from pollwarden.store.sqlite.engine import SQLiteStore
from pollwarden_providers.table import ProviderTable

__all__ = ["MAX_SKEW_SECONDS", "Finding", "add_doctor_command", "diagnose", "table_findings"]

# Beyond this, deadlines and allowed checks written by this machine are visibly off for the others.
MAX_SKEW_SECONDS = 2.0

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    level: str  # ok, warn, FAIL
    topic: str
    detail: str

    def line(self) -> str:
        """As printed."""
        return f"{self.level:<4} {self.topic}: {self.detail}"


def table_findings(tables: Mapping[str, ProviderTable], environ: Mapping[str, str]) -> list[Finding]:
    """Each table's credential and webhook secret: set or missing, never its value."""
    found: list[Finding] = []
    for name, table in sorted(tables.items()):
        if table.auth is not None:
            env = table.auth.env
            if environ.get(env):
                found.append(Finding(OK, f"credential {name}", f"{env} is set"))
            else:
                found.append(
                    Finding(WARN, f"credential {name}", f"{env} is not set: checks on {name} will be refused")
                )
        if table.webhook is not None:
            env = table.webhook.secret_env
            if environ.get(env):
                found.append(Finding(OK, f"webhook secret {name}", f"{env} is set"))
            else:
                found.append(
                    Finding(WARN, f"webhook secret {name}", f"{env} is not set: its webhooks get 503")
                )
    return found


def _sqlite_findings(where: DatabaseLocation) -> list[Finding]:
    """A SQLite file read as it is, never written (no migration, no mode change): a server's, and how old."""
    found = _sqlite_database(where)
    if found.level == FAIL:
        return [found]
    return [found, Finding(OK, "clock", "SQLite on this machine: one clock")]


def _sqlite_database(where: DatabaseLocation) -> Finding:
    try:
        with open_read_only(where) as conn:
            has_operations = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'operations'"
            ).fetchone()
            version = int(conn.execute(SQLiteStore.schema_version_sql).fetchone()[0])
    except (PollwardenError, sqlite3.DatabaseError) as exc:
        return Finding(
            FAIL, "database", f"{where.path} is not a pollwarden database ({exc}); nothing was changed"
        )
    if has_operations is None:
        return Finding(FAIL, "database", f"{where.path} is not a pollwarden database (no operations table)")
    if version < SQLiteStore.latest_schema:
        behind = (
            f"{where.path} is at schema step {version}, this pollwarden needs {SQLiteStore.latest_schema}: "
            "the server migrates it when it starts (back the file up first)"
        )
        return Finding(WARN, "database", behind)
    return Finding(OK, "database", f"{where.path} is reachable and migrated (read, not written)")


async def _database_findings(config: ServerConfig, clock: Callable[[], float]) -> list[Finding]:
    where = config.database
    if where.is_sqlite:
        try:
            require_existing_database(where)
        except PollwardenError as exc:
            return [Finding(FAIL, "database", str(exc))]
        return await anyio.to_thread.run_sync(_sqlite_findings, where)
    try:
        async with open_store(where, busy_timeout_seconds=config.busy_timeout_seconds) as store:
            problem = await store.not_ready()
            if problem is not None:
                return [Finding(FAIL, "database", problem)]
            found = [Finding(OK, "database", f"{where} is reachable and migrated")]
            before = clock()
            server_now = await store.database_time()
            now = (before + clock()) / 2  # the middle of the round trip
    except PollwardenError as exc:
        return [Finding(FAIL, "database", str(exc))]
    if server_now is None:
        found.append(Finding(OK, "clock", "SQLite on this machine: one clock"))
    else:
        skew = now - server_now
        level = OK if abs(skew) <= MAX_SKEW_SECONDS else FAIL
        found.append(
            Finding(
                level,
                "clock",
                f"this machine is {skew:+.3f} s from the database server (max ±{MAX_SKEW_SECONDS:g})",
            )
        )
    return found


def diagnose(
    config: ServerConfig, environ: Mapping[str, str], clock: Callable[[], float] = time.time
) -> list[Finding]:
    """Every finding about this deployment (`clock`: this machine's, compared with the database server's)."""
    found = anyio.run(_database_findings, config, clock)
    database_ok = all(f.level != FAIL for f in found if f.topic == "database")
    try:
        tables = load_provider_tables(config)
        found.append(Finding(OK, "tables", f"{len(tables)} loaded: {', '.join(sorted(tables))}"))
        found += table_findings(tables, environ)
    except PollwardenError as exc:
        found.append(Finding(FAIL, "tables", str(exc)))
    keys = config.operator.keys
    if keys:
        found.append(Finding(OK, "operator keys", f"{len(keys)} public key(s) trusted"))
    elif config.operator.require_key:
        found.append(Finding(FAIL, "operator keys", "a key is required, but no public key is configured"))
    else:
        found.append(Finding(OK, "operator keys", "none configured: decisions are authenticated by terminal"))
    if database_ok:
        try:
            problem = key_problem(config.database, audit_key_from_env(environ))
        except PollwardenError as exc:
            problem = str(exc)
        found.append(
            Finding(FAIL, "audit key", problem) if problem else Finding(OK, "audit key", "matches the chain")
        )
    return found


def cmd_doctor(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Print the findings; 1 when any failed."""
    config = load_config(
        db=args.db,
        providers=args.providers or [],
        operator_pubkeys=args.operator_pubkeys,
        busy_timeout=args.busy_timeout,
    )
    findings = diagnose(config, os.environ)
    stream = out or sys.stdout
    for finding in findings:
        print(finding.line(), file=stream)
    return 1 if any(f.level == FAIL for f in findings) else 0


def add_doctor_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """Register ``pollwarden doctor``."""
    parser = sub.add_parser(
        "doctor",
        help="check a deployment: database, tables, credentials (never printed), keys, clock skew",
        description="Check what a server would use, without starting one or creating anything: exit 0 when "
        "nothing failed, 1 otherwise.",
    )
    add_database_options(parser)
    parser.add_argument(
        "--providers",
        action="append",
        metavar="DIR",
        help="a directory of provider *.toml tables, as for `serve`",
    )
    parser.add_argument(
        "--operator-pubkeys", metavar="FILE", help="the operator public keys the server trusts"
    )
    with_examples(parser, "pollwarden doctor --db ~/.local/share/pollwarden/pollwarden.db")
    parser.set_defaults(func=cmd_doctor)
