"""Does a check cost more when the database holds many operations?

    python benchmarks/scale.py                       # 10 then 100,000 active operations, a few minutes
    python benchmarks/scale.py --operations 10000    # quicker
    python benchmarks/scale.py --engine postgres     # the same on PostgreSQL (two scratch schemas)

The fake provider runs as its own process on 127.0.0.1; pollwarden runs in
this process behind the in-process MCP `Client`, on the real clock, with
SQLite files in WAL mode (synchronous=FULL; NORMAL for a refusal's counter).
Two databases: one keeps 10 active (waiting) operations, the other is filled
to `--operations` with real `start_operation` calls (through the controller
directly, one transaction and audit row each, as the tool does; 8 at a time). Then the
calls are made on each database in turn, so machine load hits both alike:
`check_status` that polls (one provider request), `check_status` answered
`not_yet`, and `start_operation` through the MCP client (median, p95,
throughput). The fill itself gives `start_operation` throughput through the
controller. The target: a check at 100,000 operations costs at most 1.1 times
what it costs at 10.

Prints a table and writes benchmarks/results/scale.json (scale_postgres.json).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
from mcp.client import Client

if not __package__:  # run as `python benchmarks/scale.py`: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.live import (
    Database,
    call,
    fake_provider_workdir,
    in_process_client,
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
    quiet_logs,
    scratch_schema,
)
from pollwarden.store import DatabaseLocation

SMALL = 10


class Bench:
    """One database and one MCP client; names new operations."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.created = 0

    async def start(self, provider: str, job: str) -> str:
        """A new operation on `job`; an idle one gets a job of its own (a job has one operation)."""
        self.created += 1
        op = f"{provider}-{self.created:06d}"
        job_id = job if job == "scale-poll" else f"{job}-{self.created:06d}"
        await call(self.client, "start_operation", provider=provider, operation_id=op, provider_job_id=job_id)
        return op

    async def check(self, op: str, expect: str) -> float:
        started = time.perf_counter()
        result = await self.client.call_tool("check_status", {"operation_id": op})
        elapsed = time.perf_counter() - started
        outcome = structured(result)["outcome"]
        if outcome != expect:
            raise RuntimeError(f"expected {expect} for {op}, got {outcome}")
        return elapsed

    async def timed_start(self) -> float:
        started = time.perf_counter()
        await self.start("slow", "scale-idle")
        return time.perf_counter() - started


async def _interleaved(
    benches: Sequence[Bench], samples: int, poll_ops: Sequence[str], idle_ops: Sequence[Sequence[str]]
) -> list[dict[str, Any]]:
    """check_status polled and not_yet, and start_operation, on each database in turn, call by call.

    Interleaving puts both databases under the same machine load, whatever else runs.
    """
    polled: list[list[float]] = [[] for _ in benches]
    refused: list[list[float]] = [[] for _ in benches]
    starts: list[list[float]] = [[] for _ in benches]
    for i in range(samples):
        for k, bench in enumerate(benches):
            polled[k].append(await bench.check(poll_ops[k], "polled"))
            refused[k].append(await bench.check(idle_ops[k][i % len(idle_ops[k])], "not_yet"))
            starts[k].append(await bench.timed_start())
    return [
        {
            "check_status_polled": median_p95_ms(polled[k]),
            "check_status_not_yet": median_p95_ms(refused[k]),
            "start_operation_mcp_per_second": round(len(starts[k]) / sum(starts[k]), 1),
        }
        for k in range(len(benches))
    ]


FILLERS = 8


