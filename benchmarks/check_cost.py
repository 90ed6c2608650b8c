"""What one check_status costs, beside the bare HTTP request it wraps.

    python benchmarks/check_cost.py                  # 1,000 samples each, about 15 s
    python benchmarks/check_cost.py --samples 200    # quicker

The fake provider runs as its own process on 127.0.0.1; pollwarden runs in
this process behind the in-process MCP `Client` (the full tool path: JSON
schema validation, the controller, SQLite with synchronous=FULL, the audit
chain), on the real clock. Three things are timed, interleaved so drift hits
all of them alike:

- a bare `httpx2` GET of a job's status (keep-alive, like pollwarden's client);
- `check_status` that polls: a table whose schedule allows the next check
  after a microsecond, so every call sends exactly one status request;
- `check_status` answered `not_yet`: a table whose first check is an hour
  away, so nothing is sent (the refusal is still counted in the database).

Prints a table and writes benchmarks/results/check_cost.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx2

if not __package__:  # run as `python benchmarks/check_cost.py`: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.live import (
    call,
    fake_provider_workdir,
    in_process_client,
    script_running,
    structured,
    timing_controller_factory,
)
from benchmarks.measure import (
    RESULTS_DIR,
    dump_json,
    machine,
    median_p95_ms,
    percentile,
    percentile_ms,
    quiet_logs,
)


def stats_ms(samples: Sequence[float]) -> dict[str, float]:
    """Median, p95, p99 and mean of samples in seconds, as milliseconds."""
    return {
        **median_p95_ms(samples),
        "p99_ms": percentile_ms(samples, 99),
        "mean_ms": round(sum(samples) / len(samples) * 1000, 3),
    }


async def run(
    samples: int, warmup: int, workdir: Path, base_url: str, where: dict[str, Any]
) -> dict[str, Any]:
    """Time the three calls, interleaved; return the result document."""
    await script_running(base_url, "cost-poll", "cost-idle")
    factory = timing_controller_factory(workdir / "check_cost.db", base_url)
    bare: list[float] = []
    polled: list[float] = []
    refused: list[float] = []
    async with (
        in_process_client(factory) as client,
        httpx2.AsyncClient(base_url=base_url, timeout=10.0, trust_env=False) as http,
    ):
        for provider, op, job in (("fast", "poll", "cost-poll"), ("slow", "idle", "cost-idle")):
            await call(client, "start_operation", provider=provider, operation_id=op, provider_job_id=job)

        async def timed(work: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
            started = time.perf_counter()
            value = await work()
            return time.perf_counter() - started, value

        for i in range(warmup + samples):
            elapsed_get, response = await timed(lambda: http.get("/v1/jobs/cost-poll"))
            if response.status_code != 200:
                raise RuntimeError(f"bare GET answered {response.status_code}")
            elapsed_poll, result = await timed(
                lambda: client.call_tool("check_status", {"operation_id": "poll"})
            )
            if structured(result)["outcome"] != "polled":
                raise RuntimeError(f"expected a polled check, got {structured(result)}")
            elapsed_refusal, result = await timed(
                lambda: client.call_tool("check_status", {"operation_id": "idle"})
            )
            if structured(result)["outcome"] != "not_yet":
                raise RuntimeError(f"expected not_yet, got {structured(result)}")
            if i >= warmup:
                bare.append(elapsed_get)
                polled.append(elapsed_poll)
                refused.append(elapsed_refusal)

    rows = {
        "bare_httpx2_get": stats_ms(bare),
        "check_status_polled": stats_ms(polled),
        "check_status_not_yet": stats_ms(refused),
    }
    ratios = {
        "polled_over_get_median": round(percentile(polled, 50) / percentile(bare, 50), 2),
        "polled_over_get_p95": round(percentile(polled, 95) / percentile(bare, 95), 2),
        "not_yet_over_get_median": round(percentile(refused, 50) / percentile(bare, 50), 2),
        "not_yet_over_get_p95": round(percentile(refused, 95) / percentile(bare, 95), 2),
    }
    return {
        "benchmark": "check_cost",
        "samples": samples,
        "warmup": warmup,
        "machine": where,
        "database": "SQLite WAL, synchronous=FULL, in a temporary directory",
        "rows": rows,
        "ratios": ratios,
    }


def render(result: dict[str, Any]) -> str:
    """The result table as fixed-width text."""
    rows: dict[str, dict[str, float]] = result["rows"]
    ratios: dict[str, float] = result["ratios"]
    bare = rows["bare_httpx2_get"]
    header = f"{'call':<34} {'median ms':>10} {'p95 ms':>8} {'p99 ms':>8} {'x GET (median/p95)':>20}"
    lines = [header, "-" * len(header)]
    lines.append(
        f"{'bare httpx2 GET (loopback)':<34} {bare['median_ms']:>10.2f} {bare['p95_ms']:>8.2f} "
        f"{bare['p99_ms']:>8.2f} {'1.00 / 1.00':>20}"
    )
    for key, label, ratio in (
        ("check_status_polled", "check_status -> polled (1 GET)", "polled"),
        ("check_status_not_yet", "check_status -> not_yet (no GET)", "not_yet"),
    ):
        row = rows[key]
        both = f"{ratios[f'{ratio}_over_get_median']:.2f} / {ratios[f'{ratio}_over_get_p95']:.2f}"
        lines.append(
            f"{label:<34} {row['median_ms']:>10.2f} {row['p95_ms']:>8.2f} {row['p99_ms']:>8.2f} {both:>20}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Start the fake provider, time the calls, print and save the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "check_cost.json")
    args = parser.parse_args(argv)
    quiet_logs()
    if not 1 <= args.samples <= 100_000:
        parser.error("--samples must be 1 to 100000")
    where = machine(processor=True)
    with fake_provider_workdir() as (workdir, base_url):
        result = anyio.run(run, args.samples, args.warmup, workdir, base_url, where)
    print(
        f"check_status through the in-process MCP client, {args.samples} samples each (after {args.warmup} warm-up)"
    )
    print(render(result))
    dump_json(args.out, result, sort_keys=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
