"""The store's transactions as flows (`pollwarden.store.planned`), driven here without a database.

A flow asks for what it reads and carries out; each engine answers those requests with its own
locking (the engine conformance suite shows both do). Here: what each flow asks, in what order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import operation_record
from pollwarden.audit.entry import NO_REFUSALS, PendingRefusals
from pollwarden.core.records import CheckStart, OperationRecord
from pollwarden.core.vocabulary import Outcome, Status
from pollwarden.rules.fleet_pace import PaceBucket
from pollwarden.rules.gate import GateVerdict, Verdict
from pollwarden.store import statements, transactions
from pollwarden.store.plans import Flush
from pollwarden.store.rows import StoredOperation
from pollwarden.store.transactions import (
    CarryOut,
    Flow,
    Locked,
    Query,
    Request,
    check,
    flush_all,
    flush_one,
    gate,
)
from pollwarden_providers.table_limits import FleetSpec

NOW = 2000.0
FLEET = FleetSpec(max_requests_per_second=1.0, burst=1)


def drive(flow: Flow[Any], answer: Callable[[Request], object]) -> tuple[list[Request], Any]:
    """Run `flow` answering each request with `answer`; (every request, in order; the flow's result)."""
    asked: list[Request] = []

    def noted(request: Request) -> object:
        asked.append(request)
        return answer(request)

    return asked, transactions.drive(flow, noted)


def carried(request: Request) -> object:
    """An engine that reads nothing and carries every plan out: the record the plan leaves."""
    return request.plan.record if isinstance(request, CarryOut) else None


def waiting(**changes: Any) -> OperationRecord:
    return operation_record(status_requests_used=3, stopped_at=None, **changes)


def test_the_gate_reads_the_approvals_only_for_an_escalated_operation_that_applies_them() -> None:
    fleets: dict[str, FleetSpec | None] = {}
    asked, _ = drive(gate(waiting(), NOW, NOW, fleets, True, None, frozenset()), carried)
    assert asked == []
    escalated = waiting(status=Status.ESCALATED)
    asked, _ = drive(gate(escalated, NOW, NOW, fleets, False, None, frozenset()), carried)
    assert asked == []
    asked, _ = drive(gate(escalated, NOW, NOW, fleets, True, None, frozenset()), carried)
    assert [r.statement for r in asked if isinstance(r, Query)] == [statements.HAS_DUE_EXTENSION_APPROVALS]


def test_a_check_reads_the_pace_only_on_a_paced_provider_and_then_carries_its_plan_out() -> None:
    current = StoredOperation(waiting(), NO_REFUSALS)
    reserve = GateVerdict(Verdict.RESERVE)
    asked, start = drive(check(current, reserve, NOW, "me", 30.0, None, None), carried)
    assert [type(r) for r in asked] == [CarryOut]
    assert isinstance(start, CheckStart)
    assert start.record.lease_owner == "me"

    asked, _ = drive(check(current, reserve, NOW, "me", 30.0, FLEET, None), carried)
    # The pace, then the other operations' held slots not used yet (the sends' clock keeps room for them).
    assert [r.statement for r in asked if isinstance(r, Query)] == [
        statements.SELECT_PACE,
        statements.PROVIDER_OWED_SLOTS,
    ]
    assert isinstance(asked[-1], CarryOut)
    # A caller that read both in its own trip (PostgreSQL, with the pace row locked) is asked for neither.
    asked, _ = drive(
        check(current, reserve, NOW, "me", 30.0, FLEET, None, PaceBucket(None, None), 0), carried
    )
    assert [type(r) for r in asked] == [CarryOut]


def test_flushing_writes_a_summary_for_each_operation_with_refusals_and_counts_them() -> None:
    pending = StoredOperation(waiting(), PendingRefusals(3, Outcome.NOT_YET, NOW - 9, NOW - 1))
    asked, count = drive(flush_one(), lambda r: pending if isinstance(r, Locked) else None)
    assert count == 1
    assert [w for r in asked if isinstance(r, CarryOut) for w in r.plan.writes] == [Flush()]
    asked, count = drive(
        flush_one(), lambda r: StoredOperation(waiting(), NO_REFUSALS) if isinstance(r, Locked) else None
    )
    assert count == 0  # another flush wrote it while this one waited for the lock

    asked, count = drive(flush_all(), lambda r: [] if isinstance(r, Query) else None)
    assert count == 0
    (read,) = asked
    assert isinstance(read, Query)
    assert read.lock
