"""The PostgreSQL engine alone: reservation and answer-plus-audit transactions from 8 connections.

No MCP, no provider: worker processes drive the engine's own transactions
directly, each on connections of its own (8 in all by default), for a fixed
time, on operations of their own (as 8 agents checking 8 jobs would):

* reservation: the engine's one-statement reservation (a guarded
  `UPDATE … RETURNING`, committed with synchronous_commit on, one trip), the
  path `begin_check` takes when nothing else goes with the reservation;
* answer + audit: `Store.apply_answer` — the operation row and the audit head
  locked, the answer written, one audit row linked to the one global chain,
  committed (two trips).

Goals (issue 18): ≥ 5,000 reservation tx/s and ≥ 3,000 answer-plus-audit tx/s.
The chain is verified after the run. Results: benchmarks/results/engine_alone.json.

    python -m benchmarks.engine_alone [--url postgresql://postgres@127.0.0.1:5432/test] [--seconds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import anyio

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import DEFAULT_PG_URL, RESULTS_DIR, dump_json, machine, percentile_ms, scratch_schema
from pollwarden.audit import verify_chain
from pollwarden.store import DatabaseLocation, open_store
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.engine import PostgresStore


def _values(operation_id: str) -> dict[str, object]:
    return {
        "operation_id": operation_id,
        "provider": "bench",
        "provider_job_id": operation_id,
        "account_context": "bench",
        "request_fingerprint": "f",
        "idempotency_key": None,
        "expected_terminal_state": "succeeded",
        "status": "waiting",
        "started_at": 0.0,
        "deadline_at": 4e9,
        "business_deadline_at": None,
        "max_status_requests": 1_000_000_000,
        "max_transport_failures": 3,
        "max_rate_limited": 3,
        "next_check_at": 0.0,
        "delay_source": "local_backoff",
        "submit_payload_json": None,
        "created_at": 0.0,
        "updated_at": 0.0,
    }


async def _worker(url: str, kind: str, ops: list[str], seconds: float, start_at: float) -> list[float]:
    async with open_store(url) as store:
        pg = cast(PostgresStore, store)
        pool = pg._pool  # pyright: ignore[reportPrivateUsage]  # the engine's own transaction, driven directly
        latencies: list[float] = []
        await anyio.sleep(max(0.0, start_at - time.time()))
        stop = start_at + seconds

        async def loop(op: str) -> None:
            now = 1.0
            while time.time() < stop:
                now += 1.0
                began = time.perf_counter()
                if kind == "reservation":
                    params = {"owner": "bench", "lease_expires_at": now, "now": now, "operation_id": op}
                    reserved = await pool.write_one(
                        sql.RESERVE.replace("version = %(version)s AND ", ""), params
                    )
                    assert reserved is not None
                else:
                    # The answer of a check whose lease is free (owner None matches): applied every time.
                    await pg.apply_answer(
                        op, owner=cast(str, None), changes={"polls_completed": 0}, at=now, payload_extra={}
                    )
                latencies.append(time.perf_counter() - began)

        async with anyio.create_task_group() as tg:
            for op in ops:
                tg.start_soon(loop, op)
        return latencies


def _process(url: str, kind: str, ops: list[str], seconds: float, start_at: float, out: Any) -> None:
    out.put(anyio.run(_worker, url, kind, ops, seconds, start_at))


def run(url: str, kind: str, *, connections: int, processes: int, seconds: float) -> dict[str, Any]:
    """One phase: `connections` operations, spread over `processes` worker processes."""
    ops = [f"{kind}-{i}" for i in range(connections)]

    async def create() -> None:
        async with open_store(url) as store:
            for op in ops:
                await store.create_operation(_values(op), kind="tracking_started", at=0.5)

    anyio.run(create)
    queue: Any = multiprocessing.get_context("spawn").Queue()
    start_at = time.time() + 3.0  # every worker connected before the clock starts
    workers = [
        multiprocessing.get_context("spawn").Process(
            target=_process, args=(url, kind, ops[p::processes], seconds, start_at, queue)
        )
        for p in range(processes)
    ]
    for w in workers:
        w.start()
    latencies: list[float] = []
    for _ in workers:
        latencies.extend(queue.get(timeout=seconds + 60))
    for w in workers:
        w.join(timeout=30)
    return {
        "transactions": len(latencies),
        "per_second": round(len(latencies) / seconds),
        "p50_ms": percentile_ms(latencies, 50),
        "p95_ms": percentile_ms(latencies, 95),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=DEFAULT_PG_URL, help="a PostgreSQL database to create a schema in")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "engine_alone.json")
    args = parser.parse_args(argv)

    with scratch_schema(args.url, "bench") as url:
        phases = {
            kind: run(url, kind, connections=args.connections, processes=args.processes, seconds=args.seconds)
            for kind in ("reservation", "answer_audit")
        }
        verdict = verify_chain(DatabaseLocation.parse(url), None)
    summary = {
        "engine": "postgresql",
        "connections": args.connections,
        "processes": args.processes,
        "seconds": args.seconds,
        "reservation": phases["reservation"],
        "answer_audit": phases["answer_audit"],
        "goals": {"reservation_per_second": 5000, "answer_audit_per_second": 3000},
        "audit_chain_ok": verdict.ok,
        "audit_rows": verdict.rows_checked,
        "machine": machine(processor=True),
    }
    dump_json(args.out, summary)
    for kind in ("reservation", "answer_audit"):
        p = phases[kind]
        print(f"{kind:13} {p['per_second']:>7,}/s  p50 {p['p50_ms']} ms  p95 {p['p95_ms']} ms")
    print(f"audit chain {'OK' if verdict.ok else 'BROKEN'}: {verdict.rows_checked} rows; JSON: {args.out}")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
