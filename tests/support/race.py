"""The many-process race: `pollwarden serve` processes hammer one operation on one database.

Starts the fake provider as a subprocess on 127.0.0.1 and N real `pollwarden
serve` stdio processes sharing one SQLite file. Each trial creates a fresh
operation with a small budget; every process then calls `check_status` on it
as fast as it can until the operation stops (half of them with wait_seconds,
so the server itself sleeps to the allowed time and races from there). The fake
provider's own request log is the evidence: per trial, the status requests it
received never exceed the budget, two of them are never in flight at once, and
each one is a `polled` answer some process returned (no invisible request).

Used by tests/integration/test_race.py (CI size) and `python -m benchmarks.stress_race` (the full run).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp.client import Client

from tests.support.fake_provider import Step, http, pending, succeeded
from tests.support.live import (
    Database,
    FakeControl,
    Rigging,
    audit_verify,
    call,
    fake_provider_process,
    integrity_check,
    max_in_flight,
    overlapping_pairs,
    read_record,
    record_problems,
    stdio_server,
    write_provider_table,
)

PROVIDER = "race"
# Bounds: one trial, and the calls one process may make in one trial.
TRIAL_TIMEOUT_SECONDS = 60.0
MAX_CALLS_PER_PROCESS = 20_000
# The odd-numbered processes pass this wait_seconds (the server sleeps to the allowed time, then races).
WAIT_SECONDS = 1.0
START_TIMEOUT_SECONDS = 120.0
# How long a server waits for another process's lock on the database (the default is 5 s).
BUSY_TIMEOUT_SECONDS = 30.0


def scenario(trial: int) -> tuple[str, list[Step]]:
    """The provider's behaviour in this trial (rotating, so the race meets different answers)."""
    kind = ("never_finishes", "succeeds_on_third", "slow_answers", "flaky_503")[trial % 4]
    if kind == "never_finishes":
        return kind, [pending("running")]
    if kind == "succeeds_on_third":
        return kind, [pending("queued"), pending("running"), succeeded()]
    if kind == "slow_answers":
        # Each answer takes 20 ms: a long window for a second request to slip in.
        return kind, [pending("running").replace(delay_seconds=0.02)]
    return kind, [http(503), pending("running"), http(503), pending("running")]


@dataclass
class TrialResult:
    """What one trial showed."""

    trial: int
    scenario: str
    operation_id: str
    budget: int
    provider_requests: int
    max_in_flight: int
    overlapping: int
    polled_answers: int
    calls: int
    status_requests_used: int
    final_status: str
    stop_reason: str | None
    seconds: float
    violations: list[str] = field(default_factory=list[str])


@dataclass
class Fleet:
    """The server processes and their clients, started once and reused by every trial."""

    clients: list[Client]
    db: Database


async def _start_fleet(
    stack: AsyncExitStack, processes: int, db: Database, tables: Path, workdir: Path
) -> list[Client]:
    """Start the processes concurrently; each client is entered and left by its own task."""
    clients: list[Client | None] = [None] * processes
    ready = anyio.Event()
    stop = anyio.Event()
    started = 0
    tg = await stack.enter_async_context(anyio.create_task_group())

    async def hold(index: int) -> None:
        nonlocal started
        # Eight processes opening one SQLite file at once queue for its write lock; with other tests'
        # processes on the same cores (xdist), the last one waited past the default 5 s once in CI.
        # The race is about budgets, not how fast a server starts: a longer wait, not a failure.
        rigging = Rigging(busy_timeout_seconds=BUSY_TIMEOUT_SECONDS)
        log = workdir / f"server-{index}.log"
        async with stdio_server(db, tables, errlog=log, rigging=rigging) as client:
            clients[index] = client
            started += 1
            if started == processes:
                ready.set()
            await stop.wait()

    stack.push_async_callback(_set, stop)
    for index in range(processes):
        tg.start_soon(hold, index)
    with anyio.fail_after(START_TIMEOUT_SECONDS):
        await ready.wait()
    return [c for c in clients if c is not None]


async def _set(event: anyio.Event) -> None:
    event.set()


