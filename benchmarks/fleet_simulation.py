"""Fleet simulation on virtual time: what each polling strategy costs a provider.

    python benchmarks/fleet_simulation.py            # seeded, deterministic, a few seconds

1,000 operations start within one second; each job finishes after a log-normal
time (median 10 minutes, sigma 0.8). Every strategy polls each job until the
first status request at or after the job finished (no deadline, no budget),
using pollwarden's own schedule code (`schedule.raw_delay`, `plan_next_check`,
`first_check_at`, `pace`) on the example table's schedule (base 5 s, max 120 s):

- fixed 10 s polling
- exponential backoff without jitter: min(max, base·2**attempt)
- full jitter: uniform(0, raw)
- pollwarden: floored jitter, uniform(0.5·raw, raw)
- pollwarden + fleet pacing: the same, every request through one shared GCRA
  bucket (rate and burst below); a request over the pace waits for its booked
  slot, as `check_status` with wait_seconds does.

Then webhooks as wake-up hints (issue 21), on the same jobs: each job's
provider sends one webhook after it finished, delivered after a log-normal
delay (median 1.5 s, sigma 0.8) or lost (0 %, 30 %, 100 %). A delivered webhook
brings the next check forward to its arrival plus the time a waiting agent
takes to notice (uniform 0..0.5 s: it re-reads its operation every 0.5 s);
the confirming request then sees the job finished. Measured for pollwarden's
default schedule (unchanged by webhooks) and for a table that relies on
webhooks and polls sparsely as a safety net (base 300 s, max 1800 s).

Prints the tables and writes benchmarks/results/fleet_simulation.json; with
matplotlib installed (`pip install -e '.[bench]'`) also a plot of requests per
second over time, benchmarks/results/fleet_simulation.png, and of detection
latency with and without webhooks, benchmarks/results/fleet_webhooks.png.
"""

from __future__ import annotations

import argparse
import heapq
import math
import platform
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

if not __package__:  # run as `python benchmarks/fleet_simulation.py`: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import RESULTS_DIR, dump_json, percentile
from pollwarden.rules.schedule import first_check_at, pace, plan_next_check, raw_delay

JOBS = 1_000
START_SPREAD_SECONDS = 1.0
MEDIAN_SECONDS = 600.0
SIGMA = 0.8
BASE_DELAY = 5.0  # the example table's schedule
MAX_DELAY = 120.0
FIXED_INTERVAL = 10.0
FLEET_RATE = 10.0  # requests per second, shared by the whole fleet
FLEET_BURST = 10
FIRST_MINUTES_SECONDS = 600.0
SEED = 20250418
# Webhooks: delivery delay after the job finished (log-normal), the waiting agent's re-read
# interval (controller.WAKE_RECHECK_SECONDS), the shares lost, and a safety-net schedule.
WEBHOOK_DELAY_MEDIAN_SECONDS = 1.5
WEBHOOK_DELAY_SIGMA = 0.8
WAKE_RECHECK_SECONDS = 0.5
WEBHOOK_LOSS = (0.0, 0.3, 1.0)
SAFETY_NET_BASE = 300.0
SAFETY_NET_MAX = 1800.0


@dataclass(frozen=True)
class Job:
    """One operation: when it started and when the provider finished it."""

    start: float
    done: float


@dataclass
class Outcome:
    """Every status request a strategy sent, and when it saw each job finished."""

    requests: list[float]
    detected: list[float]
    per_job: list[int]


@dataclass(frozen=True)
class Summary:
    """One row of the result table."""

    strategy: str
    requests_total: int
    peak_per_second: int
    mean_per_second_first_10_min: float
    peak_over_mean_first_10_min: float
    requests_per_job_mean: float
    requests_per_job_p95: float
    detection_latency_p50_seconds: float
    detection_latency_p95_seconds: float
    detection_latency_max_seconds: float


def make_jobs(rng: random.Random) -> list[Job]:
    """1,000 starts within one second; log-normal run times with the given median and sigma."""
    jobs: list[Job] = []
    for _ in range(JOBS):
        start = rng.uniform(0.0, START_SPREAD_SECONDS)
        jobs.append(Job(start, start + rng.lognormvariate(math.log(MEDIAN_SECONDS), SIGMA)))
    return jobs


# A strategy's schedule for one job: given (now, completed polls) return the next poll time.
NextPoll = Callable[[float, int], float]


