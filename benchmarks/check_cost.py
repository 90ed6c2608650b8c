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
import json
import logging
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp.client import Client

from pollwarden.config import ServerConfig
from pollwarden.server import build_server, controller_factory
from pollwarden_providers.table import ProviderTable

RESULTS = Path(__file__).resolve().parent / "results"
STARTUP_SECONDS = 15.0


def provider_table(name: str, base_url: str, delay_seconds: float) -> ProviderTable:
    """A table for the fake provider whose every check is `delay_seconds` after the last."""
    return ProviderTable.model_validate(
        {
            "name": name,
            "base_url": base_url,
            "status_path": "/v1/jobs/{job_id}",
            "response": {"state_field": "state"},
            "states": {
                "pending": ["queued", "running"],
                "succeeded": ["succeeded"],
                "failed": ["failed"],
                "cancelled": ["cancelled"],
                "expired": ["expired"],
            },
            "success": {"required_fields": ["result_url"]},
            "schedule": {"base_delay_seconds": delay_seconds, "max_delay_seconds": delay_seconds},
            "limits": {
                "default_deadline_seconds": 86400,
                "max_deadline_seconds": 86400,
                # Large enough that one operation can be polled for the whole run.
                "default_max_status_requests": 1_000_000,
                "max_status_requests": 1_000_000,
            },
        }
    )


@contextmanager
def fake_provider_process(workdir: Path) -> Generator[str]:
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
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            first = log_path.read_text().splitlines()[:1]
            if first and first[0].startswith("http://127.0.0.1:"):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fake provider did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.02)
        yield first[0].strip()
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def quiet_logs() -> None:
    """Warnings only: one INFO line per provider request would be most of the output."""
    logging.basicConfig(level=logging.WARNING)
    for name in ("httpx2", "httpx", "mcp", "pollwarden"):
        logging.getLogger(name).setLevel(logging.WARNING)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100.0 * len(ordered))) - 1]


def stats_ms(samples: Sequence[float]) -> dict[str, float]:
    """Median, p95, p99 and mean of samples in seconds, as milliseconds."""
    return {
        "median_ms": round(percentile(samples, 50) * 1000, 3),
        "p95_ms": round(percentile(samples, 95) * 1000, 3),
        "p99_ms": round(percentile(samples, 99) * 1000, 3),
        "mean_ms": round(sum(samples) / len(samples) * 1000, 3),
    }


def machine() -> dict[str, Any]:
    """Where the numbers came from."""
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def structured(result: Any) -> dict[str, Any]:
    """The structured output of a tool call; a tool error raises with its text."""
    if result.is_error:
        raise RuntimeError(" ".join(getattr(b, "text", "") for b in result.content))
    value: dict[str, Any] = result.structured_content
    return value


async def run(
    samples: int, warmup: int, workdir: Path, base_url: str, where: dict[str, Any]
) -> dict[str, Any]:
    """Time the three calls, interleaved; return the result document."""
    async with httpx2.AsyncClient(base_url=base_url, timeout=10.0, trust_env=False) as control:
        for job in ("cost-poll", "cost-idle"):
            body = {"kind": "status", "job_id": job, "steps": [{"status": 200, "body": {"state": "running"}}]}
            (await control.post("/_control/script", json=body)).raise_for_status()

    tables = {
        "fast": provider_table("fast", base_url, 0.000001),
        "slow": provider_table("slow", base_url, 3600.0),
    }
    config = ServerConfig(db_path=workdir / "check_cost.db")
    server = build_server(controller_factory(config, tables=tables))
    bare: list[float] = []
    polled: list[float] = []
    refused: list[float] = []
    async with (
        Client(server) as client,
        httpx2.AsyncClient(base_url=base_url, timeout=10.0, trust_env=False) as http,
    ):
        for provider, op, job in (("fast", "poll", "cost-poll"), ("slow", "idle", "cost-idle")):
            args = {"provider": provider, "operation_id": op, "provider_job_id": job}
            structured(await client.call_tool("start_operation", args))

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
    parser.add_argument("--out", type=Path, default=RESULTS / "check_cost.json")
    args = parser.parse_args(argv)
    quiet_logs()
    if not 1 <= args.samples <= 100_000:
        parser.error("--samples must be 1 to 100000")
    where = machine()
    with tempfile.TemporaryDirectory(prefix="pollwarden-bench-") as tmp:
        workdir = Path(tmp)
        with fake_provider_process(workdir) as base_url:
            result = anyio.run(run, args.samples, args.warmup, workdir, base_url, where)
    print(
        f"check_status through the in-process MCP client, {args.samples} samples each (after {args.warmup} warm-up)"
    )
    print(render(result))
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
