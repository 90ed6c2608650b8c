"""Crash injection: a real `pollwarden serve` is SIGKILLed at each step of a check, then another one recovers.

The server is built by tests/support/serve_with_faults.py: a step hook kills the process at the named
step, and a shorter lease lets recovery be seen in seconds.
The full matrix (20 runs per step) is `python -m benchmarks.crash_matrix`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import database_in
from pollwarden.flows.check_hooks import CHECK_BOUNDARIES, CheckBoundary
from tests.support.crash import SENT_AT_CRASH, CrashRun, crash_once
from tests.support.fake_provider import FakeProvider
from tests.support.live import FakeControl, stdio_server, write_provider_table

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# Long enough for the recovery server to meet the dead owner's lease still running, and to check a few times.
LEASE_SECONDS = 6.0


async def _crash(tmp_path: Path, fake: FakeProvider, step: CheckBoundary, *, budget: int) -> CrashRun:
    tables = tmp_path / "tables"
    write_provider_table(tables, "crash", fake.base_url)
    db = database_in(tmp_path)
    control = FakeControl(fake.base_url)
    try:
        # The recovery server is another process that never held the lease. It is started before the
        # crash: started after it, its start-up (over 6 s on a loaded 2-core machine) raced the lease.
        async with stdio_server(db, tables, errlog=tmp_path / "recovery.log") as recovery:
            return await crash_once(
                step,
                run=0,
                db=db,
                tables=tables,
                fake=control,
                workdir=tmp_path,
                recovery=recovery,
                budget=budget,
                lease_seconds=LEASE_SECONDS,
            )
    finally:
        await control.aclose()


@pytest.mark.parametrize("step", CHECK_BOUNDARIES)
async def test_a_server_killed_at_any_step_loses_no_count_and_a_fresh_one_recovers_after_the_lease(
    tmp_path: Path, fake: FakeProvider, step: CheckBoundary
) -> None:
    run = await _crash(tmp_path, fake, step, budget=3)

    assert run.killed_at == step
    assert run.process_gone
    # The reservation was durable before the request left: the counter covers what the provider saw.
    assert run.provider_requests_at_crash == SENT_AT_CRASH[step]
    assert run.used_at_crash == 1 >= run.provider_requests_at_crash
    assert run.lease_held_at_crash
    # While the dead owner's lease runs, the fresh server refuses and sends nothing.
    assert run.checks_refused_while_leased >= 1
    assert run.requests_while_leased == 0
    # After it expires the lease is recovered and checks run to the budget, never past it.
    assert run.resumed_after_lease_expiry_seconds is not None
    assert run.resumed_after_lease_expiry_seconds >= 0
    assert run.provider_requests_total <= run.budget
    assert run.status_requests_used == run.budget
    assert run.status_requests_used - run.provider_requests_total == (1 if step == "after_reservation" else 0)
    assert (run.final_status, run.stop_reason) == ("escalated", "request_budget_exhausted")
    # No half-written row, the audit chain is intact, and it tells the recovery once.
    assert run.audit_ok
    assert run.audit_kinds.count("lease_recovered") == 1
    assert run.integrity == "ok"
    assert run.violations == []


async def test_a_crash_on_the_last_budgeted_reservation_stops_the_operation_without_any_request(
    tmp_path: Path, fake: FakeProvider
) -> None:
    run = await _crash(tmp_path, fake, "after_reservation", budget=1)

    assert run.used_at_crash == 1
    assert run.provider_requests_total == 0
    assert run.resumed_after_lease_expiry_seconds is not None
    assert run.resumed_after_lease_expiry_seconds >= 0
    assert (run.final_status, run.stop_reason) == ("escalated", "request_budget_exhausted")
    assert run.audit_ok
    assert run.audit_kinds[-2:] == ["lease_recovered", "stopped"]
    assert run.violations == []