def poll_until_done(jobs: Sequence[Job], first: Callable[[Job], float], after: NextPoll) -> Outcome:
    """Independent polling (no shared pace): each job polls on its own schedule until it sees done."""
    requests: list[float] = []
    detected: list[float] = []
    per_job: list[int] = []
    for job in jobs:
        t = first(job)
        polls = 0
        while True:
            requests.append(t)
            polls += 1
            if t >= job.done:
                break
            t = after(t, polls)
        detected.append(t - job.done)
        per_job.append(polls)
    return Outcome(requests, detected, per_job)


def fixed(jobs: Sequence[Job], _rng: random.Random) -> Outcome:
    """Poll every 10 s from the start."""
    return poll_until_done(jobs, lambda j: j.start + FIXED_INTERVAL, lambda t, _n: t + FIXED_INTERVAL)


def exponential(jobs: Sequence[Job], _rng: random.Random) -> Outcome:
    """min(max, base·2**attempt), no jitter: the 5, 10, 20, 40 … sequence."""
    return poll_until_done(
        jobs,
        lambda j: j.start + raw_delay(0, BASE_DELAY, MAX_DELAY),
        lambda t, n: t + raw_delay(n, BASE_DELAY, MAX_DELAY),
    )


def full_jitter(jobs: Sequence[Job], rng: random.Random) -> Outcome:
    """uniform(0, raw): spread out, but sometimes almost no wait at all."""
    return poll_until_done(
        jobs,
        lambda j: j.start + rng.uniform(0.0, raw_delay(0, BASE_DELAY, MAX_DELAY)),
        lambda t, n: t + rng.uniform(0.0, raw_delay(n, BASE_DELAY, MAX_DELAY)),
    )


def pollwarden(jobs: Sequence[Job], rng: random.Random) -> Outcome:
    """pollwarden's schedule: first check after the attempt-0 delay, then plan_next_check."""
    return poll_until_done(
        jobs,
        lambda j: first_check_at(j.start, BASE_DELAY, MAX_DELAY, rng),
        lambda t, n: plan_next_check(now=t, attempt=n, base=BASE_DELAY, maximum=MAX_DELAY, rng=rng).at,
    )


def pollwarden_paced(jobs: Sequence[Job], rng: random.Random) -> Outcome:
    """pollwarden's schedule, every request through one shared bucket (as the store takes it).

    Events run in time order. A job whose check is allowed asks the bucket: it
    is admitted, or booked the next free slot and polls exactly then (a caller
    waiting with wait_seconds) without pacing again.
    """
    requests: list[float] = []
    detected = [0.0] * len(jobs)
    per_job = [0] * len(jobs)
    # (time, sequence, job index, holds a booked slot)
    events: list[tuple[float, int, int, bool]] = []
    seq = 0
    for i, job in enumerate(jobs):
        heapq.heappush(events, (first_check_at(job.start, BASE_DELAY, MAX_DELAY, rng), seq, i, False))
        seq += 1
    tat: float | None = None
    while events:
        t, _, i, held = heapq.heappop(events)
        if not held:
            step = pace(tat, now=t, rate=FLEET_RATE, burst=FLEET_BURST)
            tat = step.next_tat
            if not step.admitted:
                heapq.heappush(events, (step.slot_at, seq, i, True))
                seq += 1
                continue
        requests.append(t)
        per_job[i] += 1
        job = jobs[i]
        if t >= job.done:
            detected[i] = t - job.done
            continue
        plan = plan_next_check(now=t, attempt=per_job[i], base=BASE_DELAY, maximum=MAX_DELAY, rng=rng)
        heapq.heappush(events, (plan.at, seq, i, False))
        seq += 1
    return Outcome(requests, detected, per_job)


STRATEGIES: dict[str, Callable[[Sequence[Job], random.Random], Outcome]] = {
    "fixed 10 s": fixed,
    "exponential, no jitter": exponential,
    "full jitter": full_jitter,
    "pollwarden": pollwarden,
    f"pollwarden + fleet {FLEET_RATE:g}/s burst {FLEET_BURST}": pollwarden_paced,
}


