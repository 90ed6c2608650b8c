"""How long one /metrics scrape takes to read the database, as the audit grows (issue 34).

The database half of the exposition (`pollwarden.ops.metrics.exposition`) is a few aggregate
statements per scrape; the refused calls already summarized in the audit are summed from the
summary rows' JSON. This fills a SQLite database (a temporary directory) with operations and
audit rows written directly (one summary row in `--summary-every`), then times the exposition:
median of five scrapes at each size.

    .venv/bin/python benchmarks/metrics_scrape.py            # 10k, 100k and 1M audit rows, ~2 min
    .venv/bin/python benchmarks/metrics_scrape.py --sizes 10000 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from pollwarden.ops.metrics import exposition
from pollwarden.store import open_store

RESULTS = Path(__file__).parent / "results" / "metrics_scrape.json"
PAYLOAD = json.dumps({"decision": "polled", "count": 3, "note": "x" * 400})


async def create(db: Path) -> None:
    async with open_store(db):
        pass  # migrated, empty


def fill(db: Path, operations: int, audit_rows: int, summary_every: int) -> None:
    conn = sqlite3.connect(db)
    template = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'operations'").fetchone()
    assert template is not None
    with conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("DROP TRIGGER IF EXISTS audit_append_only")  # written directly: this is a fixture
        conn.executemany(
            "INSERT INTO operations (operation_id, provider, account_context, request_fingerprint, "
            "expected_terminal_state, status, started_at, deadline_at, max_status_requests, "
            "max_transport_failures, max_rate_limited, next_check_at, delay_source, created_at, updated_at) "
            "VALUES (?, ?, '', '', '[]', 'waiting', 0, 1e10, 100, 3, 3, 0, 'local_backoff', 0, 0)",
            [(f"op-{i}", f"provider-{i % 5}") for i in range(operations)],
        )
        conn.executemany(
            "INSERT INTO audit (seq, operation_id, at, kind, payload, prev_hash, hash) VALUES (?, ?, ?, ?, ?, '', '')",
            (
                (
                    i + 1,
                    f"op-{i % operations}",
                    "2026-12-04T00:00:00.000Z",
                    "not_yet_summary" if i % summary_every == 0 else "polled",
                    PAYLOAD,
                )
                for i in range(audit_rows)
            ),
        )
    conn.close()


async def scrape(db: Path, times: int = 5) -> float:
    async with open_store(db) as store:
        taken: list[float] = []
        for _ in range(times):
            started = time.perf_counter()
            await exposition(store, now=time.time())
            taken.append(time.perf_counter() - started)
    return statistics.median(taken)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--operations", type=int, default=20_000)
    parser.add_argument("--summary-every", type=int, default=50)
    args = parser.parse_args()
    rows: list[dict[str, float]] = []
    print(f"{'audit rows':>12} {'operations':>11} {'scrape median (ms)':>19}")
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "pollwarden.db"
            asyncio.run(create(db))
            fill(db, args.operations, size, args.summary_every)
            median = asyncio.run(scrape(db))
        rows.append({"audit_rows": size, "operations": args.operations, "scrape_median_ms": median * 1000})
        print(f"{size:>12,} {args.operations:>11,} {median * 1000:>19.1f}")
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
