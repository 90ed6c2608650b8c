"""Live processes and the set-up the tests and benchmarks share: the fake provider, its tables, the server, the database.

Used by the tests and by every script in `benchmarks/` (which run the full-size
reliability checks and the timings). Two ways to the server: `pollwarden serve` as a
stdio subprocess (the reliability checks) and pollwarden's MCP server behind
the SDK's in-process `Client` (the timing benchmarks). Everything listens on
127.0.0.1 only, every wait is bounded, and every process started here is
stopped here.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult

from pollwarden.config import ServerConfig
from pollwarden.core.vocabulary import Status, StopReason
from pollwarden.flows.check_hooks import CheckBoundary
from pollwarden.store import DatabaseLocation
from pollwarden.surface.server import ControllerFactory, build_server, controller_factory
from pollwarden_providers.loader import load_table
from pollwarden_providers.table import ProviderTable
from tests.support.fake_provider import Step, pending

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_STARTUP_SECONDS = 15.0
# A server that takes longer than this to answer one tool call is stuck.
CALL_TIMEOUT_SECONDS = 60.0

STATUSES: tuple[str, ...] = tuple(Status)
STOP_REASONS: tuple[str, ...] = tuple(StopReason)


# -- provider tables for the fake provider ------------------------------------------------------

# The response fields a table can name (all but job_id_field): the reliability checks read every hint.
ALL_RESPONSE_FIELDS = {
    "state_field": "state",
    "expires_at_field": "expires_at",
    "poll_after_field": "poll_after_seconds",
    "next_check_at_field": "next_check_at",
    "error_field": "error",
    "request_id_header": "X-Request-Id",
}
# The timing tables: every check is allowed to poll ("fast") or answered not_yet ("slow").
FAST_DELAY_SECONDS = 0.000001
SLOW_DELAY_SECONDS = 3600.0


def fake_provider_table(
    name: str,
    base_url: str,
    *,
    schedule: Mapping[str, float],
    limits: Mapping[str, float],
    response: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A table (as TOML would load it) for the fake provider's contract: its status path and states."""
    return {
        "name": name,
        "base_url": base_url,
        "status_path": "/v1/jobs/{job_id}",
        "response": dict(response or {"state_field": "state"}),
        "states": {
            "pending": ["queued", "running"],
            "succeeded": ["succeeded"],
            "failed": ["failed"],
            "cancelled": ["cancelled"],
            "expired": ["expired"],
        },
        "success": {"required_fields": ["result_url"]},
        "fields": {"result_url": {"type": "url", "schemes": ["http", "https"]}},
        "schedule": dict(schedule),
        "limits": dict(limits),
    }


def reliability_table(
    name: str,
    base_url: str,
    *,
    base_delay_seconds: float = 0.01,
    max_delay_seconds: float = 0.05,
    default_max_status_requests: int = 5,
) -> dict[str, Any]:
    """A table with a fast schedule (many checks allowed per second) and every response field."""
    return fake_provider_table(
        name,
        base_url,
        response=ALL_RESPONSE_FIELDS,
        schedule={"base_delay_seconds": base_delay_seconds, "max_delay_seconds": max_delay_seconds},
        limits={
            "default_deadline_seconds": 300,
            "max_deadline_seconds": 3600,
            "default_max_status_requests": default_max_status_requests,
            "max_status_requests": 200,
            "max_transport_failures": 3,
            "max_rate_limited": 3,
        },
    )


def timing_table(name: str, base_url: str, delay_seconds: float) -> dict[str, Any]:
    """A table whose every check is `delay_seconds` after the last, with budgets no run can use up."""
    return fake_provider_table(
        name,
        base_url,
        schedule={"base_delay_seconds": delay_seconds, "max_delay_seconds": delay_seconds},
        limits={
            "default_deadline_seconds": 86400,
            "max_deadline_seconds": 86400,
            # Large enough that one operation can be polled for the whole run.
            "default_max_status_requests": 1_000_000,
            "max_status_requests": 1_000_000,
        },
    )


def fast_and_slow_tables(base_url: str) -> dict[str, dict[str, Any]]:
    """The timing tables: on "fast" every check_status polls, on "slow" every one is answered not_yet."""
    return {
        "fast": timing_table("fast", base_url, FAST_DELAY_SECONDS),
        "slow": timing_table("slow", base_url, SLOW_DELAY_SECONDS),
    }


