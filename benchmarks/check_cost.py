"""What one check_status costs, beside the floor it cannot go below.

    python benchmarks/check_cost.py                  # 1,000 samples each, about 30 s
    python benchmarks/check_cost.py --samples 200    # quicker

The fake provider runs as its own process on 127.0.0.1; pollwarden runs in
this process behind the in-process MCP `Client` (the full tool path: JSON
schema validation, the controller, SQLite in WAL mode, the audit chain), on
the real clock. Six things are timed, interleaved so drift hits all of them
alike:

- a bare `httpx2` GET of a job's status (keep-alive, like pollwarden's client);
- an MCP no-op tool call through the same client, returning an operation view
  built beforehand (the same model check_status returns), touching nothing;
- one durable commit (`synchronous=FULL`) and one `synchronous=NORMAL` commit
  on a plain sqlite3 connection to another file in the same directory, each
  updating a row and inserting one audit-sized row, in this thread;
- `check_status` that polls: a table whose schedule allows the next check
  after a microsecond, so every call sends exactly one status request;
- `check_status` answered `not_yet`: a table whose first check is an hour
  away, so nothing is sent (the refusal is still counted, at NORMAL).

The floor of a polled check is what it cannot avoid: no-op + GET + two durable
commits (the reservation before the request, the answer and its audit row
after); the floor of a refusal is no-op + one NORMAL commit. The ratios are
medians in this one run. Hops to the database thread and commits are counted
by the engine (`SQLiteStore.stats`) around every call; fsyncs per call are
counted with `strace -f -c` on separate runs of each kind (when strace exists).

With `--engine postgres` the same runs on PostgreSQL (a scratch schema on
POLLWARDEN_TEST_PG's server, dropped after): the floor's commits are the same
transaction on that server in one pipelined trip (synchronous_commit on, and
off for a refusal's counter), trips and commits are counted by the engine
(`PostgresStore.stats`), and fsyncs are not counted (the server does them).

Prints a table and writes benchmarks/results/check_cost.json (check_cost_postgres.json).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp.client import Client

if not __package__:  # run as `python benchmarks/check_cost.py`: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.live import (
    call,
    fake_provider_workdir,
    script_running,
    structured,
    timing_controller_factory,
)

from benchmarks.measure import (
    DEFAULT_PG_URL,
    RESULTS_DIR,
    dump_json,
    machine,
    median_p95_ms,
    percentile,
    percentile_ms,
    quiet_logs,
    scratch_schema,
)
from pollwarden.flows.controller import Controller
from pollwarden.store import DatabaseLocation
from pollwarden.surface.server import build_server
from pollwarden.surface.views import OperationView

# What one audit row weighs, roughly: the floor commits write one like it.
AUDIT_ROW_BYTES = 700


def stats_ms(samples: Sequence[float]) -> dict[str, float]:
    """Median, p95, p99 and mean of samples in seconds, as milliseconds."""
    return {
        **median_p95_ms(samples),
        "p99_ms": percentile_ms(samples, 99),
        "mean_ms": round(sum(samples) / len(samples) * 1000, 3),
    }


class PostgresCommitFloor:
    """The same floor transaction on the PostgreSQL server: one pipelined trip, durable or not."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE TABLE IF NOT EXISTS floor_counter (id int PRIMARY KEY, n bigint NOT NULL)")
        self.conn.execute("CREATE TABLE IF NOT EXISTS floor_rows (seq bigserial PRIMARY KEY, payload text)")
        self.conn.execute("INSERT INTO floor_counter VALUES (1, 0) ON CONFLICT DO NOTHING")
        self.payload = "x" * AUDIT_ROW_BYTES

    def commit(self, *, durable: bool) -> None:
        """Update a row and insert an audit-sized row in one transaction, one trip."""
        with self.conn.pipeline() as pipe:
            self.conn.execute("BEGIN")
            if not durable:
                self.conn.execute("SET LOCAL synchronous_commit = off")
            self.conn.execute("UPDATE floor_counter SET n = n + 1 WHERE id = 1")
            self.conn.execute("INSERT INTO floor_rows (payload) VALUES (%s)", (self.payload,))
            self.conn.execute("COMMIT")
            pipe.sync()

    def close(self) -> None:
        self.conn.close()


