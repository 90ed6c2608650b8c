"""Crash injection, one run: a `pollwarden serve` SIGKILLed at one step of a check, then recovery.

A server built by `serve_with_faults` dies when its first status check reaches
the step; another server on the same database (without the hook) then takes
over. The run records, against the fake provider's own log and the database
file, what the crash left and how the recovery went, and lists every violation
of the guarantees (the counter covers what the provider saw; the dead owner's
lease blocks every check until it expires, then is recovered; no request beyond
the budget; the audit chain intact and telling the recovery once).

Used by tests/integration/test_crash.py (a few runs) and `python -m benchmarks.crash_matrix` (the full matrix).
"""

from __future__ import annotations

import re
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from mcp.client import Client
from mcp.shared.exceptions import MCPError

from pollwarden.flows.check_hooks import CheckBoundary
from tests.support.fake_provider import pending
from tests.support.live import (
    Database,
    FakeControl,
    Rigging,
    audit_kinds,
    audit_verify,
    call,
    integrity_check,
    read_record,
    record_problems,
    stdio_server,
    wait_until_gone,
)

PROVIDER = "crash"
# Requests the provider has received when the process dies at each step.
SENT_AT_CRASH = {"after_reservation": 0, "after_request_sent": 1, "after_response": 1, "before_persist": 1}
# serve_with_faults.HOOK_LINE, as written.
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
    step: CheckBoundary,
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
    rigging = Rigging(fault_step=step, lease_seconds=lease_seconds)
    async with stdio_server(db, tables, errlog=errlog, rigging=rigging) as doomed:
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