def table_toml(table: Mapping[str, Any]) -> str:
    """A table as TOML text: scalars first, then sections (nested ones as ``[a.b]``); JSON values are TOML."""

    def key(name: str) -> str:
        return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)

    def section(prefix: str, values: Mapping[str, Any]) -> list[str]:
        lines = [f"{key(k)} = {json.dumps(v)}" for k, v in values.items() if not isinstance(v, Mapping)]
        if prefix:
            lines.insert(0, f"[{prefix}]")
            lines.insert(0, "")
        for name, value in values.items():
            if isinstance(value, Mapping):
                inner = f"{prefix}.{key(name)}" if prefix else key(name)
                lines += section(inner, cast(Mapping[str, Any], value))
        return lines

    return "\n".join(section("", table)).lstrip("\n") + "\n"


def write_table(directory: Path, table: Mapping[str, Any]) -> Path:
    """Write `<name>.toml` into `directory` and check that it loads."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{table['name']}.toml"
    path.write_text(table_toml(table))
    load_table(path)
    return path


def write_provider_table(directory: Path, name: str, base_url: str, **schedule: Any) -> Path:
    """Write the reliability table `<name>.toml` into `directory` and check that it loads."""
    return write_table(directory, reliability_table(name, base_url, **schedule))


def write_fast_and_slow_tables(directory: Path, base_url: str) -> None:
    """Write the timing tables `fast.toml` and `slow.toml` for servers that load a directory."""
    for table in fast_and_slow_tables(base_url).values():
        write_table(directory, table)


# -- the fake provider ---------------------------------------------------------------------


@contextmanager
def fake_provider_process(workdir: Path) -> Generator[str]:
    """`python -m tests.support.fake_provider` on a free 127.0.0.1 port; yields its base URL."""
    log_path = workdir / "fake_provider.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fake_provider", "--port", "0"],
            cwd=str(REPO_ROOT),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + FAKE_STARTUP_SECONDS
        base_url = ""
        while not base_url:
            if process.poll() is not None:
                raise RuntimeError(f"the fake provider exited at start-up: {log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("the fake provider did not print its base URL in time")
            first = log_path.read_text().splitlines()[:1]
            if first and first[0].startswith("http://127.0.0.1:"):
                base_url = first[0].strip()
            else:
                time.sleep(0.02)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@contextmanager
def fake_provider_workdir(prefix: str = "pollwarden-bench-") -> Generator[tuple[Path, str]]:
    """A temporary working directory with the fake provider running; yields both, removes both."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        workdir = Path(tmp)
        with fake_provider_process(workdir) as base_url:
            yield workdir, base_url


class FakeControl:
    """The fake provider's control endpoints (works for the in-process fake and the subprocess alike)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._http = httpx2.AsyncClient(base_url=base_url, timeout=10.0, trust_env=False)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def script(self, job_id: str, steps: Sequence[Step]) -> None:
        """Answer status requests for `job_id` with `steps` (the last one repeats)."""
        body = {"kind": "status", "job_id": job_id, "steps": [s.model_dump(mode="json") for s in steps]}
        response = await self._http.post("/_control/script", json=body)
        response.raise_for_status()

    async def status_requests(self, job_id: str) -> list[dict[str, Any]]:
        """The fake's own log of GET status requests for `job_id`, oldest first."""
        response = await self._http.get("/_control/log", params={"job_id": job_id})
        response.raise_for_status()
        entries: list[dict[str, Any]] = response.json()
        return [e for e in entries if e["route"] == "status" and e["method"] == "GET"]


async def script_running(base_url: str, *job_ids: str) -> None:
    """Have the fake answer every status request for each of `job_ids` with "running", for good."""
    fake = FakeControl(base_url)
    try:
        for job_id in job_ids:
            await fake.script(job_id, [pending("running")])
    finally:
        await fake.aclose()


def overlapping_pairs(entries: Sequence[Mapping[str, Any]]) -> int:
    """How many requests started before the previous one (by start time) had finished."""
    ordered = sorted(entries, key=lambda e: float(e["started_at"]))
    overlaps = 0
    latest_finish = float("-inf")
    for entry in ordered:
        if float(entry["started_at"]) < latest_finish:
            overlaps += 1
        finished = entry["finished_at"]
        latest_finish = max(latest_finish, float("inf") if finished is None else float(finished))
    return overlaps


