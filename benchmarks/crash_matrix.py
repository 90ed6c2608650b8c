"""Crash injection: SIGKILL the server at each step of the check procedure, then recover.

    python -m benchmarks.crash_matrix                # 20 runs of each of the 4 steps
    python -m benchmarks.crash_matrix --runs 2       # a quick look

For each step ("after_reservation", "after_request_sent", "after_response",
"before_persist") a `pollwarden serve` stdio process runs with a step hook
(tests/support/serve_with_faults.py) that kills it with SIGKILL when the first
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
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/crash_matrix.py`: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.crash import PROVIDER, CrashRun, crash_once
from tests.support.live import FakeControl, fake_provider_process, stdio_server, write_provider_table

from benchmarks.measure import RESULTS_DIR, run_and_report
from pollwarden.flows.check_hooks import CHECK_BOUNDARIES

DEFAULT_OUT = RESULTS_DIR / "crash_matrix.json"


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
    parser.add_argument("--steps", nargs="*", default=list(CHECK_BOUNDARIES), choices=CHECK_BOUNDARIES)
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