def _counters(store: Any) -> tuple[int, int, int]:
    """(round trips, durable commits, relaxed commits) the engine counted so far."""
    return store.stats.trips, store.stats.durable_commits, store.stats.relaxed_commits


class CommitFloor:
    """Plain sqlite3 commits, durable and not, on a file beside the benchmark's database."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL").fetchone()
        self.conn.execute("CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        self.conn.execute("CREATE TABLE IF NOT EXISTS rows (seq INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
        self.conn.execute("INSERT OR IGNORE INTO counter VALUES (1, 0)")
        self.payload = "x" * AUDIT_ROW_BYTES

    def commit(self, *, durable: bool) -> None:
        """Update a row and insert an audit-sized row in one transaction."""
        self.conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("UPDATE counter SET n = n + 1 WHERE id = 1")
        self.conn.execute("INSERT INTO rows (payload) VALUES (?)", (self.payload,))
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


@asynccontextmanager
async def server_and_store(db: Path | str, base_url: str) -> AsyncGenerator[tuple[Client, list[Any]]]:
    """The in-process client on pollwarden's server plus a no-op tool, and the store the server opens."""
    factory = timing_controller_factory(DatabaseLocation.parse(db) if isinstance(db, str) else db, base_url)
    stores: list[Any] = []

    @asynccontextmanager
    async def capturing() -> AsyncGenerator[Controller]:
        async with factory() as controller:
            stores.append(controller.store)
            yield controller

    server = build_server(capturing)
    template: list[OperationView] = []

    @server.tool(description="benchmark only: return an operation view built beforehand; touches nothing")
    async def noop(operation_id: str) -> OperationView:
        del operation_id
        return template[0]

    async with Client(server) as client:
        for provider, op, job in (("fast", "poll", "cost-poll"), ("slow", "idle", "cost-idle")):
            await call(client, "start_operation", provider=provider, operation_id=op, provider_job_id=job)
        template.append(
            OperationView.model_validate(await call(client, "get_operation", operation_id="poll"))
        )
        yield client, stores


