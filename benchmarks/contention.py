"""Many server processes on one database: throughput and tail latency under lock contention.

    python benchmarks/contention.py                       # 1 process, then 8; about 40 s
    python benchmarks/contention.py --processes 4 --seconds 5
    python benchmarks/contention.py --engine postgres     # the same on PostgreSQL (a scratch schema)
    python benchmarks/contention.py --engine both --rounds 3   # 8 processes, SQLite and PostgreSQL in turn

Each worker is its own process running pollwarden's MCP server with the
in-process SDK `Client` (the full tool path, without stdio framing) against
one shared SQLite file (WAL, synchronous=FULL, BEGIN IMMEDIATE for every
change). The fake provider runs as its own process on 127.0.0.1. Every worker
repeats the same mix for a fixed time, one call in flight at a time:

    start_operation  ->  check_status (polled: one provider request)
                     ->  check_status (not_yet) x 2

The 1-process baseline runs first, in the same run, so both rows come from
the same machine state. With `--engine both` the 8-process phase runs on a
SQLite file and on PostgreSQL in turn, round after round, so the two engines
share the machine's load and their ratio comes from one run
(results/contention_both.json). Prints a table and writes benchmarks/results/contention.json.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

if not __package__:  # run as `python benchmarks/contention.py`: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.live import (
    fake_provider_workdir,
    in_process_client,
    script_running,
    write_fast_and_slow_tables,
)

from benchmarks.measure import (
    DEFAULT_PG_URL,
    RESULTS_DIR,
    dump_json,
    machine,
    percentile_ms,
    quiet_logs,
    scratch_schema,
)
from pollwarden.config import ServerConfig
from pollwarden.store import DatabaseLocation, open_store
from pollwarden.surface.server import controller_factory

READY_TIMEOUT_SECONDS = 120.0
IDLE_PER_WORKER = 20
KINDS = ("start_operation", "check_polled", "check_not_yet")


# ----- one worker process ----------------------------------------------------------------------


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Set up, say ready, wait for go, run the mix until the time is up; return the samples."""
    config = ServerConfig(database=DatabaseLocation.parse(args.db), provider_dirs=(Path(args.tables),))
    me = f"w{args.worker_id}-{args.phase}"
    rng = random.Random(args.worker_id)
    latencies: dict[str, list[float]] = {kind: [] for kind in KINDS}
    errors: list[str] = []
    async with in_process_client(controller_factory(config)) as client:

        async def call(kind: str, tool: str, arguments: dict[str, Any], expect: str | None) -> None:
            started = time.perf_counter()
            result = await client.call_tool(tool, arguments)
            elapsed = time.perf_counter() - started
            if result.is_error:
                errors.append(" ".join(getattr(b, "text", "") for b in result.content)[:300])
                return
            content: dict[str, Any] = result.structured_content or {}
            if expect is not None and content.get("outcome") != expect:
                errors.append(f"{tool}: expected {expect}, got {content.get('outcome')}")
                return
            if kind in latencies:
                latencies[kind].append(elapsed)

        poll_op = f"{me}-poll"
        await call(
            "setup",
            "start_operation",
            {"provider": "fast", "operation_id": poll_op, "provider_job_id": poll_job(me)},
            None,
        )
        idle = [f"{me}-idle-{i:03d}" for i in range(IDLE_PER_WORKER)]
        for op in idle:
            await call(
                "setup",
                "start_operation",
                {"provider": "slow", "operation_id": op, "provider_job_id": f"{op}-job"},
                None,
            )
        Path(args.ready).write_text("ready")
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        go = Path(args.go)
        while not go.exists():  # bounded wait for the driver's signal
            if time.monotonic() > deadline:
                raise TimeoutError("no go signal from the driver")
            await anyio.sleep(0.005)
        stop_at = float(go.read_text()) + args.seconds
        n = 0
        while time.time() < stop_at:
            n += 1
            # A new job each time: a job has one operation (a new id on a known job creates nothing).
            start = {
                "provider": "slow",
                "operation_id": f"{me}-new-{n:06d}",
                "provider_job_id": f"{me}-job-{n:06d}",
            }
            await call("start_operation", "start_operation", start, None)
            await call("check_polled", "check_status", {"operation_id": poll_op}, "polled")
            for _ in range(2):
                await call("check_not_yet", "check_status", {"operation_id": rng.choice(idle)}, "not_yet")
    return {"latencies": latencies, "errors": errors, "seconds": args.seconds}


def worker_main(args: argparse.Namespace) -> int:
    """Entry point of one worker: results as JSON to --out."""
    quiet_logs()
    result = anyio.run(worker, args)
    Path(args.out).write_text(json.dumps(result))
    return 0


# ----- the driver --------------------------------------------------------------------------------


def _tail(phase_dir: Path) -> str:
    """The end of every worker's stderr, for an error message."""
    return "\n".join(p.read_text()[-1500:] for p in sorted(phase_dir.glob("err-*.log")) if p.read_text())


