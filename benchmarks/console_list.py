"""How long the console's Operations page takes with 2,002 operations (the goal: under 200 ms).

Runs `pollwarden demo` into a fresh SQLite file (two operations, one approval
waiting for a person), copies its finished operation 2,000 times with a mix of
statuses (waiting, succeeded, failed, escalated), serves the console on
127.0.0.1 and asks for the first page, the last page, a search by job id and
a status filter, each 25 times, over HTTP with a logged-in session. Prints
the median and the 95th percentile of each; exits 1 when a median is over the goal.

    .venv/bin/python -m benchmarks.console_list
"""

from __future__ import annotations

import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2

from pollwarden.config import ServerConfig
from pollwarden.console.app import ConsoleSettings, create_app
from pollwarden.console.cli import running_console
from pollwarden.core.records import OPERATION_COLUMNS
from pollwarden.store import DatabaseLocation
from pollwarden.surface.http_serve import HttpOptions, transport_security

COPIES = 2000
RUNS = 25
GOAL_MS = 200.0
STATUSES = ("waiting", "succeeded", "failed", "escalated")


def _fill(db: Path) -> None:
    """2,000 copies of the demo's finished operation, each its own id, job id, status and start time."""
    replaced = {
        "operation_id": "'bulk-' || printf('%05d', g)",
        "provider_job_id": "'job-' || printf('%05d', g)",
        "status": f"(CASE g % 4 {' '.join(f'WHEN {i} THEN {s!r}' for i, s in enumerate(STATUSES))} END)",
        "created_at": "created_at - g",
        "next_check_at": "next_check_at + 600",
        "deadline_at": "deadline_at + 3600",
    }
    columns = ", ".join(OPERATION_COLUMNS)
    values = ", ".join(replaced.get(c, c) for c in OPERATION_COLUMNS)
    with sqlite3.connect(db) as conn:
        conn.execute(
            f"WITH RECURSIVE n(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM n WHERE g < {COPIES}) "
            f"INSERT INTO operations ({columns}) SELECT {values} FROM operations, n "
            "WHERE operation_id = 'demo-export-ok'"
        )


async def _measure(db: Path) -> dict[str, list[float]]:
    config = ServerConfig(database=DatabaseLocation.sqlite(db))
    options = HttpOptions(port=0)
    settings = ConsoleSettings(
        config=config,
        login_token=secrets.token_urlsafe(32),
        allowed_hosts=tuple(transport_security(options).allowed_hosts or ()),
        tables={},
    )
    paths = {
        "first page": "/",
        "last page": "/?page=81",
        "search by job id": "/?q=job-01234",
        "status filter": "/?status=waiting&page=3",
    }
    timings: dict[str, list[float]] = {name: [] for name in paths}
    async with running_console(create_app(settings), options) as root, httpx2.AsyncClient() as client:
        base = root + settings.prefix
        await client.post(f"{base}/login", data={"token": settings.login_token})
        for _ in range(RUNS):
            for name, path in paths.items():
                started = time.perf_counter()
                answer = await client.get(base + path)
                timings[name].append((time.perf_counter() - started) * 1000)
                if answer.status_code != 200 or "data-operation" not in answer.text:
                    raise RuntimeError(f"{path}: HTTP {answer.status_code}")
    return timings


def main() -> int:
    """Fill, measure, print; 1 when a median misses the goal."""
    with tempfile.TemporaryDirectory(prefix="pollwarden-console-list-") as tmp:
        db = Path(tmp) / "demo.db"
        subprocess.run(
            [sys.executable, "-m", "pollwarden", "demo", "--db", str(db)], check=True, capture_output=True
        )
        _fill(db)
        with sqlite3.connect(db) as conn:
            total = conn.execute("SELECT count(*) FROM operations").fetchone()[0]
        timings = anyio.run(_measure, db)
    print(
        f"console Operations page, {total} operations on SQLite, {RUNS} requests each (goal: median < {GOAL_MS:g} ms)"
    )
    worst = 0.0
    for name, values in timings.items():
        median = statistics.median(values)
        p95 = statistics.quantiles(values, n=20)[-1]
        worst = max(worst, median)
        print(f"  {name:<18} median {median:6.1f} ms   p95 {p95:6.1f} ms")
    return 0 if worst < GOAL_MS else 1


if __name__ == "__main__":
    sys.exit(main())