async def run(
    samples: int, warmup: int, workdir: Path, base_url: str, where: dict[str, Any], pg_url: str | None = None
) -> dict[str, Any]:
    """Time the six calls, interleaved; return the result document (on PostgreSQL with `pg_url`)."""
    await script_running(base_url, "cost-poll", "cost-idle")
    floor: CommitFloor | PostgresCommitFloor = (
        CommitFloor(workdir / "floor.db") if pg_url is None else PostgresCommitFloor(pg_url)
    )
    times: dict[str, list[float]] = {k: [] for k in ("get", "noop", "durable", "normal", "polled", "not_yet")}
    trips: dict[str, list[tuple[int, int, int]]] = {"polled": [], "not_yet": []}
    async with (
        server_and_store(workdir / "check_cost.db" if pg_url is None else pg_url, base_url) as (
            client,
            stores,
        ),
        httpx2.AsyncClient(base_url=base_url, timeout=10.0, trust_env=False) as http,
    ):
        store = stores[0]

        async def timed(work: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
            started = time.perf_counter()
            value = await work()
            return time.perf_counter() - started, value

        def timed_sync(work: Callable[[], None]) -> float:
            started = time.perf_counter()
            work()
            return time.perf_counter() - started

        async def check(operation_id: str, expect: str) -> tuple[float, tuple[int, int, int]]:
            before = _counters(store)
            elapsed, result = await timed(
                lambda: client.call_tool("check_status", {"operation_id": operation_id})
            )
            after = _counters(store)
            if structured(result)["outcome"] != expect:
                raise RuntimeError(f"expected {expect}, got {structured(result)}")
            return elapsed, (after[0] - before[0], after[1] - before[1], after[2] - before[2])

        for i in range(warmup + samples):
            elapsed_get, response = await timed(lambda: http.get("/v1/jobs/cost-poll"))
            if response.status_code != 200:
                raise RuntimeError(f"bare GET answered {response.status_code}")
            elapsed_noop, result = await timed(lambda: client.call_tool("noop", {"operation_id": "poll"}))
            if result.is_error:
                raise RuntimeError("the no-op tool failed")
            elapsed_durable = timed_sync(lambda: floor.commit(durable=True))
            elapsed_normal = timed_sync(lambda: floor.commit(durable=False))
            elapsed_poll, poll_trips = await check("poll", "polled")
            elapsed_refusal, refusal_trips = await check("idle", "not_yet")
            if i >= warmup:
                for key, value in (
                    ("get", elapsed_get),
                    ("noop", elapsed_noop),
                    ("durable", elapsed_durable),
                    ("normal", elapsed_normal),
                    ("polled", elapsed_poll),
                    ("not_yet", elapsed_refusal),
                ):
                    times[key].append(value)
                trips["polled"].append(poll_trips)
                trips["not_yet"].append(refusal_trips)
    floor.close()

    median = {key: percentile(values, 50) for key, values in times.items()}
    polled_floor = median["noop"] + median["get"] + 2 * median["durable"]
    not_yet_floor = median["noop"] + median["normal"]
    rows = {
        "bare_httpx2_get": stats_ms(times["get"]),
        "mcp_noop_tool_call": stats_ms(times["noop"]),
        "durable_commit": stats_ms(times["durable"]),
        "normal_commit": stats_ms(times["normal"]),
        "check_status_polled": stats_ms(times["polled"]),
        "check_status_not_yet": stats_ms(times["not_yet"]),
    }
    ratios = {
        "polled_over_floor_median": round(median["polled"] / polled_floor, 2),
        "not_yet_over_floor_median": round(median["not_yet"] / not_yet_floor, 2),
        "polled_over_get_median": round(median["polled"] / median["get"], 2),
        "not_yet_over_get_median": round(median["not_yet"] / median["get"], 2),
    }

    def per_call(kind: str) -> dict[str, float]:
        counted = trips[kind]
        return {
            name: round(sum(t[index] for t in counted) / len(counted), 3)
            for index, name in enumerate(("hops", "durable_commits", "normal_commits"))
        }

    return {
        "benchmark": "check_cost",
        "samples": samples,
        "warmup": warmup,
        "machine": where,
        "database": "SQLite WAL; synchronous=FULL, NORMAL for a refusal's counter; in a temporary directory"
        if pg_url is None
        else "PostgreSQL 127.0.0.1; synchronous_commit on, off for a refusal's counter; per_call counts trips",
        "rows": rows,
        "floors_ms": {
            "polled": round(polled_floor * 1000, 3),
            "not_yet": round(not_yet_floor * 1000, 3),
        },
        "ratios": ratios,
        "per_call": {"check_status_polled": per_call("polled"), "check_status_not_yet": per_call("not_yet")},
    }


# -- fsyncs, counted by strace on separate runs ---------------------------------------------------------


async def fsync_phase(kind: str, calls: int, workdir: Path, base_url: str) -> None:
    """Set up, then make `calls` check_status calls of one kind (the run strace counts)."""
    await script_running(base_url, "cost-poll", "cost-idle")
    async with server_and_store(workdir / "fsync.db", base_url) as (client, _):
        operation_id, expect = ("poll", "polled") if kind == "polled" else ("idle", "not_yet")
        for _ in range(calls):
            result = await client.call_tool("check_status", {"operation_id": operation_id})
            if structured(result)["outcome"] != expect:
                raise RuntimeError(f"expected {expect}, got {structured(result)}")


_STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(fsync|fdatasync)\s*$")


def _fsyncs(kind: str, calls: int) -> int:
    """fsync + fdatasync calls of one whole run (setup included), from `strace -f -c`."""
    strace = shutil.which("strace")
    assert strace is not None
    with tempfile.TemporaryDirectory(prefix="pollwarden-fsync-") as tmp:
        out = Path(tmp) / "strace.txt"
        command = [strace, "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(out)]
        command += [
            sys.executable,
            str(Path(__file__).resolve()),
            "--fsync-phase",
            kind,
            "--calls",
            str(calls),
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        return sum(int(m.group(1)) for line in out.read_text().splitlines() if (m := _STRACE_ROW.match(line)))


def count_fsyncs(calls: int) -> dict[str, Any]:
    """fsyncs per call of each kind: (a run with `calls` calls - a run with none) / `calls`."""
    if shutil.which("strace") is None:
        return {"measured": False, "why": "strace not found"}
    per_call: dict[str, Any] = {
        "measured": True,
        "method": "strace -f -c -e trace=fsync,fdatasync",
        "calls": calls,
    }
    for kind in ("polled", "not_yet"):
        per_call[f"check_status_{kind}"] = round((_fsyncs(kind, calls) - _fsyncs(kind, 0)) / calls, 3)
    return per_call


def render(result: dict[str, Any]) -> str:
    """The result table as fixed-width text."""
    rows: dict[str, dict[str, float]] = result["rows"]
    ratios: dict[str, float] = result["ratios"]
    per_call: dict[str, dict[str, float]] = result["per_call"]
    fsyncs: dict[str, Any] = result.get("fsyncs_per_call", {})
    header = f"{'call':<36} {'median ms':>10} {'p95 ms':>8} {'p99 ms':>8}"
    lines = [header, "-" * len(header)]
    sqlite = str(result["database"]).startswith("SQLite")
    durable = "sqlite3 commit, synchronous=FULL" if sqlite else "PostgreSQL commit, sync on"
    relaxed = "sqlite3 commit, synchronous=NORMAL" if sqlite else "PostgreSQL commit, sync off"
    for key, label in (
        ("bare_httpx2_get", "bare httpx2 GET (loopback)"),
        ("mcp_noop_tool_call", "MCP no-op tool call"),
        ("durable_commit", durable),
        ("normal_commit", relaxed),
        ("check_status_polled", "check_status -> polled (1 GET)"),
        ("check_status_not_yet", "check_status -> not_yet (no GET)"),
    ):
        row = rows[key]
        lines.append(f"{label:<36} {row['median_ms']:>10.3f} {row['p95_ms']:>8.3f} {row['p99_ms']:>8.3f}")
    floors = result["floors_ms"]
    lines.append("")
    lines.append(
        f"polled  / (no-op + GET + 2 FULL commits = {floors['polled']:.3f} ms): {ratios['polled_over_floor_median']:.2f}"
    )
    lines.append(
        f"not_yet / (no-op + 1 NORMAL commit = {floors['not_yet']:.3f} ms):     {ratios['not_yet_over_floor_median']:.2f}"
    )
    for kind in ("polled", "not_yet"):
        counted = per_call[f"check_status_{kind}"]
        fsync = fsyncs.get(f"check_status_{kind}", "not measured")
        lines.append(
            f"{kind:<8} per call: {counted['hops']:g} hops, {counted['durable_commits']:g} FULL + "
            f"{counted['normal_commits']:g} NORMAL commits, {fsync} fsyncs"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Start the fake provider, time the calls, count fsyncs, print and save the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--fsync-calls", type=int, default=200, help="calls per strace run (0: skip)")
    parser.add_argument("--out", type=Path, default=None, help="default: results/check_cost[_postgres].json")
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG_URL,
        help="with --engine postgres: a database to create a scratch schema in (dropped after)",
    )
    parser.add_argument("--fsync-phase", choices=("polled", "not_yet"), help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quiet_logs()
    if args.fsync_phase is not None:
        with fake_provider_workdir() as (workdir, base_url):
            anyio.run(fsync_phase, args.fsync_phase, args.calls, workdir, base_url)
        return 0
    if not 1 <= args.samples <= 100_000:
        parser.error("--samples must be 1 to 100000")
    if not 0 <= args.fsync_calls <= 10_000:
        parser.error("--fsync-calls must be 0 to 10000")
    where = machine(processor=True)
    with fake_provider_workdir() as (workdir, base_url):
        if args.engine == "sqlite":
            result = anyio.run(run, args.samples, args.warmup, workdir, base_url, where)
        else:
            with scratch_schema(args.pg_url, "check_cost") as url:
                result = anyio.run(run, args.samples, args.warmup, workdir, base_url, where, url)
    if args.fsync_calls and args.engine == "sqlite":
        result["fsyncs_per_call"] = count_fsyncs(args.fsync_calls)
    print(
        f"check_status through the in-process MCP client, {args.samples} samples each (after {args.warmup} warm-up)"
    )
    print(render(result))
    out = args.out or RESULTS_DIR / (
        "check_cost.json" if args.engine == "sqlite" else "check_cost_postgres.json"
    )
    dump_json(out, result, sort_keys=False)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