def run_phase(
    processes: int, seconds: float, workdir: Path, db: Path | str, tables: Path, phase: str
) -> dict[str, Any]:
    """Start `processes` workers, release them together, collect and summarise their samples."""
    phase_dir = workdir / phase
    phase_dir.mkdir()
    go = phase_dir / "go"
    children: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    try:
        for k in range(processes):
            ready, out = phase_dir / f"ready-{k}", phase_dir / f"out-{k}.json"
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                "--worker-id",
                str(k),
                "--phase",
                phase,
                "--db",
                str(db),
                "--tables",
                str(tables),
                "--seconds",
                str(seconds),
                "--ready",
                str(ready),
                "--go",
                str(go),
                "--out",
                str(out),
            ]
            errlog = (phase_dir / f"err-{k}.log").open("w")
            children.append((subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=errlog), ready, out))
            errlog.close()
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not all(ready.exists() for _, ready, _ in children):
            for child, _, _ in children:
                if child.poll() is not None and child.returncode != 0:
                    raise RuntimeError(f"a worker failed during setup:\n{_tail(phase_dir)}")
            if time.monotonic() > deadline:
                raise TimeoutError("workers did not become ready in time")
            time.sleep(0.02)
        # Written whole, then renamed: a worker never reads a half-written start time.
        pending = phase_dir / "go.pending"
        pending.write_text(repr(time.time() + 0.2))
        pending.replace(go)
        for child, _, _ in children:
            child.wait(timeout=seconds + READY_TIMEOUT_SECONDS)
            if child.returncode != 0:
                raise RuntimeError(f"a worker exited with {child.returncode}:\n{_tail(phase_dir)}")
    finally:
        for child, _, _ in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=5)
    merged: dict[str, list[float]] = {kind: [] for kind in KINDS}
    errors: list[str] = []
    for _, _, out in children:
        data = json.loads(out.read_text())
        for kind in KINDS:
            merged[kind].extend(data["latencies"][kind])
        errors.extend(data["errors"])
    checks = merged["check_polled"] + merged["check_not_yet"]
    row: dict[str, Any] = {
        "processes": processes,
        "seconds": seconds,
        "checks_per_second": round(len(checks) / seconds, 1),
        "calls_per_second": round(sum(len(v) for v in merged.values()) / seconds, 1),
        "check_p50_ms": percentile_ms(checks, 50, 2),
        "check_p95_ms": percentile_ms(checks, 95, 2),
        "check_p99_ms": percentile_ms(checks, 99, 2),
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:5],
    }
    for kind in KINDS:
        row[kind] = {
            "count": len(merged[kind]),
            "p50_ms": percentile_ms(merged[kind], 50, 2),
            "p95_ms": percentile_ms(merged[kind], 95, 2),
        }
    return row


def poll_job(worker: str) -> str:
    """The job a worker polls: one per worker, since a job has one operation (and one budget)."""
    return f"busy-{worker}"


async def prepare(
    db: Path | str, base_url: str, processes: int, phases: dict[str, int] | None = None
) -> None:
    """Create the database once (so workers do not race on migrations) and script the workers' jobs."""
    async with open_store(db):
        pass
    phases = phases or {"baseline": 1, "contended": processes}
    await script_running(
        base_url, *(poll_job(f"w{k}-{phase}") for phase, n in phases.items() for k in range(n))
    )


@contextmanager
def scratch_database(engine: str, workdir: Path, pg_url: str) -> Iterator[Path | str]:
    """A SQLite file in `workdir`, or a scratch schema on the PostgreSQL server (dropped after)."""
    if engine == "sqlite":
        yield workdir / "contention.db"
        return
    with scratch_schema(pg_url, "contention") as url:
        yield url


async def budget_violations(db: Path | str) -> int:
    """Operations whose counted requests exceed their budget (the schema forbids it; counted anyway)."""
    async with open_store(db) as store:
        records = await store.list_operations(limit=1_000_000)
    return sum(1 for r in records if r.status_requests_used > r.max_status_requests)