def max_in_flight(entries: Sequence[Mapping[str, Any]]) -> int:
    """The most requests for one job the fake was handling at once (counted by the fake at each start)."""
    return max((int(e["in_flight"]) for e in entries), default=0)


# -- pollwarden's MCP server in this process -------------------------------------------------


def in_process_client(factory: ControllerFactory) -> Client:
    """The SDK's in-process `Client` on pollwarden's MCP server: the full tool path, without stdio framing."""
    return Client(build_server(factory))


def timing_controller_factory(db: Database, base_url: str) -> ControllerFactory:
    """The controller on `db` with only the timing tables ("fast" and "slow") for the fake at `base_url`."""
    tables = {name: ProviderTable.model_validate(t) for name, t in fast_and_slow_tables(base_url).items()}
    return controller_factory(ServerConfig(database=_location(db)), tables=tables)


# -- pollwarden serve over stdio -------------------------------------------------------------


@dataclass(frozen=True)
class Rigging:
    """What a test asks of a served process beyond the operator's flags (see `serve_with_faults`)."""

    fault_step: CheckBoundary | None = None  # SIGKILL the process when a check reaches this step
    lease_seconds: float | None = None  # a shorter lease, so recovery is seen in seconds
    busy_timeout_seconds: float | None = None  # the operator flag --busy-timeout


def serve_params(
    db: Database, providers_dir: Path, env: Mapping[str, str] | None = None, rigging: Rigging = Rigging()
) -> StdioServerParameters:
    """`python -m pollwarden serve --db DB --providers DIR` as a stdio MCP server.

    With a fault step or a lease, the same server is built by `tests.support.serve_with_faults`.
    """
    full_env = dict(env or {})
    if os.environ.get("PYTHONPATH"):
        # The SDK passes only a few safe variables on; keep a source checkout importable.
        full_env.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
    command = ["-m", "pollwarden"]
    if rigging.fault_step is not None or rigging.lease_seconds is not None:
        command = ["-m", "tests.support.serve_with_faults"]
        if rigging.fault_step is not None:
            command += ["--fault-step", rigging.fault_step]
        if rigging.lease_seconds is not None:
            command += ["--lease-seconds", str(rigging.lease_seconds)]
    serve = ["serve", "--db", db_argument(db), "--providers", str(providers_dir)]
    if rigging.busy_timeout_seconds is not None:
        serve += ["--busy-timeout", str(rigging.busy_timeout_seconds)]
    return StdioServerParameters(
        command=sys.executable, args=[*command, *serve], env=full_env, cwd=str(REPO_ROOT)
    )


@asynccontextmanager
async def stdio_server(
    db: Database,
    providers_dir: Path,
    *,
    errlog: Path,
    env: Mapping[str, str] | None = None,
    rigging: Rigging = Rigging(),
) -> AsyncGenerator[Client]:
    """A real `pollwarden serve` subprocess and an SDK client talking to it over stdio."""
    with errlog.open("a") as err:
        transport = stdio_client(serve_params(db, providers_dir, env, rigging), errlog=err)
        async with Client(transport, read_timeout_seconds=CALL_TIMEOUT_SECONDS) as client:
            yield client