async def run_trial(fleet: Fleet, fake: FakeControl, trial: int, budget: int, tag: str) -> TrialResult:
    """One operation, every process calling check_status on it until it stops."""
    kind, steps = scenario(trial)
    job_id = f"{tag}-job-{trial:04d}"
    operation_id = f"{tag}-op-{trial:04d}"
    await fake.script(job_id, steps)
    started = time.monotonic()
    await call(
        fleet.clients[0],
        "start_operation",
        provider=PROVIDER,
        operation_id=operation_id,
        provider_job_id=job_id,
        max_status_requests=budget,
        deadline_seconds=120,
    )
    go = anyio.Event()
    outcomes: Counter[str] = Counter()
    calls = 0

    async def hammer(client: Client, wait_seconds: float) -> None:
        nonlocal calls
        await go.wait()
        for _ in range(MAX_CALLS_PER_PROCESS):
            view = await call(client, "check_status", operation_id=operation_id, wait_seconds=wait_seconds)
            calls += 1
            outcomes[view["outcome"]] += 1
            if view["status"] != "waiting":
                return
        raise AssertionError(f"{operation_id}: a process made {MAX_CALLS_PER_PROCESS} calls without a stop")

    with anyio.fail_after(TRIAL_TIMEOUT_SECONDS):
        async with anyio.create_task_group() as tg:
            for index, client in enumerate(fleet.clients):
                # Half answer not_yet at once; half sleep to the allowed time and race from there.
                tg.start_soon(hammer, client, WAIT_SECONDS if index % 2 else 0.0)
            go.set()
    seconds = time.monotonic() - started

    entries = await fake.status_requests(job_id)
    record = read_record(fleet.db, operation_id)
    assert record is not None
    result = TrialResult(
        trial=trial,
        scenario=kind,
        operation_id=operation_id,
        budget=budget,
        provider_requests=len(entries),
        max_in_flight=max_in_flight(entries),
        overlapping=overlapping_pairs(entries),
        polled_answers=outcomes["polled"],
        calls=calls,
        status_requests_used=int(record["status_requests_used"]),
        final_status=str(record["status"]),
        stop_reason=record["stop_reason"],
        seconds=round(seconds, 3),
    )
    v = result.violations
    if result.provider_requests > budget:
        v.append(f"{result.provider_requests} status requests for a budget of {budget}")
    if result.max_in_flight > 1 or result.overlapping:
        v.append(f"{result.max_in_flight} requests in flight at once ({result.overlapping} overlapping)")
    if result.polled_answers != result.provider_requests:
        v.append(
            f"{result.provider_requests} requests reached the provider, {result.polled_answers} reported"
        )
    if result.status_requests_used != result.provider_requests:
        v.append(f"counter {result.status_requests_used} != {result.provider_requests} requests seen")
    if result.final_status == "waiting":
        v.append("the operation is still waiting after every process stopped")
    v.extend(record_problems(record))
    if record["lease_owner"] is not None:
        v.append("a lease is still held after the trial")
    return result


async def run_stress(
    *,
    trials: int,
    processes: int = 8,
    budget: int = 5,
    time_limit: float = 1800.0,
    workdir: Path,
    database: Database | None = None,
) -> dict[str, Any]:
    """Run the trials and return the summary (with every trial's result); `database` defaults to a SQLite file."""
    wall_start = time.monotonic()
    db: Database = database if database is not None else workdir / "race.db"
    tables = workdir / "tables"
    results: list[TrialResult] = []
    with fake_provider_process(workdir) as base_url:
        write_provider_table(tables, PROVIDER, base_url, default_max_status_requests=budget)
        fake = FakeControl(base_url)
        try:
            async with AsyncExitStack() as stack:
                startup = time.monotonic()
                clients = await _start_fleet(stack, processes, db, tables, workdir)
                startup_seconds = time.monotonic() - startup
                fleet = Fleet(clients=clients, db=db)
                tag = f"r{int(time.time())}"
                for trial in range(trials):
                    if time.monotonic() - wall_start > time_limit:
                        break
                    results.append(await run_trial(fleet, fake, trial, budget, tag))
        finally:
            await fake.aclose()
    verify = audit_verify(db)
    integrity = integrity_check(db)
    violations = [f"trial {r.trial}: {text}" for r in results for text in r.violations]
    if verify.code != 0:
        violations.append(f"audit verify failed: {verify.stdout.strip()} {verify.stderr.strip()}")
    if integrity != "ok":
        violations.append(f"integrity_check: {integrity}")
    if len(results) < trials:
        violations.append(f"time limit {time_limit:g} s reached after {len(results)} of {trials} trials")
    return {
        "trials": len(results),
        "trials_requested": trials,
        "processes": processes,
        "budget": budget,
        "total_requests": sum(r.provider_requests for r in results),
        "max_requests_per_trial": max((r.provider_requests for r in results), default=0),
        "max_in_flight": max((r.max_in_flight for r in results), default=0),
        "overlapping_requests": sum(r.overlapping for r in results),
        "total_check_status_calls": sum(r.calls for r in results),
        "scenarios": dict(Counter(r.scenario for r in results)),
        "stop_reasons": dict(Counter(str(r.stop_reason) for r in results)),
        "violations": violations,
        "audit_verify": verify.stdout.strip(),
        "integrity_check": integrity,
        "startup_seconds": round(startup_seconds, 2),
        "wall_seconds": round(time.monotonic() - wall_start, 2),
        "machine": {"cpus": _cpus(), "python": sys.version.split()[0], "platform": sys.platform},
        "results": [asdict(r) for r in results],
    }


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
