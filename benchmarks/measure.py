"""The numbers side of the benchmarks: percentiles, where a run happened, quiet logs, the JSON file.

Shared by every script in `benchmarks/`; the processes, tables and clients they
measure are in `tests/support/live.py` (shared with the tests).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# The PostgreSQL server the `--engine postgres` runs create their scratch schemas on.
DEFAULT_PG_URL = os.environ.get("POLLWARDEN_TEST_PG") or "postgresql://postgres@127.0.0.1:5432/test"


@contextmanager
def scratch_schema(pg_url: str, name: str) -> Iterator[str]:
    """A scratch schema `pw_<name>_<pid>` on the PostgreSQL server (dropped after); its URL."""
    import psycopg

    schema = f"pw_{name}_{os.getpid()}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # pyright: ignore[reportArgumentType]
    try:
        yield f"{pg_url}{'&' if '?' in pg_url else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")  # pyright: ignore[reportArgumentType]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[max(1, math.ceil(q / 100.0 * len(ordered))) - 1]


def percentile_ms(samples: Sequence[float], q: float, digits: int = 3) -> float:
    """A percentile of samples in seconds, as rounded milliseconds."""
    return round(percentile(samples, q) * 1000, digits)


def median_p95_ms(samples: Sequence[float]) -> dict[str, float]:
    """Median and p95 of samples in seconds, as milliseconds."""
    return {"median_ms": percentile_ms(samples, 50), "p95_ms": percentile_ms(samples, 95)}


def machine(*, processor: bool = False) -> dict[str, Any]:
    """Where the numbers came from (with the processor name when asked)."""
    where: dict[str, Any] = {"platform": platform.platform(), "machine": platform.machine()}
    if processor:
        where["processor"] = platform.processor() or "unknown"
    where["cpu_count"] = os.cpu_count()
    where["python"] = platform.python_version()
    where["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return where


def quiet_logs() -> None:
    """Warnings only: one INFO line per provider request would be most of the output."""
    logging.basicConfig(level=logging.WARNING)
    for name in ("httpx2", "httpx", "mcp", "pollwarden"):
        logging.getLogger(name).setLevel(logging.WARNING)


def dump_json(path: Path, value: object, *, sort_keys: bool = True) -> None:
    """Write pretty JSON, creating the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=sort_keys) + "\n")


def run_and_report(
    run: Callable[[Path], Awaitable[dict[str, Any]]],
    *,
    workdir_prefix: str,
    out: Path,
    print_table: Callable[[dict[str, Any]], None],
) -> int:
    """Run a check in a temporary directory, write its summary as JSON, print it; 1 on any violation."""
    with tempfile.TemporaryDirectory(prefix=workdir_prefix) as tmp:
        summary = anyio.run(run, Path(tmp))
    dump_json(out, summary)
    print_table(summary)
    print(f"JSON: {out}")
    return 1 if summary["violations"] else 0
