"""PostgreSQL for the tests: one server from one environment variable, one schema per test, dropped after.

`POLLWARDEN_TEST_PG` (default postgresql://postgres@127.0.0.1:5432/test) names
the server and database. Each test's database is a schema of its own there,
selected with `search_path` in the URL, so every engine's tables are the test's
alone. When the server cannot be reached the PostgreSQL copies of the tests
skip with the reason (shown once in the summary), except under CI=1, where
they fail: in CI they must run.

Under pytest-xdist each worker has a database of its own on that server,
`<database>_<worker>` (test_gw0, test_gw1, ...), its test schemas inside it. A
schema is not enough between processes running at once: advisory locks are per
database, and a payload's lock is keyed by its fingerprint alone (the migration
lock is per schema), so a test in one schema could wait on, or time out behind,
a test of another worker. A worker's database is created from template0 the
first time it is needed and then kept for later runs: dropping one costs
PostgreSQL a checkpoint (seconds to tens of seconds at the end of a busy run),
and what is in it, the test schemas, is dropped after each test anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import psycopg
from psycopg import sql

from tests.support.parallel import xdist_worker
from tests.support.ports import free_port

PG_ENV = "POLLWARDEN_TEST_PG"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
START_HINT = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"

_created: set[str] = set()


def configured_url() -> str:
    """The server and database `POLLWARDEN_TEST_PG` names."""
    return os.environ.get(PG_ENV) or DEFAULT_URL


def worker_database() -> str:
    """The database of this xdist worker: the configured one's name and the worker's id."""
    base = urllib.parse.unquote(urllib.parse.urlsplit(configured_url()).path.lstrip("/")) or "pollwarden"
    suffix = f"_{xdist_worker()}"
    return base[: 63 - len(suffix)] + suffix  # PostgreSQL keeps 63 bytes of a name


def with_database(url: str, database: str) -> str:
    """`url` naming `database` instead of its own."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(database)))


def server_url() -> str:
    """The URL the tests' schemas live under: the configured database, or this xdist worker's own."""
    if xdist_worker() is None:
        return configured_url()
    return with_database(configured_url(), worker_database())


def in_ci() -> bool:
    """CI=1: PostgreSQL tests must run, never skip."""
    return os.environ.get("CI", "") not in ("", "0", "false")


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _create_worker_database(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    name = worker_database()
    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None:
        return
    # Another run's worker of the same id may create it at the same moment: then it exists, as wanted.
    with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))


@cache
def unreachable() -> str | None:
    """Why the test server cannot be used, or None; under xdist, creates this worker's database first."""
    try:
        with psycopg.connect(configured_url(), connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
            if xdist_worker() is not None:
                _create_worker_database(conn)
    except psycopg.errors.InsufficientPrivilege as exc:
        return (
            f"PostgreSQL at {configured_url()} ({PG_ENV}) refused to create the database "
            f"{worker_database()} for pytest-xdist worker {xdist_worker()}: {_first_line(exc)}. "
            "Parallel workers need a database each: grant the role CREATEDB, or run serially with -n 0"
        )
    except psycopg.Error as exc:
        return (
            f"PostgreSQL at {configured_url()} ({PG_ENV}) is unreachable: {_first_line(exc)}. "
            f"Start it with: {START_HINT}"
        )
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


# ----- a PostgreSQL server of a test's own --------------------------------------------------
#
# A test that stops its server (test_postgres_faults.py) must not stop the shared one: every other
# PostgreSQL test running beside it (pytest-xdist) would fail. It gets a throwaway cluster instead:
# initdb into a fresh temporary directory, started on a free 127.0.0.1 port with its own socket
# directory, stopped and removed after the test.

CLUSTER_TIMEOUT_SECONDS = 30  # pg_ctl's own wait for a start or stop


class ClusterUnavailable(Exception):
    """This machine cannot make a throwaway cluster (no initdb, or no user to run it as)."""


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def postgres_bindir() -> Path | None:
    """The directory of initdb and pg_ctl: `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            found = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if found:
                candidates.append(Path(found))
    installed = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(installed, key=lambda b: _version_key(b.parent.name), reverse=True)
    on_path = shutil.which("initdb")
    if on_path is not None:
        candidates.append(Path(on_path).resolve().parent)
    return next((d for d in candidates if (d / "initdb").is_file() and (d / "pg_ctl").is_file()), None)


@dataclass
class Cluster:
    """A throwaway PostgreSQL cluster: its data, socket and log under `root`, listening on 127.0.0.1:`port`."""

    bindir: Path
    root: Path
    port: int
    run_as: tuple[str, ...]  # ("runuser", "-u", "postgres", "--") when the tests run as root

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        """The URL of `database` on this cluster (trust authentication, user postgres)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, program: str, *args: str) -> None:
        command = [*self.run_as, str(self.bindir / program), *args]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=CLUSTER_TIMEOUT_SECONDS + 30, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{program} {' '.join(args)} did not finish: {self._log_tail()}") from exc
        if done.returncode != 0:
            raise RuntimeError(
                f"{program} {' '.join(args)} exited with {done.returncode}: "
                f"{(done.stdout + done.stderr).strip()[-2000:]} {self._log_tail()}"
            )

    def _log_tail(self) -> str:
        try:
            return f"(server log: {self.log.read_text(errors='replace')[-2000:]})"
        except OSError:
            return "(no server log)"

    def initdb(self) -> None:
        settings = ("-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C")
        self._run("initdb", "-D", str(self.data), *settings)

    def start(self) -> None:
        """Start the server and wait until it accepts connections (pg_ctl -w), bounded."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "start", *self._waiting, "-l", str(self.log), "-o", options)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server and wait until it is gone (pg_ctl -w), bounded."""
        self._run("pg_ctl", "stop", *self._waiting, "-m", mode)

    @property
    def _waiting(self) -> tuple[str, ...]:
        return ("-w", "-t", str(CLUSTER_TIMEOUT_SECONDS), "-D", str(self.data))

    def remove(self) -> None:
        """Stop the server if it runs (immediate: the test is over) and delete its directory."""
        try:
            if (self.data / "postmaster.pid").exists():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def create_cluster() -> Cluster:
    """initdb into a new temporary directory and start the server on a free port (seconds)."""
    bindir = postgres_bindir()
    if bindir is None:
        raise ClusterUnavailable(
            "no initdb for a throwaway PostgreSQL cluster (neither `pg_config --bindir` nor "
            "/usr/lib/postgresql/*/bin has one); install the PostgreSQL server package"
        )
    run_as: tuple[str, ...] = ()
    owner: pwd.struct_passwd | None = None
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise ClusterUnavailable(
                "running as root and there is no postgres user to run initdb as"
            ) from None
        run_as = ("runuser", "-u", "postgres", "--")
    # Not under pytest's basetemp: /tmp/pytest-of-root is 0700, closed to the postgres user.
    root = Path(tempfile.mkdtemp(prefix="pollwarden-pg-", dir="/tmp" if owner is not None else None))
    cluster = Cluster(bindir=bindir, root=root, port=free_port(), run_as=run_as)
    try:
        if owner is not None:
            os.chown(root, owner.pw_uid, owner.pw_gid)
        cluster.initdb()
        cluster.start()
    except BaseException:
        cluster.remove()
        raise
    return cluster
