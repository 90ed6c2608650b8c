"""Live processes for the reliability checks: the fake provider, `pollwarden serve` over stdio, the database.

Shared by `benchmarks/stress_race.py`, `benchmarks/crash_matrix.py` and the
tests that run small versions of them. Everything listens on 127.0.0.1 only,
every wait is bounded, and every process started here is stopped here.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult

from pollwarden.fake_provider import Step
from pollwarden_providers.loader import load_table

REPO_ROOT = Path(__file__).resolve().parents[1]
FAKE_STARTUP_SECONDS = 15.0
# A server that takes longer than this to answer one tool call is stuck.
CALL_TIMEOUT_SECONDS = 60.0

STATUSES = ("submitting", "waiting", "succeeded", "failed", "cancelled", "expired", "escalated")
STOP_REASONS = (
    "succeeded",
    "provider_failure",
    "cancelled",
    "expired",
    "deadline_exceeded",
    "request_budget_exhausted",
    "delivery_ambiguous",
    "rate_limited",
    "unknown_state",
    "authorization_denied",
    "integration_failure",
)


# -- the provider table ------------------------------------------------------------------


def provider_table_toml(
    name: str,
    base_url: str,
    *,
    base_delay_seconds: float = 0.01,
    max_delay_seconds: float = 0.05,
    default_max_status_requests: int = 5,
) -> str:
    """A table for the fake provider with a fast schedule, so many checks are allowed per second."""
    return f"""\
name = "{name}"
base_url = "{base_url}"
status_path = "/v1/jobs/{{job_id}}"

[response]
state_field = "state"
expires_at_field = "expires_at"
poll_after_field = "poll_after_seconds"
next_check_at_field = "next_check_at"
error_field = "error"
request_id_header = "X-Request-Id"

[states]
pending = ["queued", "running"]
succeeded = ["succeeded"]
failed = ["failed"]
cancelled = ["cancelled"]
expired = ["expired"]

[success]
required_fields = ["result_url"]

[schedule]
base_delay_seconds = {base_delay_seconds!r}
max_delay_seconds = {max_delay_seconds!r}

[limits]
default_deadline_seconds = 300
max_deadline_seconds = 3600
default_max_status_requests = {default_max_status_requests}
max_status_requests = 200
max_transport_failures = 3
max_rate_limited = 3
"""


def write_provider_table(directory: Path, name: str, base_url: str, **schedule: Any) -> Path:
    """Write `<name>.toml` into `directory` and check that it loads."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(provider_table_toml(name, base_url, **schedule))
    load_table(path)
    return path


# -- the fake provider ---------------------------------------------------------------------


@contextmanager
def fake_provider_process(workdir: Path) -> Iterator[str]:
    """`python -m pollwarden.fake_provider` on a free 127.0.0.1 port; yields its base URL."""
    log_path = workdir / "fake_provider.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pollwarden.fake_provider", "--port", "0"],
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


# -- pollwarden serve over stdio -------------------------------------------------------------


def serve_params(
    db: Path, providers_dir: Path, env: Mapping[str, str] | None = None
) -> StdioServerParameters:
    """`python -m pollwarden serve --db DB --providers DIR` as a stdio MCP server."""
    full_env = dict(env or {})
    if os.environ.get("PYTHONPATH"):
        # The SDK passes only a few safe variables on; keep a source checkout importable.
        full_env.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "pollwarden", "serve", "--db", str(db), "--providers", str(providers_dir)],
        env=full_env,
        cwd=str(REPO_ROOT),
    )


@asynccontextmanager
async def stdio_server(
    db: Path,
    providers_dir: Path,
    *,
    errlog: Path,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[Client]:
    """A real `pollwarden serve` subprocess and an SDK client talking to it over stdio."""
    with errlog.open("a") as err:
        transport = stdio_client(serve_params(db, providers_dir, env), errlog=err)
        async with Client(transport, read_timeout_seconds=CALL_TIMEOUT_SECONDS) as client:
            yield client


def structured(result: CallToolResult) -> dict[str, Any]:
    """The structured output of a tool call; a tool error raises with its text."""
    if result.is_error:
        text = " ".join(getattr(block, "text", "") for block in result.content)
        raise AssertionError(f"tool error: {text}")
    assert isinstance(result.structured_content, dict)
    return dict(result.structured_content)


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool and return its structured output."""
    return structured(await client.call_tool(tool, arguments))


# -- the database, read directly --------------------------------------------------------------


def read_record(db: Path, operation_id: str) -> dict[str, Any] | None:
    """The operation row as a dict, read through a separate read-only connection."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10.0)
    try:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM operations WHERE operation_id = ?", (operation_id,)).fetchone()
        return None if row is None else dict(row)
    finally:
        conn.close()


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


def audit_kinds(db: Path, operation_id: str) -> list[str]:
    """The kinds of the operation's audit rows, in chain order."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10.0)
    try:
        rows = conn.execute("SELECT kind FROM audit WHERE operation_id = ? ORDER BY seq", (operation_id,))
        return [str(r[0]) for r in rows]
    finally:
        conn.close()


def integrity_check(db: Path) -> str:
    """SQLite's own `PRAGMA integrity_check` ("ok" when the file is sound)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10.0)
    try:
        row = conn.execute("PRAGMA integrity_check").fetchone()
        return str(row[0]) if row else "no answer"
    finally:
        conn.close()


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


def audit_verify(db: Path) -> CommandResult:
    """`pollwarden audit verify --db DB` (exit 0 when the chain is intact)."""
    return pollwarden_cli("audit", "verify", "--db", str(db))


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


def dump_json(path: Path, value: object) -> None:
    """Write pretty JSON, creating the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
