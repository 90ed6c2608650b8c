"""The 8-process race: many `pollwarden serve` processes hammer one operation on one database.

    python -m benchmarks.stress_race                 # 200 trials, 8 processes (a few minutes)
    python -m benchmarks.stress_race --trials 3      # the CI size

The race itself is tests/support/race.py (shared with tests/integration/test_race.py). The
processes are reused across trials (start-up is the slow part). Prints a table
and writes JSON to benchmarks/results/stress_race.json.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/stress_race.py`: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.race import run_stress

from benchmarks.measure import RESULTS_DIR, run_and_report

DEFAULT_OUT = RESULTS_DIR / "stress_race.json"


def print_table(summary: dict[str, Any]) -> None:
    """The human summary."""
    rows = [
        ("trials", f"{summary['trials']} (of {summary['trials_requested']})"),
        ("server processes", summary["processes"]),
        ("budget per operation", summary["budget"]),
        ("check_status calls", summary["total_check_status_calls"]),
        ("status requests (provider log)", summary["total_requests"]),
        ("max requests in one trial", summary["max_requests_per_trial"]),
        ("max in flight at once", summary["max_in_flight"]),
        ("overlapping requests", summary["overlapping_requests"]),
        ("stop reasons", ", ".join(f"{k} {v}" for k, v in sorted(summary["stop_reasons"].items()))),
        ("audit chain", summary["audit_verify"]),
        ("violations", len(summary["violations"])),
        ("start-up (s)", summary["startup_seconds"]),
        ("wall time (s)", summary["wall_seconds"]),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for text in summary["violations"][:20]:
        print(f"VIOLATION {text}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stress and exit 1 on any violation."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stress_race", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--trials", type=int, default=200, help="operations to race on (default 200)")
    parser.add_argument("--processes", type=int, default=8, help="pollwarden serve processes (default 8)")
    parser.add_argument("--budget", type=int, default=5, help="status requests per operation (default 5)")
    parser.add_argument(
        "--time-limit", type=float, default=1800.0, help="stop starting trials after this (s)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output file")
    args = parser.parse_args(argv)
    if not (1 <= args.trials <= 10_000 and 2 <= args.processes <= 32 and 1 <= args.budget <= 200):
        parser.error("bounds: 1 <= trials <= 10000, 2 <= processes <= 32, 1 <= budget <= 200")
    return run_and_report(
        lambda workdir: run_stress(
            trials=args.trials,
            processes=args.processes,
            budget=args.budget,
            time_limit=args.time_limit,
            workdir=workdir,
        ),
        workdir_prefix="pollwarden-race-",
        out=args.out,
        print_table=print_table,
    )


if __name__ == "__main__":
    raise SystemExit(main())