def render(rows: Sequence[dict[str, Any]]) -> str:
    """The result table as fixed-width text."""
    header = (
        f"{'processes':>9} {'checks/s':>9} {'calls/s':>8} {'check p50':>10} {'p95':>8} {'p99':>8} "
        f"{'polled p95':>11} {'not_yet p95':>12} {'start p95':>10} {'errors':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['processes']:>9} {r['checks_per_second']:>9.1f} {r['calls_per_second']:>8.1f} "
            f"{r['check_p50_ms']:>8.2f}ms {r['check_p95_ms']:>6.2f}ms {r['check_p99_ms']:>6.2f}ms "
            f"{r['check_polled']['p95_ms']:>9.2f}ms {r['check_not_yet']['p95_ms']:>10.2f}ms "
            f"{r['start_operation']['p95_ms']:>8.2f}ms {r['errors']:>7}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Driver (default) or one worker (--worker)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=None, help="default: results/contention[_postgres].json")
    parser.add_argument("--engine", choices=("sqlite", "postgres", "both"), default="sqlite")
    parser.add_argument("--rounds", type=int, default=3, help="with --engine both: phases per engine")
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG_URL,
        help="with --engine postgres: a database to create a scratch schema in (dropped after)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="", help=argparse.SUPPRESS)
    parser.add_argument("--db", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tables", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ready", default="", help=argparse.SUPPRESS)
    parser.add_argument("--go", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if not 1 <= args.processes <= 32:
        parser.error("--processes must be 1 to 32")
    if not 1 <= args.seconds <= 120:
        parser.error("--seconds must be 1 to 120")
    quiet_logs()
    if args.engine == "both":
        return _both(args)
    where = machine()
    with fake_provider_workdir() as (workdir, base_url):
        tables = workdir / "tables"
        write_fast_and_slow_tables(tables, base_url)
        with scratch_database(args.engine, workdir, args.pg_url) as db:
            anyio.run(prepare, db, base_url, args.processes)
            rows = [
                run_phase(1, args.seconds, workdir, db, tables, "baseline"),
                run_phase(args.processes, args.seconds, workdir, db, tables, "contended"),
            ]
            violations = anyio.run(budget_violations, db)
    result = {
        "benchmark": "contention",
        "mix": "per round: start_operation, check_status polled, check_status not_yet x2",
        "machine": where,
        "rows": rows,
        "checks_per_second_ratio": round(rows[1]["checks_per_second"] / rows[0]["checks_per_second"], 2),
        "check_p95_ratio": round(rows[1]["check_p95_ms"] / rows[0]["check_p95_ms"], 2),
        "engine": args.engine,
        "budget_violations": violations,
    }
    engine = "SQLite" if args.engine == "sqlite" else "PostgreSQL"
    print(
        f"{args.processes} processes on one {engine} database vs 1, {args.seconds:g} s each, mixed operations"
    )
    print(render(rows))
    print(
        f"checks/s x{result['checks_per_second_ratio']}, check p95 x{result['check_p95_ratio']} "
        f"({where['cpu_count']} CPUs)"
    )
    print(f"budget violations: {violations}")
    out = args.out or RESULTS_DIR / (
        "contention.json" if args.engine == "sqlite" else "contention_postgres.json"
    )
    dump_json(out, result, sort_keys=False)
    print(f"wrote {out}")
    return 0


def _both(args: argparse.Namespace) -> int:
    """The contended phase on SQLite and PostgreSQL in turn; PostgreSQL's checks/s and p95 against SQLite's."""
    where = machine()
    engines = ("sqlite", "postgres")
    phases = {f"{engine}-{r}": args.processes for engine in engines for r in range(args.rounds)}
    rows: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
    violations: dict[str, int] = {}
    with fake_provider_workdir() as (workdir, base_url):
        tables = workdir / "tables"
        write_fast_and_slow_tables(tables, base_url)
        with (
            scratch_database("sqlite", workdir, args.pg_url) as lite,
            scratch_database("postgres", workdir, args.pg_url) as pg,
        ):
            dbs = {"sqlite": lite, "postgres": pg}
            for engine in engines:
                anyio.run(prepare, dbs[engine], base_url, args.processes, phases)
            for r in range(args.rounds):
                for engine in engines:
                    phase = f"{engine}-{r}"
                    rows[engine].append(
                        run_phase(args.processes, args.seconds, workdir, dbs[engine], tables, phase)
                    )
            for engine in engines:
                violations[engine] = anyio.run(budget_violations, dbs[engine])

    def mean(engine: str, key: str) -> float:
        return round(sum(row[key] for row in rows[engine]) / len(rows[engine]), 2)

    summary = {
        engine: {key: mean(engine, key) for key in ("checks_per_second", "check_p50_ms", "check_p95_ms")}
        for engine in engines
    }
    result = {
        "benchmark": "contention",
        "engine": "both",
        "mix": "per round: start_operation, check_status polled, check_status not_yet x2",
        "processes": args.processes,
        "rounds": args.rounds,
        "machine": where,
        "rows": rows,
        "mean": summary,
        "postgres_vs_sqlite": {
            "checks_per_second": round(
                summary["postgres"]["checks_per_second"] / summary["sqlite"]["checks_per_second"], 2
            ),
            "check_p95": round(summary["postgres"]["check_p95_ms"] / summary["sqlite"]["check_p95_ms"], 2),
        },
        "goal": {"checks_per_second_at_least": 0.9, "check_p95_at_most": 1.5},
        "budget_violations": violations,
    }
    for engine in engines:
        print(f"{engine}: {args.processes} processes, {args.rounds} phases of {args.seconds:g} s")
        print(render(rows[engine]))
    ratio = result["postgres_vs_sqlite"]
    print(
        f"PostgreSQL vs SQLite: checks/s x{ratio['checks_per_second']}, check p95 x{ratio['check_p95']}; "
        f"budget violations {violations}"
    )
    out = args.out or RESULTS_DIR / "contention_both.json"
    dump_json(out, result, sort_keys=False)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
