"""The PostgreSQL engine alone: reservation and answer-plus-audit transactions from 8 connections.

No MCP, no provider: worker processes drive the engine's own transactions
directly, each on connections of its own (8 in all by default), for a fixed
time, on operations of their own (as 8 agents checking 8 jobs would):

* reservation: the engine's one-statement reservation (a guarded
  `UPDATE … RETURNING`, committed with synchronous_commit on, one trip), the
  path `begin_check` takes when nothing else goes with the reservation;
* answer + audit: the answer a check writes after its own reservation — the
  operation row updated under its guard (version, lease, no refusal, no audit
  row since) and one audit row appended to that operation's own chain,
  committed in one trip (`PostgresStore._answer_as_reserved`'s statements,
  driven directly: each answer keeps the lease, so the next one's guard holds);
* answer + audit, locked: `Store.apply_answer` without a reservation of this
  process (the row locked and read, then the writes: two trips).

Goals (issue 18): ≥ 5,000 reservation tx/s and ≥ 3,000 answer-plus-audit tx/s.
The audit is verified after the run.

The ceiling, measured right after in the same run (when `pgbench` is on PATH):
the same two transactions, statement for statement and trip for trip, driven
by pgbench (C, no Python, 8 connections) on a scratch schema of their own —
what this machine's PostgreSQL and disk allow whatever the client does — and
the answer as it was with one chain for every row (the head locked by every
answer: what per-operation chains removed).
Results: benchmarks/results/engine_alone.json.

    python -m benchmarks.engine_alone [--url postgresql://postgres@127.0.0.1:5432/test] [--seconds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import anyio

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import DEFAULT_PG_URL, RESULTS_DIR, dump_json, machine, percentile_ms, scratch_schema
from pollwarden.audit.entry import event
from pollwarden.audit.verify import verify_chain
from pollwarden.core.vocabulary import Outcome
from pollwarden.store import DatabaseLocation, open_store, plans
from pollwarden.store.postgres import sql
from pollwarden.store.postgres.connection import Pool, Row
from pollwarden.store.postgres.engine import PostgresStore
from pollwarden.store.postgres.executor import answer_statement
from pollwarden.store.sqlite.executor import StoredOperation, stored


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
            held = stored(cast(Row, await pool.read_one(sql.SELECT_OPERATION, {"operation_id": op})))
            while time.time() < stop:
                now += 1.0
                began = time.perf_counter()
                if kind == "reservation":
                    params = {"owner": "bench", "lease_expires_at": now, "now": now, "operation_id": op}
                    reserved = await pool.write_one(
                        sql.RESERVE.replace("version = %(version)s AND ", ""), params
                    )
                    assert reserved is not None
                elif kind == "answer_audit":
                    held = await _answer_as_reserved(pool, held, now)
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


async def _answer_as_reserved(pool: Pool, held: StoredOperation, now: float) -> StoredOperation:
    """One answer in one statement, as `CheckProcedure._answer_as_reserved` writes it, keeping the lease."""
    changes = {"polls_completed": held.record.polls_completed + 1, "last_http_status": 200}
    answered = plans.updated(held.record, changes, now)
    polled = plans.Append(event(answered, "polled", now, outcome=Outcome.POLLED))
    plan = plans.Plan(answered, (plans.Update(changes, now), polled))
    statement, params, after = answer_statement(held, plan, owner="bench", key=None)
    await pool.write_one(statement, params)
    return after


async def create_operations(url: str, ops: Sequence[str], leased: bool) -> None:
    """The phase's operations; `leased`: each held by the lease a reservation of "bench" takes."""
    async with open_store(url) as store:
        for op in ops:
            await store.create_operation(_values(op), kind="tracking_started", at=0.5)
            if leased:
                check = {"wait_until": 0.0, "lease_seconds": 4e9, "fleets": {"bench": None}}
                await store.begin_check(op, now=1.0, owner="bench", **check)


def _process(url: str, kind: str, ops: list[str], seconds: float, start_at: float, out: Any) -> None:
    out.put(anyio.run(_worker, url, kind, ops, seconds, start_at))


def run(url: str, kind: str, *, connections: int, processes: int, seconds: float) -> dict[str, Any]:
    """One phase: `connections` operations, spread over `processes` worker processes."""
    ops = [f"{kind}-{i}" for i in range(connections)]
    anyio.run(create_operations, url, ops, kind == "answer_audit")
    queue: Any = multiprocessing.get_context("spawn").Queue()
    start_at = time.time() + 5.0  # every worker connected before the clock starts (a loaded machine)
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