def structured(result: CallToolResult) -> dict[str, Any]:
    """The structured output of a tool call; a tool error raises with its text."""
    if result.is_error:
        text = " ".join(getattr(block, "text", "") for block in result.content)
        raise AssertionError(f"tool error: {text}")
    content: dict[str, Any] | None = result.structured_content
    assert isinstance(content, dict)
    return dict(content)


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool and return its structured output."""
    return structured(await client.call_tool(tool, arguments))


# -- the database, read directly --------------------------------------------------------------


# A database for the checks: a SQLite file, or a PostgreSQL location (the same checks on both engines).
Database = Path | DatabaseLocation


def _location(db: Database) -> DatabaseLocation:
    return db if isinstance(db, DatabaseLocation) else DatabaseLocation.sqlite(db)


def db_argument(db: Database) -> str:
    """What `--db` is given for `db` (a PostgreSQL URL as written, password included)."""
    where = _location(db)
    return str(where.path) if where.is_sqlite else where.dsn


@contextmanager
def _read_only(db: Database) -> Generator[Any]:
    """A separate read-only connection to `db` (``?`` placeholders on both engines), closed afterwards."""
    where = _location(db)
    if not where.is_sqlite:
        from pollwarden.store.postgres.read_only import read_only

        with read_only(where) as session:
            yield session
        return
    conn = sqlite3.connect(f"file:{where.path}?mode=ro", uri=True, timeout=10.0)
    try:
        yield conn
    finally:
        conn.close()


def read_record(db: Database, operation_id: str) -> dict[str, Any] | None:
    """The operation row as a dict, read through a separate read-only connection."""
    with _read_only(db) as conn:
        cursor = conn.execute("SELECT * FROM operations WHERE operation_id = ?", (operation_id,))
        row = cursor.fetchone()
        if row is None:
            return None
        names = [str(d[0]) for d in cursor.description]
        return dict(zip(names, row, strict=True))


def record_problems(record: Mapping[str, Any] | None) -> list[str]:
    """Why a recorded operation is inconsistent (empty when it is consistent)."""
    if record is None:
        return ["the operation record is missing"]
    problems: list[str] = []
    status, reason = record["status"], record["stop_reason"]
    if status not in STATUSES:
        problems.append(f"status {status!r} is not a valid status")
    if status == "waiting" and reason is not None:
        problems.append(f"waiting with a stop reason {reason!r}")
    if status not in ("waiting", "submitting") and reason not in STOP_REASONS:
        problems.append(f"status {status!r} without a valid stop reason ({reason!r})")
    if status not in ("waiting", "submitting") and record["stopped_at"] is None:
        problems.append("stopped without stopped_at")
    if (record["lease_owner"] is None) != (record["lease_expires_at"] is None):
        problems.append("lease owner and lease expiry disagree")
    used, budget = record["status_requests_used"], record["max_status_requests"]
    if not 0 <= used <= budget:
        problems.append(f"status_requests_used {used} outside 0..{budget}")
    if record["polls_completed"] > used:
        problems.append(f"polls_completed {record['polls_completed']} > status_requests_used {used}")
    if record["transport_failures_used"] > record["max_transport_failures"]:
        problems.append("transport failures above their budget")
    if record["rate_limited_used"] > record["max_rate_limited"]:
        problems.append("rate-limited count above its budget")
    if status == "succeeded" and not record["result_json"]:
        problems.append("succeeded without a recorded result")
    return problems


def audit_kinds(db: Database, operation_id: str) -> list[str]:
    """The kinds of the operation's audit rows, in chain order."""
    with _read_only(db) as conn:
        rows = conn.execute("SELECT kind FROM audit WHERE operation_id = ? ORDER BY seq", (operation_id,))
        return [str(r[0]) for r in rows]


def integrity_check(db: Database) -> str:
    """SQLite's own `PRAGMA integrity_check` ("ok" when the file is sound); PostgreSQL: every row readable."""
    if not _location(db).is_sqlite:
        with _read_only(db) as conn:
            conn.execute("SELECT count(*) FROM operations").fetchone()
            conn.execute("SELECT count(*) FROM audit").fetchone()
        return "ok"
    with _read_only(db) as conn:
        row = conn.execute("PRAGMA integrity_check").fetchone()
        return str(row[0]) if row else "no answer"


@dataclass(frozen=True)
class CommandResult:
    """Exit code and output of one operator command."""

    code: int
    stdout: str
    stderr: str


def pollwarden_cli(*args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0) -> CommandResult:
    """Run `python -m pollwarden ARGS` as an operator would, bounded in time."""
    full_env = {**os.environ, **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "pollwarden", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=str(REPO_ROOT),
        check=False,
    )
    return CommandResult(done.returncode, done.stdout, done.stderr)


def audit_verify(db: Database) -> CommandResult:
    """`pollwarden audit verify --db DB` (exit 0 when the chain is intact)."""
    return pollwarden_cli("audit", "verify", "--db", db_argument(db))


async def wait_until_gone(pid: int, within_seconds: float = 10.0) -> bool:
    """Poll (bounded) until process `pid` no longer exists."""
    with anyio.move_on_after(within_seconds):
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            await anyio.sleep(0.02)
    return False