async def run(
    operations: int,
    samples: int,
    workdir: Path,
    base_url: str,
    small_db: Database,
    large_db: Database,
    bulk: bool = False,
) -> dict[str, Any]:
    """Fill one database to `operations`, keep another at 10, then measure both, interleaved."""
    await script_running(base_url, "scale-poll", "scale-idle")
    small_factory = timing_controller_factory(small_db, base_url)
    large_factory = timing_controller_factory(large_db, base_url)
    async with (
        in_process_client(small_factory) as small_client,
        in_process_client(large_factory) as large_client,
        large_factory() as filler,
    ):
        small, large = Bench(small_client), Bench(large_client)
        idle_small = [await small.start("slow", "scale-idle") for _ in range(SMALL - 1)]
        poll_small = await small.start("fast", "scale-poll")
        poll_large = await large.start("fast", "scale-poll")

        fill = operations - 1

        async def fill_some(first: int) -> None:
            for n in range(first, fill, FILLERS):
                await filler.start_operation(
                    provider="slow", operation_id=f"fill-{n:06d}", provider_job_id=f"scale-idle-fill-{n:06d}"
                )

        started = time.perf_counter()
        if bulk and isinstance(large_db, DatabaseLocation):
            # One real start_operation, then copies of its row and audit row under new ids (one statement each).
            await filler.start_operation(
                provider="slow", operation_id="fill-000000", provider_job_id="scale-idle-fill-000000"
            )
            _bulk_copies(large_db, "fill-000000", fill)
        else:
            async with anyio.create_task_group() as tg:
                for first in range(FILLERS):
                    tg.start_soon(fill_some, first)
        fill_seconds = time.perf_counter() - started
        # Idle operations spread across the whole id range, so reads are not all in one page.
        spread = [f"fill-{n:06d}" for n in range(0, fill, max(1, fill // 50))]
        counts = [await filler.store.count_operations()]

        await _interleaved(
            [small, large], max(20, samples // 10), [poll_small, poll_large], [idle_small, spread]
        )
        measured = await _interleaved([small, large], samples, [poll_small, poll_large], [idle_small, spread])
    return {
        "small": {"operations": SMALL, **measured[0]},
        "large": {"operations": counts[0], **measured[1]},
        "fill": {
            "start_operation_calls": 1 if bulk else fill,
            "copied_rows": fill - 1 if bulk else 0,
            "concurrent_calls": FILLERS,
            "seconds": round(fill_seconds, 2),
            "start_operation_controller_per_second": None if bulk else round(fill / fill_seconds, 1),
        },
        "database_bytes": _database_bytes(large_db),
    }


def _bulk_copies(db: DatabaseLocation, template: str, fill: int) -> None:
    """Copies of `template`'s operation row and audit row as fill-000001…, then the head moved past them.

    The copies are not a valid chain (their hashes are the template's); `scale.py` measures checks, not
    `audit verify`. New rows link to the head as ever.
    """
    import psycopg

    from pollwarden.core.records import OPERATION_COLUMNS

    new_id = "'fill-' || lpad(g::text, 6, '0')"
    replaced = {
        "operation_id": new_id,
        "provider_job_id": "'scale-idle-fill-' || lpad(g::text, 6, '0')",
        "created_at": "created_at + g * 0.001",
    }
    columns = ", ".join(OPERATION_COLUMNS)
    values = ", ".join(replaced.get(c, c) for c in OPERATION_COLUMNS)
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO operations ({columns}) SELECT {values} FROM operations, "  # pyright: ignore[reportArgumentType]
            f"generate_series(1, {fill - 1}) AS g WHERE operation_id = %s",
            (template,),
        )
        # Each copy's first row is a row of the one chain (its place after the head), as a start makes it.
        conn.execute(
            "INSERT INTO audit (position, link, operation_id, at, kind, payload, prev_hash, hash, keyed) "
            f"SELECT h.seq + g, 'chain', {new_id}, a.at, a.kind, a.payload, a.prev_hash, a.hash, a.keyed "  # pyright: ignore[reportArgumentType]
            f"FROM audit AS a, audit_head AS h, generate_series(1, {fill - 1}) AS g WHERE a.operation_id = %s "
            "ORDER BY g",
            (template,),
        )
        conn.execute(
            "UPDATE operations AS o SET audit_rows = 1, audit_hash = a.hash, audit_sealed_rows = 1 "
            "FROM audit AS a WHERE a.operation_id = o.operation_id AND o.operation_id LIKE 'fill-%'"
        )
        conn.execute(
            "UPDATE audit_head SET seq = (SELECT max(position) FROM audit WHERE link = 'chain'), "
            "hash = (SELECT hash FROM audit WHERE link = 'chain' ORDER BY position DESC LIMIT 1)"
        )
        conn.execute("VACUUM ANALYZE operations")
        conn.execute("VACUUM ANALYZE audit")


def _database_bytes(db: Database) -> int:
    if isinstance(db, Path):
        return db.stat().st_size + sum(p.stat().st_size for p in db.parent.glob(f"{db.name}-*"))
    import psycopg

    with psycopg.connect(db.dsn) as conn:
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind = 'r'"
        ).fetchone()
    return 0 if row is None else int(row[0])


def render(result: dict[str, Any]) -> str:
    """The result table as fixed-width text."""
    small, large, fill = result["small"], result["large"], result["fill"]
    header = f"{'measure':<38} {small['operations']:>9,} ops {large['operations']:>9,} ops {'ratio':>7}"
    lines = [header, "-" * len(header)]
    for key, label in (
        ("check_status_polled", "check_status -> polled"),
        ("check_status_not_yet", "check_status -> not_yet"),
    ):
        for stat in ("median_ms", "p95_ms"):
            a, b = small[key][stat], large[key][stat]
            lines.append(
                f"{label + ' ' + stat.replace('_ms', ' (ms)'):<38} {a:>13.2f} {b:>13.2f} {b / a:>7.2f}"
            )
    a, b = small["start_operation_mcp_per_second"], large["start_operation_mcp_per_second"]
    lines.append(f"{'start_operation via MCP (per second)':<38} {a:>13.1f} {b:>13.1f} {b / a:>7.2f}")
    if fill.get("copied_rows"):
        lines.append(
            f"fill: 1 start_operation call, then {fill['copied_rows']:,} copies of its rows by SQL in "
            f"{fill['seconds']:.1f} s; database {result['database_bytes'] / 1e6:.1f} MB"
        )
        return "\n".join(lines)
    lines.append(
        f"fill: {fill['start_operation_calls']:,} start_operation calls through the controller in "
        f"{fill['seconds']:.1f} s = {fill['start_operation_controller_per_second']:.0f}/s; "
        f"database {result['database_bytes'] / 1e6:.1f} MB"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Start the fake provider, measure, print and save the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--operations", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--out", type=Path, default=None, help="default: results/scale[_postgres].json")
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--fill",
        choices=("calls", "copies"),
        default="calls",
        help="calls: start_operation through the controller; copies (postgres): one real call, then its "
        "rows copied by SQL (bounded time on a loaded machine)",
    )
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG_URL,
        help="with --engine postgres: a database to create two scratch schemas in (dropped after)",
    )
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = RESULTS_DIR / ("scale.json" if args.engine == "sqlite" else "scale_postgres.json")
    quiet_logs()
    if not 100 <= args.operations <= 100_000:
        parser.error("--operations must be 100 to 100000")
    if not 10 <= args.samples <= 10_000:
        parser.error("--samples must be 10 to 10000")
    where = machine()
    with fake_provider_workdir() as (workdir, base_url), ExitStack() as scratch:
        if args.engine == "sqlite":
            small_db: Database = workdir / "small.db"
            large_db: Database = workdir / "large.db"
        else:
            small_db = DatabaseLocation.parse(
                scratch.enter_context(scratch_schema(args.pg_url, "scale_small"))
            )
            large_db = DatabaseLocation.parse(
                scratch.enter_context(scratch_schema(args.pg_url, "scale_large"))
            )
        bulk = args.fill == "copies"
        measured = anyio.run(run, args.operations, args.samples, workdir, base_url, small_db, large_db, bulk)
    result = {
        "benchmark": "scale",
        "engine": args.engine,
        "samples": args.samples,
        "start_operation_mcp_calls": args.samples,
        "interleaved": True,
        "machine": where,
        **measured,
    }
    print(
        f"check_status cost as the database grows on {args.engine} "
        f"({args.samples} samples each, in-process MCP client)"
    )
    print(render(result))
    dump_json(args.out, result, sort_keys=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