# The transactions as pgbench scripts (prepared statements; each pipeline is one trip).
_PGBENCH_RESERVATION = """\\set n random(0, {last})
UPDATE operations SET status_requests_used = status_requests_used + 1, fleet_slot_at = NULL, \
lease_owner = 'bench', lease_expires_at = 0, version = version + 1, updated_at = 1 \
WHERE operation_id = 'reservation-' || (:n)::int AND status = 'waiting' \
AND status_requests_used < max_status_requests RETURNING *;
"""
# The one-statement answer: the guarded update and its row in the operation's own chain, committed alone.
_PGBENCH_ANSWER = """\\set n random(0, {last})
WITH written AS (UPDATE operations SET polls_completed = polls_completed + 1, last_http_status = 200, \
audit_rows = audit_rows + 1, audit_hash = md5(random()::text), version = version + 1, updated_at = 2 \
WHERE operation_id = 'answer_audit-' || (:n)::int AND lease_owner = 'bench' AND refused_count = 0 \
RETURNING 1), {append};
"""
# The answer as it was with one chain for every row: the row and the head locked, then the writes.
_PGBENCH_ONE_CHAIN = """\\set n random(0, {last})
\\startpipeline
BEGIN;
SELECT * FROM operations WHERE operation_id = 'answer_audit-' || (:n)::int FOR UPDATE;
SELECT seq, hash, keyed FROM audit_head FOR UPDATE;
\\endpipeline
\\startpipeline
UPDATE operations SET polls_completed = 0, version = version + 1 WHERE operation_id = 'answer_audit-' || (:n)::int;
INSERT INTO audit (position, link, operation_id, at, kind, payload, prev_hash, hash, keyed) \
SELECT seq + 1, 'chain', 'answer_audit-' || (:n)::int, '1970-01-01T00:00:01.000Z', 'polled', '{payload}', \
hash, md5(random()::text), false FROM audit_head;
UPDATE audit_head SET seq = seq + 1, hash = md5(random()::text);
COMMIT;
\\endpipeline
"""
_PAYLOAD = "{" + '"note":"' + "x" * 700 + '"}'


def _pgbench_append() -> str:
    """The engine's insert of an operation row (as `sql.answer_statement` has it), with a real row's size."""
    values = {
        "position": "2", "link": "'operation'", "operation_id": "'answer_audit-' || (:n)::int",
        "at": "'1970-01-01T00:00:01.000Z'", "kind": "'polled'", "payload": f"'{_PAYLOAD}'",
        "prev_hash": "md5('a')", "hash": "md5(random()::text)", "keyed": "false",
    }  # fmt: skip
    text = sql.answer_statement(("polls_completed",))
    text = text[text.index("linked AS") :]
    for name, value in values.items():
        text = text.replace(f"%(a_{name})s", value)
    return text


def ceiling(url: str, *, connections: int, seconds: float) -> dict[str, Any] | None:
    """The same transactions from pgbench (None without pgbench on PATH)."""

    pgbench = shutil.which("pgbench")
    if pgbench is None:
        return None
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        shapes = {
            "reservation": _PGBENCH_RESERVATION,
            "answer_audit": _PGBENCH_ANSWER,
            "answer_audit_one_chain": _PGBENCH_ONE_CHAIN,
        }
        for kind, template in shapes.items():
            if kind != "answer_audit_one_chain":
                ops = [f"{kind}-{i}" for i in range(connections)]
                anyio.run(create_operations, url, ops, kind == "answer_audit")
            script = Path(tmp) / f"{kind}.sql"
            script.write_text(
                template.format(last=connections - 1, append=_pgbench_append(), payload=_PAYLOAD)
            )
            done = subprocess.run(
                [
                    pgbench,
                    "-n",
                    "-M",
                    "prepared",
                    "-c",
                    str(connections),
                    "-j",
                    "2",
                    "-T",
                    str(int(seconds)),
                    "-f",
                    str(script),
                    "-d",
                    url,
                ],
                capture_output=True,
                text=True,
                timeout=seconds + 60,
                check=True,
            )
            tps = re.search(r"tps = ([0-9.]+)", done.stdout)
            latency = re.search(r"latency average = ([0-9.]+) ms", done.stdout)
            found[kind] = {
                "per_second": None if tps is None else round(float(tps.group(1))),
                "latency_average_ms": None if latency is None else float(latency.group(1)),
            }
    return found


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
            for kind in ("reservation", "answer_audit", "answer_audit_locked")
        }
        verdict = verify_chain(DatabaseLocation.parse(url), None)
    with scratch_schema(args.url, "bench_ceiling") as url:
        bare = ceiling(url, connections=args.connections, seconds=args.seconds)
    summary = {
        "engine": "postgresql",
        "connections": args.connections,
        "processes": args.processes,
        "seconds": args.seconds,
        "reservation": phases["reservation"],
        "answer_audit": phases["answer_audit"],
        "answer_audit_locked": phases["answer_audit_locked"],
        "goals": {"reservation_per_second": 5000, "answer_audit_per_second": 3000},
        "ceiling_pgbench": bare,
        "of_ceiling": None
        if bare is None
        else {
            kind: round(phases[kind]["per_second"] / bare[kind]["per_second"], 2)
            for kind in ("reservation", "answer_audit")
            if bare[kind]["per_second"]
        },
        "audit_chain_ok": verdict.ok,
        "audit_rows": verdict.rows_checked,
        "machine": machine(processor=True),
    }
    dump_json(args.out, summary)
    for kind in ("reservation", "answer_audit", "answer_audit_locked"):
        p = phases[kind]
        line = f"{kind:19} {p['per_second']:>7,}/s  p50 {p['p50_ms']} ms  p95 {p['p95_ms']} ms"
        if bare is not None and kind in bare:
            line += f"   pgbench, same transaction: {bare[kind]['per_second']:,}/s"
        print(line)
    if bare is not None:
        print(
            f"pgbench, the answer with one chain for every row: {bare['answer_audit_one_chain']['per_second']:,}/s"
        )
    print(f"audit {'OK' if verdict.ok else 'BROKEN'}: {verdict.rows_checked} rows; JSON: {args.out}")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
