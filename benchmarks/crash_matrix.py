"""Crash injection: SIGKILL the server at each step of the check procedure, then recover.

    python -m benchmarks.crash_matrix                # 20 runs of each of the 4 steps
    python -m benchmarks.crash_matrix --runs 2       # a quick look

For each step ("after_reservation", "after_request_sent", "after_response",
"before_persist") a `pollwarden serve` stdio process runs with the test-only
hook POLLWARDEN_FAULT_STEP=<step>, which kills it with SIGKILL when the first
status check reaches that step. A server without the hook, on the same
database, then takes over. Each run checks, against the fake provider's own
log and the database file:

* the counter is at least the number of requests the provider saw (the
  reservation was durable before the request left);
* the record is consistent (valid status, no half-written row, SQLite
  integrity_check ok, `pollwarden audit verify` exits 0);
* the dead owner's lease blocks every check until it expires (nothing is sent
  meanwhile), and is recovered after;
* no request goes beyond the budget, and the operation ends stopped.

Prints a table per step and writes JSON to benchmarks/results/crash_matrix.json.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mcp.client import Client
from mcp.shared.exceptions import MCPError

if not __package__:  # run as `python benchmarks/crash_matrix.py`: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.live import (
    Database,
    FakeControl,
    audit_kinds,
    audit_verify,
    call,
    fake_provider_process,
    integrity_check,
    read_record,
    record_problems,
    run_and_report,
    stdio_server,
    wait_until_gone,
    write_provider_table,
)
from benchmarks.measure import RESULTS_DIR
from pollwarden.fake_provider import pending
from pollwarden.faults import FAULT_ENV, FAULT_STEPS

PROVIDER = "crash"
DEFAULT_OUT = RESULTS_DIR / "crash_matrix.json"
LEASE_ENV = "POLLWARDEN_LEASE_SECONDS"
# Requests the provider has received when the process dies at each step.
SENT_AT_CRASH = {"after_reservation": 0, "after_request_sent": 1, "after_response": 1, "before_persist": 1}
_HOOK_LINE = re.compile(r"fault hook: SIGKILL at (\w+) \(pid (\d+)\)")


@dataclass
class CrashRun:
    """What one crash-and-recover run showed."""

    step: str
    run: int
    operation_id: str
    budget: int
    lease_seconds: float
    killed_at: str | None = None
    process_gone: bool = False
    provider_requests_at_crash: int = 0
    used_at_crash: int = 0
    lease_held_at_crash: bool = False
    checks_refused_while_leased: int = 0
    requests_while_leased: int = 0
    # Seconds from the dead owner's lease expiry to the first check that was not refused.
    resumed_after_lease_expiry_seconds: float | None = None
    provider_requests_total: int = 0
    status_requests_used: int = 0
    final_status: str = ""
    stop_reason: str | None = None
    audit_ok: bool = False
    audit_kinds: list[str] = field(default_factory=list[str])
    integrity: str = ""
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list[str])


async def _drive_until_killed(client: Client, operation_id: str) -> bool:
    """Call check_status until the connection drops (the hook's SIGKILL); bounded."""
    for _ in range(20):
        try:
            view = await call(client, "check_status", operation_id=operation_id, wait_seconds=5)
        except MCPError:
            return True
        if view["status"] != "waiting":
            return False
    return False


async def crash_once(
    step: str,
    *,
    run: int,
    db: Database,
    tables: Path,
    fake: FakeControl,
    workdir: Path,
    recovery: Client | None = None,
    budget: int = 3,
    lease_seconds: float = 4.0,
    tag: str = "c",
    provider: str = PROVIDER,
) -> CrashRun:
    """Kill a server at `step` on its first status check, then recover with a server without the hook.

    `recovery` is a server already running on `db` (the matrix reuses one); without
    it a fresh one is started after the crash, which needs `lease_seconds` to be
    longer than a server's start-up.
    """
    started = time.monotonic()
    job_id = f"{tag}-{step}-{run:03d}"
    operation_id = f"op-{job_id}"
    result = CrashRun(
        step=step, run=run, operation_id=operation_id, budget=budget, lease_seconds=lease_seconds
    )
    v = result.violations
    await fake.script(job_id, [pending("running")])
    errlog = workdir / f"{job_id}.log"
    env = {FAULT_ENV: step, LEASE_ENV: str(lease_seconds)}
    async with stdio_server(db, tables, errlog=errlog, env=env) as doomed:
        await call(
            doomed,
            "start_operation",
            provider=provider,
            operation_id=operation_id,
            provider_job_id=job_id,
            max_status_requests=budget,
            deadline_seconds=300,
        )
        died = await _drive_until_killed(doomed, operation_id)
    match = _HOOK_LINE.search(errlog.read_text())
    if not died or match is None:
        v.append(f"the server did not die at {step} (connection dropped: {died})")
        return result
    result.killed_at = match.group(1)
    result.process_gone = await wait_until_gone(int(match.group(2)))
    if result.killed_at != step or not result.process_gone:
        v.append(f"killed at {result.killed_at}, process gone: {result.process_gone}")

    # -- the state the crash left ------------------------------------------------
    seen = len(await fake.status_requests(job_id))
    record = read_record(db, operation_id)
    v.extend(f"after the crash: {p}" for p in record_problems(record))
    assert record is not None
    result.provider_requests_at_crash = seen
    result.used_at_crash = int(record["status_requests_used"])
    result.lease_held_at_crash = record["lease_owner"] is not None
    lease_expires_at = float(record["lease_expires_at"] or 0.0)
    if seen != SENT_AT_CRASH[step]:
        v.append(f"the provider saw {seen} requests at the crash, expected {SENT_AT_CRASH[step]}")
    if result.used_at_crash < seen:
        v.append(f"counter {result.used_at_crash} below the {seen} requests the provider saw")
    if record["status"] != "waiting" or not result.lease_held_at_crash:
        v.append(f"expected a waiting record with the dead owner's lease, got {record['status']}")

    # -- recovery ------------------------------------------------------------------
    async with _recovery_server(recovery, db, tables, workdir / f"{job_id}-recovery.log") as server:
        # While the dead owner's lease runs, every check is refused and nothing is sent.
        while time.time() < lease_expires_at - 0.5 and result.checks_refused_while_leased < 3:
            view = await call(server, "check_status", operation_id=operation_id)
            if view["outcome"] != "not_yet":
                v.append(f"a check during the dead owner's lease answered {view['outcome']}")
                break
            result.checks_refused_while_leased += 1
        result.requests_while_leased = len(await fake.status_requests(job_id)) - seen
        if result.checks_refused_while_leased == 0:
            v.append("the recovery server started after the lease expired; raise the lease length")
        if result.requests_while_leased:
            v.append(f"{result.requests_while_leased} requests sent while the dead owner's lease ran")
        # Then the lease is recovered: checks resume (or the operation stops) and run to the budget.
        for _ in range(budget + 5):
            view = await call(
                server, "check_status", operation_id=operation_id, wait_seconds=lease_seconds + 10
            )
            if view["outcome"] != "not_yet" and result.resumed_after_lease_expiry_seconds is None:
                result.resumed_after_lease_expiry_seconds = round(time.time() - lease_expires_at, 3)
            if view["status"] != "waiting":
                break
        final = await call(server, "get_operation", operation_id=operation_id)

    entries = await fake.status_requests(job_id)
    record = read_record(db, operation_id)
    result.provider_requests_total = len(entries)
    result.status_requests_used = int(final["status_requests_used"])
    result.final_status = str(final["status"])
    result.stop_reason = final["stop_reason"]
    verify = audit_verify(db)
    result.audit_ok = verify.code == 0
    result.audit_kinds = audit_kinds(db, operation_id)
    result.integrity = integrity_check(db)
    result.seconds = round(time.monotonic() - started, 2)

    resumed = result.resumed_after_lease_expiry_seconds
    if resumed is None:
        v.append("the lease was never recovered: every check after the crash was refused")
    elif resumed < 0:
        v.append(f"checks resumed {-resumed:.3f} s before the dead owner's lease expired")
    if result.provider_requests_total > budget:
        v.append(f"{result.provider_requests_total} requests for a budget of {budget}")
    if result.status_requests_used < result.provider_requests_total:
        v.append(
            f"counter {result.status_requests_used} below {result.provider_requests_total} requests seen"
        )
    unused = result.status_requests_used - result.provider_requests_total
    if unused != (1 if step == "after_reservation" else 0):
        v.append(f"{unused} unused reservations (expected one only when killed after the reservation)")
    if result.final_status == "waiting":
        v.append("the operation never stopped")
    v.extend(f"after recovery: {p}" for p in record_problems(record))
    if record is not None and record["lease_owner"] is not None:
        v.append("a lease is still held after the operation stopped")
    if result.audit_kinds.count("lease_recovered") != 1:
        v.append(
            f"the audit tells the recovery {result.audit_kinds.count('lease_recovered')} times, not once"
        )
    if not result.audit_ok:
        v.append(f"audit verify: {verify.stdout.strip()} {verify.stderr.strip()}")
    if result.integrity != "ok":
        v.append(f"integrity_check: {result.integrity}")
    return result


def _recovery_server(
    running: Client | None, db: Database, tables: Path, errlog: Path
) -> AbstractAsyncContextManager[Client]:
    if running is not None:
        return _Borrowed(running)
    return stdio_server(db, tables, errlog=errlog)


class _Borrowed(AbstractAsyncContextManager[Client]):
    """An already-running client, used as a context without closing it."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def __aenter__(self) -> Client:
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        return None


async def run_matrix(
    *, runs: int, steps: Sequence[str], budget: int, lease_seconds: float, workdir: Path, time_limit: float
) -> dict[str, Any]:
    """Every step `runs` times; one database and one long-lived recovery server per step."""
    wall_start = time.monotonic()
    results: list[CrashRun] = []
    with fake_provider_process(workdir) as base_url:
        tables = workdir / "tables"
        write_provider_table(tables, PROVIDER, base_url)
        fake = FakeControl(base_url)
        try:
            for step in steps:
                db = workdir / f"{step}.db"
                async with stdio_server(db, tables, errlog=workdir / f"{step}-recovery.log") as recovery:
                    for run in range(runs):
                        if time.monotonic() - wall_start > time_limit:
                            break
                        results.append(
                            await crash_once(
                                step,
                                run=run,
                                db=db,
                                tables=tables,
                                fake=fake,
                                workdir=workdir,
                                recovery=recovery,
                                budget=budget,
                                lease_seconds=lease_seconds,
                            )
                        )
        finally:
            await fake.aclose()
    per_step: dict[str, dict[str, Any]] = {}
    for step in steps:
        mine = [r for r in results if r.step == step]
        per_step[step] = {
            "runs": len(mine),
            "killed_at_step": sum(r.killed_at == step for r in mine),
            "provider_requests_at_crash": sorted({r.provider_requests_at_crash for r in mine}),
            "counter_at_crash": sorted({r.used_at_crash for r in mine}),
            "checks_refused_while_leased": sum(r.checks_refused_while_leased for r in mine),
            "requests_while_leased": sum(r.requests_while_leased for r in mine),
            "lease_recovered": sum(r.resumed_after_lease_expiry_seconds is not None for r in mine),
            "max_requests_per_run": max((r.provider_requests_total for r in mine), default=0),
            "unused_reservations": sum(r.status_requests_used - r.provider_requests_total for r in mine),
            "stop_reasons": sorted({str(r.stop_reason) for r in mine}),
            "audit_ok": sum(r.audit_ok for r in mine),
            "recovery_audited": sum(r.audit_kinds.count("lease_recovered") == 1 for r in mine),
            "violations": sum(len(r.violations) for r in mine),
        }
    violations = [f"{r.step} run {r.run}: {text}" for r in results for text in r.violations]
    if len(results) < runs * len(steps):
        violations.append(f"time limit reached after {len(results)} of {runs * len(steps)} runs")
    return {
        "runs_per_step": runs,
        "budget": budget,
        "lease_seconds": lease_seconds,
        "total_runs": len(results),
        "per_step": per_step,
        "violations": violations,
        "wall_seconds": round(time.monotonic() - wall_start, 2),
        "results": [asdict(r) for r in results],
    }


def print_table(summary: dict[str, Any]) -> None:
    """One row per step."""
    header = (
        f"{'step':<19} {'runs':>4} {'killed':>6} {'seen@crash':>10} {'counter@crash':>13} "
        f"{'refused':>7} {'sent-in-lease':>13} {'recovered':>9} {'max req':>7} {'unused':>6} "
        f"{'audit ok':>8} {'audited':>7} {'violations':>10}"
    )
    print(header)
    print("-" * len(header))
    for step, s in summary["per_step"].items():
        print(
            f"{step:<19} {s['runs']:>4} {s['killed_at_step']:>6} {_set(s['provider_requests_at_crash']):>10} "
            f"{_set(s['counter_at_crash']):>13} {s['checks_refused_while_leased']:>7} "
            f"{s['requests_while_leased']:>13} {s['lease_recovered']:>9} {s['max_requests_per_run']:>7} "
            f"{s['unused_reservations']:>6} {s['audit_ok']:>8} {s['recovery_audited']:>7} {s['violations']:>10}"
        )
    print(
        "seen@crash: requests the provider had received when the process died; refused: checks refused "
        "while the dead owner's lease ran; audited: runs whose audit tells the recovery once"
    )
    print(
        f"budget {summary['budget']} per operation, lease {summary['lease_seconds']:g} s, "
        f"{summary['total_runs']} runs in {summary['wall_seconds']} s"
    )
    for text in summary["violations"][:20]:
        print(f"VIOLATION {text}")


def _set(values: list[int]) -> str:
    return ",".join(str(v) for v in values) or "-"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the matrix and exit 1 on any violation."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.crash_matrix", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=20, help="runs per step (default 20)")
    parser.add_argument("--steps", nargs="*", default=list(FAULT_STEPS), choices=FAULT_STEPS)
    parser.add_argument("--budget", type=int, default=3, help="status requests per operation (default 3)")
    parser.add_argument("--lease-seconds", type=float, default=1.5, help="lease length (default 1.5)")
    parser.add_argument("--time-limit", type=float, default=1800.0, help="stop starting runs after this (s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output file")
    args = parser.parse_args(argv)
    if not (1 <= args.runs <= 500 and 2 <= args.budget <= 50 and 0.5 <= args.lease_seconds <= 60):
        parser.error("bounds: 1 <= runs <= 500, 2 <= budget <= 50, 0.5 <= lease-seconds <= 60")
    return run_and_report(
        lambda workdir: run_matrix(
            runs=args.runs,
            steps=args.steps,
            budget=args.budget,
            lease_seconds=args.lease_seconds,
            workdir=workdir,
            time_limit=args.time_limit,
        ),
        workdir_prefix="pollwarden-crash-",
        out=args.out,
        print_table=print_table,
    )


if __name__ == "__main__":
    raise SystemExit(main())
