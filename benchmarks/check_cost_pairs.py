"""`check_cost.py` on an earlier commit and on this tree, run in turns: did a change lose time?

    git worktree add /tmp/before 6f94d55
    python benchmarks/check_cost_pairs.py --before /tmp/before             # 5 pairs per engine
    python benchmarks/check_cost_pairs.py --before /tmp/before --engine sqlite --pairs 3

Each pair runs the earlier commit's own `check_cost.py` (in its worktree, this venv) and then this
tree's, minutes apart at most, so a machine that speeds up or slows down moves both. A ratio to the
floor alone can mislead across commits: the floor's no-op tool call is part of the code measured (a
smaller output schema makes it cheaper), so the milliseconds of each call are reported beside the
ratios, with the mean of each over the pairs.

Writes benchmarks/results/check_cost_pairs.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/check_cost_pairs.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import DEFAULT_PG_URL, RESULTS_DIR, dump_json, machine

HERE = Path(__file__).resolve().parents[1]
ROWS = ("check_status_polled", "check_status_not_yet", "mcp_noop_tool_call", "bare_httpx2_get")


def run_once(tree: Path, engine: str, samples: int, pg_url: str, out: Path) -> dict[str, Any]:
    """One `check_cost.py` run of the code in `tree`; its JSON result."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(tree / p) for p in ("server", "providers", "."))
    command = [sys.executable, "benchmarks/check_cost.py", "--samples", str(samples), "--fsync-calls", "0"]
    command += ["--engine", engine, "--out", str(out)]
    if engine == "postgres":
        command += ["--pg-url", pg_url]
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, timeout=900)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def summary(run: dict[str, Any]) -> dict[str, float]:
    """The medians (ms) and the two ratios of one run."""
    row = {name: run["rows"][name]["median_ms"] for name in ROWS}
    row["polled_over_floor"] = run["ratios"]["polled_over_floor_median"]
    row["not_yet_over_floor"] = run["ratios"]["not_yet_over_floor_median"]
    return row


def main(argv: list[str] | None = None) -> int:
    """Run the pairs, print the means, write the JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="a worktree of the earlier commit")
    parser.add_argument("--engine", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "check_cost_pairs.json")
    args = parser.parse_args(argv)
    if not (args.before / "benchmarks" / "check_cost.py").is_file():
        parser.error(
            f"--before {args.before}: no benchmarks/check_cost.py there; give a worktree of the commit"
        )
    if not 1 <= args.pairs <= 20:
        parser.error("--pairs must be 1 to 20")
    before_commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=args.before, capture_output=True, text=True, check=True
    ).stdout.strip()
    engines = ("sqlite", "postgres") if args.engine == "both" else (args.engine,)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {e: {"before": [], "now": []} for e in engines}
    with tempfile.TemporaryDirectory(prefix="pollwarden-pairs-") as tmp:
        for pair in range(args.pairs):
            for engine in engines:
                for side, tree in (("before", args.before), ("now", HERE)):
                    out = Path(tmp) / f"{side}_{engine}_{pair}.json"
                    runs[engine][side].append(summary(run_once(tree, engine, args.samples, args.pg_url, out)))
    means = {
        engine: {
            side: {k: round(statistics.fmean(r[k] for r in rows), 3) for k in rows[0]}
            for side, rows in sides.items()
        }
        for engine, sides in runs.items()
    }
    dump_json(
        args.out,
        {
            "benchmark": "check_cost_pairs",
            "before": before_commit,
            "pairs": args.pairs,
            "samples": args.samples,
            "machine": machine(),
            "runs": runs,
            "means": means,
        },
        sort_keys=False,
    )
    for engine, sides in means.items():
        for side, row in sides.items():
            print(f"{engine:8} {side:6} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