def peak_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most requests inside any window [t, t + window)."""
    ordered = sorted(times)
    best = 0
    lo = 0
    for hi, t in enumerate(ordered):
        while t - ordered[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def summarise(name: str, outcome: Outcome) -> Summary:
    """The table row for one strategy."""
    early = [t for t in outcome.requests if t < FIRST_MINUTES_SECONDS]
    peak_early = peak_in_window(early)
    mean_early = len(early) / FIRST_MINUTES_SECONDS
    return Summary(
        strategy=name,
        requests_total=len(outcome.requests),
        peak_per_second=peak_in_window(outcome.requests),
        mean_per_second_first_10_min=round(mean_early, 2),
        peak_over_mean_first_10_min=round(peak_early / mean_early, 1) if mean_early else float("nan"),
        requests_per_job_mean=round(sum(outcome.per_job) / len(outcome.per_job), 2),
        requests_per_job_p95=percentile(outcome.per_job, 95),
        detection_latency_p50_seconds=round(percentile(outcome.detected, 50), 1),
        detection_latency_p95_seconds=round(percentile(outcome.detected, 95), 1),
        detection_latency_max_seconds=round(max(outcome.detected), 1),
    )


def per_second(times: Sequence[float], horizon: int) -> list[int]:
    """Requests in each one-second bin [k, k+1) up to `horizon` seconds."""
    bins = [0] * horizon
    for t in times:
        k = int(t)
        if 0 <= k < horizon:
            bins[k] += 1
    return bins


def plot(outcomes: dict[str, Outcome], path: Path, horizon: int) -> bool:
    """Requests per second over time, one panel per strategy; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(outcomes)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 6), dpi=100, sharex=True, sharey=True)
    for ax, name in zip(axes, names, strict=True):
        bins = per_second(outcomes[name].requests, horizon)
        ax.fill_between(range(horizon), bins, step="post", linewidth=0.6, color="#1f5fa8")
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylim(0, 1500)
        ax.set_yticks([0, 10, 100, 1000])
        ax.set_yticklabels(["0", "10", "100", "1000"], fontsize=7)
        ax.text(0.995, 0.85, name, transform=ax.transAxes, ha="right", va="top", fontsize=8)
        ax.grid(axis="y", linewidth=0.3)
    axes[-1].set_xlabel("seconds after the first start (1 s bins)")
    axes[len(names) // 2].set_ylabel("status requests per second")
    fig.suptitle(  # pyright: ignore[reportUnknownMemberType]
        f"{JOBS} jobs started within 1 s, run time log-normal (median {MEDIAN_SECONDS / 60:g} min, sigma {SIGMA})",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=100, metadata={"Software": None})  # pyright: ignore[reportUnknownMemberType]
    plt.close(fig)
    return True


def render(rows: Sequence[Summary]) -> str:
    """The result table as fixed-width text."""
    header = (
        f"{'strategy':<34} {'requests':>8} {'peak/s':>7} {'mean/s*':>8} {'peak/mean*':>10} "
        f"{'req/job':>8} {'p95':>4} {'detect p50':>10} {'p95':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.strategy:<34} {r.requests_total:>8} {r.peak_per_second:>7} "
            f"{r.mean_per_second_first_10_min:>8.2f} {r.peak_over_mean_first_10_min:>10.1f} "
            f"{r.requests_per_job_mean:>8.2f} {r.requests_per_job_p95:>4.0f} "
            f"{r.detection_latency_p50_seconds:>9.1f}s {r.detection_latency_p95_seconds:>6.1f}s"
        )
    lines.append("* over the first 10 minutes; peak/s is the busiest one-second window of the whole run")
    return "\n".join(lines)


# -- webhooks as wake-up hints ------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookSummary:
    """One row of the webhook table: a schedule, a share of webhooks lost, what it cost and saw."""

    schedule: str
    webhooks_lost_percent: int
    requests_per_job_mean: float
    requests_per_job_beyond_first: float
    detection_after_done_p50_seconds: float
    detection_after_done_p95_seconds: float
    woken_jobs: int
    detection_after_webhook_p50_seconds: float
    detection_after_webhook_p95_seconds: float


def webhook_arrivals(jobs: Sequence[Job], lost: float, rng: random.Random) -> list[float | None]:
    """When each job's webhook arrives (None: lost)."""
    arrivals: list[float | None] = []
    for job in jobs:
        delay = rng.lognormvariate(math.log(WEBHOOK_DELAY_MEDIAN_SECONDS), WEBHOOK_DELAY_SIGMA)
        arrivals.append(None if rng.random() < lost else job.done + delay)
    return arrivals


def poll_with_webhooks(
    jobs: Sequence[Job], arrivals: Sequence[float | None], base: float, maximum: float, rng: random.Random
) -> tuple[Outcome, list[float]]:
    """pollwarden's schedule, with each delivered webhook bringing the next planned check forward.

    The wake applies only while the next check is still in the future (the
    store's guard); the waiting agent notices it within one re-read interval.
    Returns the outcome and, for each job a webhook woke, the detection time
    after the webhook arrived.
    """
    requests: list[float] = []
    detected: list[float] = []
    per_job: list[int] = []
    after_webhook: list[float] = []
    for job, arrival in zip(jobs, arrivals, strict=True):
        t = first_check_at(job.start, base, maximum, rng)
        polls = 0
        woken = False
        while True:
            if arrival is not None and not woken and arrival < t:
                woken = True
                t = max(arrival + rng.uniform(0.0, WAKE_RECHECK_SECONDS), arrival)
            requests.append(t)
            polls += 1
            if t >= job.done:
                break
            t = plan_next_check(now=t, attempt=polls, base=base, maximum=maximum, rng=rng).at
        detected.append(t - job.done)
        per_job.append(polls)
        if woken and arrival is not None:
            after_webhook.append(t - arrival)
    return Outcome(requests, detected, per_job), after_webhook


WEBHOOK_SCHEDULES: dict[str, tuple[float, float]] = {
    f"default (base {BASE_DELAY:g} s, max {MAX_DELAY:g} s)": (BASE_DELAY, MAX_DELAY),
    f"safety net (base {SAFETY_NET_BASE:g} s, max {SAFETY_NET_MAX:g} s)": (SAFETY_NET_BASE, SAFETY_NET_MAX),
}


def run_webhooks(jobs: Sequence[Job], seed: int) -> tuple[list[WebhookSummary], dict[str, list[float]]]:
    """Every schedule alone and with 0/30/100 % of webhooks lost; rows and detection latencies."""
    rows: list[WebhookSummary] = []
    latencies: dict[str, list[float]] = {}
    for s, (schedule, (base, maximum)) in enumerate(WEBHOOK_SCHEDULES.items()):
        cases: list[tuple[str, float | None]] = [("polling alone", None)]
        cases += [(f"{lost:.0%} lost", lost) for lost in WEBHOOK_LOSS]
        for label, lost in cases:
            # One random stream per schedule: with every webhook lost, the run is polling alone, exactly.
            rng = random.Random(seed * 1000 + s)
            # The same webhook delays for every loss share (only which are lost differs).
            arrivals = webhook_arrivals(jobs, 1.0 if lost is None else lost, random.Random(seed + 7))
            outcome, after = poll_with_webhooks(jobs, arrivals, base, maximum, rng)
            beyond = sum(n - 1 for n in outcome.per_job) / len(outcome.per_job)
            rows.append(
                WebhookSummary(
                    schedule=schedule,
                    webhooks_lost_percent=-1 if lost is None else round(lost * 100),
                    requests_per_job_mean=round(sum(outcome.per_job) / len(outcome.per_job), 2),
                    requests_per_job_beyond_first=round(beyond, 2),
                    detection_after_done_p50_seconds=round(percentile(outcome.detected, 50), 1),
                    detection_after_done_p95_seconds=round(percentile(outcome.detected, 95), 1),
                    woken_jobs=len(after),
                    detection_after_webhook_p50_seconds=round(percentile(after, 50), 2)
                    if after
                    else float("nan"),
                    detection_after_webhook_p95_seconds=round(percentile(after, 95), 2)
                    if after
                    else float("nan"),
                )
            )
            latencies[f"{schedule}, {label}"] = outcome.detected
    return rows, latencies


def render_webhooks(rows: Sequence[WebhookSummary]) -> str:
    """The webhook table as fixed-width text."""
    header = (
        f"{'schedule':<34} {'webhooks':>13} {'req/job':>8} {'beyond 1st':>10} "
        f"{'detect p50':>10} {'p95':>7} {'woken':>6} {'after webhook p50':>17} {'p95':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        label = "polling alone" if r.webhooks_lost_percent < 0 else f"{r.webhooks_lost_percent}% lost"
        p50, p95 = r.detection_after_webhook_p50_seconds, r.detection_after_webhook_p95_seconds
        after_p50 = "-" if math.isnan(p50) else f"{p50:.2f}s"
        after_p95 = "-" if math.isnan(p95) else f"{p95:.2f}s"
        lines.append(
            f"{r.schedule:<34} {label:>13} {r.requests_per_job_mean:>8.2f} {r.requests_per_job_beyond_first:>10.2f} "
            f"{r.detection_after_done_p50_seconds:>9.1f}s {r.detection_after_done_p95_seconds:>6.1f}s "
            f"{r.woken_jobs:>6} {after_p50:>17} {after_p95:>6}"
        )
    lines.append("detection is measured from the job finishing; 'after webhook' from the webhook's arrival")
    return "\n".join(lines)


def plot_webhooks(latencies: dict[str, list[float]], path: Path) -> bool:
    """Detection latency (CDF) per schedule and loss share; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(WEBHOOK_SCHEDULES), figsize=(10, 3.6), dpi=100, sharey=True)
    for ax, schedule in zip(axes, WEBHOOK_SCHEDULES, strict=True):
        for name, values in latencies.items():
            if not name.startswith(schedule + ","):
                continue
            ordered = sorted(values)
            ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
            ax.step(ordered, ys, where="post", linewidth=1.0, label=name.split(", ")[-1])
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("detection latency after the job finished (s)")
        ax.set_title(schedule, fontsize=8)
        ax.grid(linewidth=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("share of jobs")
    fig.suptitle(  # pyright: ignore[reportUnknownMemberType]
        f"{JOBS} jobs; webhooks delivered after a log-normal delay (median {WEBHOOK_DELAY_MEDIAN_SECONDS:g} s) or lost",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=100, metadata={"Software": None})  # pyright: ignore[reportUnknownMemberType]
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run every strategy on the same jobs, print the table, write JSON (and the plot)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG even if matplotlib is installed")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    jobs = make_jobs(random.Random(args.seed))
    outcomes: dict[str, Outcome] = {}
    for n, (name, strategy) in enumerate(STRATEGIES.items()):
        outcomes[name] = strategy(jobs, random.Random(args.seed * 100 + n))
    rows = [summarise(name, outcome) for name, outcome in outcomes.items()]

    print(
        f"{JOBS} jobs started within {START_SPREAD_SECONDS:g} s; run time log-normal, median "
        f"{MEDIAN_SECONDS:g} s, sigma {SIGMA}; schedule base {BASE_DELAY:g} s, max {MAX_DELAY:g} s; "
        f"seed {args.seed}"
    )
    print(render(rows))
    webhook_rows, latencies = run_webhooks(jobs, args.seed)
    print()
    print(render_webhooks(webhook_rows))
    durations = sorted(j.done - j.start for j in jobs)
    result = {
        "benchmark": "fleet_simulation",
        "parameters": {
            "jobs": JOBS,
            "start_spread_seconds": START_SPREAD_SECONDS,
            "run_time": {"distribution": "log-normal", "median_seconds": MEDIAN_SECONDS, "sigma": SIGMA},
            "run_time_p05_p50_p95_seconds": [
                round(percentile(durations, 5), 1),
                round(percentile(durations, 50), 1),
                round(percentile(durations, 95), 1),
            ],
            "schedule": {"base_delay_seconds": BASE_DELAY, "max_delay_seconds": MAX_DELAY},
            "fixed_interval_seconds": FIXED_INTERVAL,
            "fleet": {"max_requests_per_second": FLEET_RATE, "burst": FLEET_BURST},
            "seed": args.seed,
            "budgets": "none: every strategy polls until it sees the job finished",
        },
        "python": platform.python_version(),
        "rows": [asdict(r) for r in rows],
        "webhooks": {
            "delivery_delay": {
                "distribution": "log-normal",
                "median_seconds": WEBHOOK_DELAY_MEDIAN_SECONDS,
                "sigma": WEBHOOK_DELAY_SIGMA,
            },
            "wake_recheck_seconds": WAKE_RECHECK_SECONDS,
            "webhooks_lost_percent_-1_means": "polling alone (no webhooks)",
            "rows": [asdict(r) for r in webhook_rows],
        },
    }
    json_path = out / "fleet_simulation.json"
    dump_json(json_path, result, sort_keys=False)
    print(f"wrote {json_path}")
    if args.no_plot:
        return 0
    horizon = int(min(3600.0, max(max(o.requests) for o in outcomes.values()) + 1))
    png = out / "fleet_simulation.png"
    if plot(outcomes, png, horizon):
        print(f"wrote {png}")
        webhooks_png = out / "fleet_webhooks.png"
        plot_webhooks(latencies, webhooks_png)
        print(f"wrote {webhooks_png}")
    else:
        print("matplotlib is not installed: no plot (pip install -e '.[bench]')", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
