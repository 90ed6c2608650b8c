"""`pollwarden demo --team`: two real HTTP instances on one database sharing one budget.

Starts the demo's fake provider on 127.0.0.1, then two `pollwarden serve
--transport http` processes on the same database (a PostgreSQL URL for a team,
or a temporary SQLite file) with one shared state key, and drives them with the
MCP SDK's own client over streamable HTTP: one job with a budget of three
status requests, checked through instance A, then B, then A, then B. Each
answer is printed with the instance that gave it; the provider sees exactly
three requests, and the fourth check is refused by whichever instance gets it.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp.client import Client

from pollwarden.cli.demo import DEMO_TABLE
from pollwarden.cli.demo_provider import pending, running_demo_provider
from pollwarden.store import open_store
from pollwarden.store.location import DatabaseLocation

# A serve process that is not listening after this long did not start.
START_SECONDS = 30.0
BUDGET = 3


def _say(text: str) -> None:
    print(text, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def _instance(
    name: str, db: DatabaseLocation, tables: Path, env: dict[str, str], log: Path
) -> Generator[int]:
    """One `pollwarden serve --transport http` process on 127.0.0.1; its port, once it listens."""
    port = _free_port()
    command = [
        sys.executable, "-m", "pollwarden", "serve", "--transport", "http", "--port", str(port),
        "--db", db.dsn if not db.is_sqlite else str(db.path), "--providers", str(tables),
    ]  # fmt: skip
    with log.open("w") as err:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env
        )
    try:
        deadline = time.monotonic() + START_SECONDS
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"instance {name} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        _say(f"instance {name}: pollwarden serve --transport http --port {port} (pid {proc.pid})")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def _check(url: str, operation_id: str) -> dict[str, Any]:
    async with Client(url) as client:
        result = await client.call_tool("check_status", {"operation_id": operation_id, "wait_seconds": 5})
    view: dict[str, Any] = result.structured_content or {}
    if result.is_error or not view:
        raise RuntimeError(f"check_status failed: {result.content}")
    return view


async def _drive(urls: Sequence[tuple[str, str]], job: str) -> list[dict[str, Any]]:
    name, first = urls[0]
    operation_id = f"team-{job}"
    async with Client(first) as client:
        start = {
            "provider": "demo-export",
            "operation_id": operation_id,
            "provider_job_id": job,
            "max_status_requests": BUDGET,
        }
        started = await client.call_tool("start_operation", start)
    view: dict[str, Any] = started.structured_content or {}
    _say(
        f"\ninstance {name}: start_operation {operation_id}, budget {view.get('max_status_requests')} "
        "status requests"
    )
    seen: list[dict[str, Any]] = []
    for turn in range(BUDGET + 1):
        name, url = urls[turn % len(urls)]
        view = await _check(url, operation_id)
        seen.append(view)
        used = f"{view['status_requests_used']} of {view['max_status_requests']}"
        ending = f" -> {view['status']} ({view['stop_reason']})" if view["status"] != "waiting" else ""
        _say(f"instance {name}: check_status -> {view['outcome']:<8} requests used {used}{ending}")
    return seen


async def _open_once(where: DatabaseLocation) -> None:
    async with open_store(where):
        pass


def run_team_demo(db: str | None = None) -> int:
    """Run the two-instance demo; return an exit code (0: they shared one budget)."""
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pollwarden-team-")))
        fake = stack.enter_context(running_demo_provider())
        tables = tmp / "tables"
        tables.mkdir()
        (tables / "demo-export.toml").write_text(DEMO_TABLE.format(base_url=fake.base_url))
        where = DatabaseLocation.parse(db) if db else DatabaseLocation.sqlite(tmp / "team.db")
        if where.is_sqlite:
            where = DatabaseLocation.sqlite(where.path.resolve())
        # Opened here first: a missing driver or an unreachable server is one clear error (StoreError),
        # not two instances' start-up tracebacks; and the schema is migrated before either starts.
        anyio.run(_open_once, where)
        job = (
            f"exp_team_{secrets.token_hex(3)}"  # a job of its own each run: a kept database has the last one
        )
        fake.script(job, [pending("running")])
        # One state key for both, as `Running for a team` asks: either may answer the other's questions.
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}
        env["POLLWARDEN_STATE_KEY"] = secrets.token_hex(32)
        _say(f"fake provider on {fake.base_url}; one database for both instances: {where}")
        ports = [
            stack.enter_context(_instance(name, where, tables, env, tmp / f"{name}.log"))
            for name in ("A", "B")
        ]
        urls = [(name, f"http://127.0.0.1:{port}/mcp") for name, port in zip("AB", ports, strict=True)]
        seen = anyio.run(_drive, urls, job)
        sent = fake.status_requests(job)
        _say(f"\nthe provider saw {sent} status requests in all (the budget: {BUDGET}), at most "
             f"{fake.max_in_flight(job)} in flight at once")  # fmt: skip
        last = seen[-1]
        shared = (
            sent == BUDGET
            and [v["outcome"] for v in seen[:BUDGET]] == ["polled"] * BUDGET
            and last["outcome"] == "stopped"
            and last["stop_reason"] == "request_budget_exhausted"
        )
        _say("one budget, shared by both instances" if shared else "the instances did NOT share one budget")
        return 0 if shared else 1
