"""Both engines carry out every kind of write a plan makes (`pollwarden.store.plans`), under races too.

The rules are tests/unit/test_plans.py's; here each engine's executor is held to them through the
`Store` interface on a real database: an `Update` guarded by the version it was planned from (two
stores racing for one write: exactly one wins, the other writes nothing), `Flush` before any other
row, `CountRefusal` (quiet, then a summary row), `SetPace` (one shared pace across stores),
`Append` (the recovered lease told), `Execute` (an approval applied with its extension, a follow-up
recorded with the approval it used), and the wake-up's plan applied only where `plans.may_wake` says.
Races: two stores taking one lease, one pace, one extension, one approval's answer, counting
refusals on one operation. A fault: a plan
whose statement fails after its `Update` ran writes nothing at all.

This module, not a copy of every integration test, is what holds PostgreSQL to SQLite's behaviour
for the tests marked `one_engine` (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import harness
from pollwarden.access.approval_policy import ApprovalPolicy
from pollwarden.audit.chain import REKEY_OPERATION, key_problem
from pollwarden.audit.entry import REFUSALS_PER_SUMMARY
from pollwarden.audit.verify import verify_chain
from pollwarden.core.errors import StoreError
from pollwarden.core.records import ApprovalRecord, CheckStart, OperationRecord, WakeOutcome
from pollwarden.core.vocabulary import ApprovalStatus, DelaySource, FollowupKind, FollowupStatus, Status
from pollwarden.rules.gate import Verdict
from pollwarden.store import DatabaseLocation, Store, open_store
from pollwarden_providers.table_limits import FleetSpec

pytestmark = [pytest.mark.anyio, pytest.mark.both_engines]

NOW = 10_000.0
NO_FLEET: dict[str, FleetSpec | None] = {"acme": None}


def values(operation_id: str, **changes: Any) -> dict[str, Any]:
    """A waiting operation of `acme`, due at NOW, on job `job-<id>`, with `changes`."""
    base: dict[str, Any] = {
        "operation_id": operation_id,
        "provider": "acme",
        "provider_job_id": f"job-{operation_id}",
        "account_context": "http://127.0.0.1:9 as anonymous",
        "request_fingerprint": f"fp-{operation_id}",
        "idempotency_key": None,
        "expected_terminal_state": "succeeded",
        "status": Status.WAITING,
        "started_at": NOW - 100,
        "deadline_at": NOW + 3600,
        "business_deadline_at": None,
        "max_status_requests": 10,
        "max_transport_failures": 3,
        "max_rate_limited": 3,
        "next_check_at": NOW,
        "delay_source": DelaySource.LOCAL_BACKOFF,
        "submit_payload_json": None,
        "created_at": NOW - 100,
        "updated_at": NOW - 100,
    }
    return {**base, **changes}


@asynccontextmanager
async def stores(tmp_path: Path, count: int) -> AsyncGenerator[list[Store]]:
    """`count` stores on one database, as `count` server processes would hold."""
    where = harness.database_in(tmp_path)
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(open_store(where)) for _ in range(count)]


@contextmanager
def _row_held_by_its_own_check(where: DatabaseLocation, operation_id: str) -> Iterator[Any]:
    """PostgreSQL: another session (the operation's own check, waiting for the pace row) holds its row."""
    import psycopg

    with psycopg.connect(where.dsn) as session:
        session.execute("SELECT 1 FROM operations WHERE operation_id = %s FOR UPDATE", (operation_id,))
        yield session


async def kinds(store: Store, operation_id: str) -> list[str]:
    """The operation's story, as audit kinds in chain order."""
    await store.flush_refusals(operation_id)
    return [row.kind for row in await store.audit_rows(operation_id)]


async def check(store: Store, operation_id: str, now: float, **extra: Any) -> CheckStart:
    """One begin_check at `now` (no waiting), leasing for 30 s."""
    extra.setdefault("fleets", NO_FLEET)
    started = await store.begin_check(
        operation_id, now=now, wait_until=now, owner=f"call-{id(store)}", lease_seconds=30, **extra
    )
    assert started is not None
    return started


async def test_a_store_opened_with_another_key_than_the_chains_refuses_before_writing_anything(
    tmp_path: Path,
) -> None:
    # A mistyped POLLWARDEN_AUDIT_KEY: every row it appended would break the chain for the real key.
    where = harness.database_in(tmp_path)
    async with open_store(where, audit_key=b"the key") as store:
        await store.create_operation(values("op"), kind="started", at=NOW - 100)
        await check(store, "op", NOW)  # an operation row after the opening one (PostgreSQL: its own chain)
        rows = len(await store.audit_rows("op"))
    assert key_problem(where, b"the key") is None
    problem = key_problem(where, b"a typo")
    assert problem is not None
    assert "POLLWARDEN_AUDIT_KEY is not the key that wrote the audit chain" in problem
    with pytest.raises(StoreError, match="not the key that wrote the audit chain"):
        async with open_store(where, audit_key=b"a typo") as store:
            await store.audit_event("op", kind="noted", at=NOW, note=None, extra={})
    async with open_store(where, audit_key=b"the key") as store:
        assert len(await store.audit_rows("op")) == rows  # nothing was written with the wrong key


async def test_each_approval_policy_change_is_told_in_the_one_chain_and_the_chain_verifies(
    tmp_path: Path,
) -> None:
    where = harness.database_in(tmp_path)
    raised = ApprovalPolicy(require_operator_key=True, channels=frozenset({"operator"}))
    async with open_store(where) as store:
        await store.create_operation(values("op"), kind="started", at=NOW - 100)
        assert await store.write_approval_policy(raised, at=NOW, by="ann", only_raising_to_a_key=False)
        assert await store.write_approval_policy(raised, at=NOW + 1, by="ann", only_raising_to_a_key=False)
        assert await store.write_approval_policy(
            ApprovalPolicy(), at=NOW + 2, by="bob", only_raising_to_a_key=False
        )
        await store.create_operation(values("later"), kind="started", at=NOW + 3)
        told = [row.payload_obj for row in await store.audit_rows(REKEY_OPERATION)]
    # The same policy written again (a server starting) is no decision: two changes, two rows.
    assert [(p["note"], p["before"], p["after"]) for p in told] == [
        (
            "approval policy changed by ann",
            ApprovalPolicy().facts(),
            {"require_operator_key": True, "channels": ["operator"], "operator_key_ids": []},
        ),
        ("approval policy changed by bob", raised.facts(), ApprovalPolicy().facts()),
    ]
    assert verify_chain(where, None).ok


async def test_a_guarded_update_raced_by_two_stores_is_written_once(tmp_path: Path) -> None:
    async with stores(tmp_path, 2) as (first, second):
        await first.create_operation(values("op"), kind="started", at=NOW - 100)
        results: list[CheckStart] = []

        async def reserve(store: Store) -> None:
            results.append(await check(store, "op", NOW))

        async with anyio.create_task_group() as tg:
            tg.start_soon(reserve, first)
            tg.start_soon(reserve, second)
        steps = sorted(str(r.decision.kind) for r in results)
        record = await first.get("op")
    assert steps == sorted([str(Verdict.RESERVE), str(Verdict.NOT_YET)]) or steps == sorted(
        [str(Verdict.RESERVE), str(Verdict.WAIT)]
    )
    assert record is not None
    assert record.status_requests_used == 1  # one request counted, one lease taken


async def test_a_plan_whose_guard_no_longer_holds_writes_nothing_but_the_pending_refusals(
    tmp_path: Path,
) -> None:
    async with stores(tmp_path, 2) as (first, second):
        await first.create_operation(values("op", status=Status.SUBMITTING), kind="started", at=NOW - 100)
        won = await first.claim_submission(
            "op", owner="a", now=NOW, lease_seconds=30, allow_stale=False, note="sending"
        )
        lost = await second.claim_submission(
            "op", owner="b", now=NOW, lease_seconds=30, allow_stale=False, note="sending"
        )
        story = await kinds(first, "op")
    assert won is not None
    assert won.lease_owner == "a"
    assert lost is None
    assert story == ["started", "submit_sending"]


async def test_refused_calls_are_counted_quietly_and_flushed_before_the_next_row(tmp_path: Path) -> None:
    async with stores(tmp_path, 1) as (store,):
        await store.create_operation(values("op", next_check_at=NOW + 600), kind="started", at=NOW - 100)
        for i in range(3):
            refused = await check(store, "op", NOW + i)
            assert refused.decision.kind == Verdict.NOT_YET
        before = [row.kind for row in await store.audit_rows("op")]
        await store.audit_event("op", kind="noted", at=NOW + 10, note=None, extra={})
        after = [row.kind for row in await store.audit_rows("op")]
    assert before == ["started"]  # counted on the row, no audit row yet
    assert after[0] == "started"
    assert after[-1] == "noted"
    assert len(after) == 3  # the summary of the three refusals, before the row that follows them


async def test_a_full_run_of_refusals_becomes_one_summary_row_at_once(tmp_path: Path) -> None:
    async with stores(tmp_path, 1) as (store,):
        await store.create_operation(values("op", next_check_at=NOW + 600), kind="started", at=NOW - 100)
        for i in range(REFUSALS_PER_SUMMARY):
            await check(store, "op", NOW + i)
        rows = await store.audit_rows("op")
    assert len(rows) == 2  # written as the run completed, not when the story was read


async def test_one_pace_is_shared_by_every_store_on_the_database(tmp_path: Path) -> None:
    fleet: dict[str, FleetSpec | None] = {"acme": FleetSpec(max_requests_per_second=2.0, burst=1)}
    async with stores(tmp_path, 2) as (first, second):
        await first.create_operation(values("a"), kind="started", at=NOW - 100)
        await first.create_operation(values("b"), kind="started", at=NOW - 100)
        admitted = await check(first, "a", NOW, fleets=fleet)
        paced = await check(second, "b", NOW, fleets=fleet)
        booked = await second.get("b")
    assert admitted.decision.kind == Verdict.RESERVE
    assert paced.decision.kind == Verdict.PACED
    assert paced.decision.allowed_at == NOW + 0.5
    assert booked is not None
    assert (booked.fleet_slot_at, booked.next_check_at, booked.status_requests_used) == (
        NOW + 0.5,
        NOW + 0.5,
        0,
    )


async def test_a_recovered_lease_is_told_before_the_reservation_that_takes_it(tmp_path: Path) -> None:
    async with stores(tmp_path, 2) as (first, second):
        await first.create_operation(values("op"), kind="started", at=NOW - 100)
        await check(first, "op", NOW)  # this call's process dies with the lease
        taken = await check(second, "op", NOW + 31)
        story = await kinds(second, "op")
    assert taken.decision.kind == Verdict.RESERVE
    assert taken.record.status_requests_used == 2  # the lost request stays counted
    assert story == ["started", "lease_recovered"]


async def test_a_stop_before_any_request_is_written_with_its_story(tmp_path: Path) -> None:
    async with stores(tmp_path, 1) as (store,):
        await store.create_operation(values("op", deadline_at=NOW), kind="started", at=NOW - 100)
        stopped = await check(store, "op", NOW)
        story = await kinds(store, "op")
    assert stopped.decision.kind == Verdict.STOP
    assert stopped.record.status == Status.ESCALATED
    assert stopped.record.status_requests_used == 0
    assert story == ["started", "stopped"]


async def test_a_check_whose_deadline_passes_while_it_waits_for_the_locks_stops_and_takes_no_pace(
    tmp_path: Path,
) -> None:
    # The call comes before the deadline; the time read once the locks are held (BEGIN, or the row and the
    # pace row, waited for another process) is past it.
    fleet: dict[str, FleetSpec | None] = {"acme": FleetSpec(max_requests_per_second=0.1, burst=1)}
    async with stores(tmp_path, 1) as (store,):
        await store.create_operation(values("other"), kind="started", at=NOW - 100)
        await store.create_operation(values("op", deadline_at=NOW + 1), kind="started", at=NOW - 100)
        await check(store, "other", NOW, fleets=fleet)  # uses the pace: its next slot is 10 s away
        late = await check(store, "op", NOW + 0.5, fleets=fleet, clock=lambda: NOW + 1.5)
        record = await store.get("op")
        story = await kinds(store, "op")
    assert late.decision.kind == Verdict.STOP
    assert late.decision.stop_reason == "deadline_exceeded"
    assert record is not None
    assert (record.status, record.status_requests_used, record.lease_owner) == (Status.ESCALATED, 0, None)
    assert story == ["started", "stopped"]


async def test_a_webhook_wakes_only_the_operations_its_plan_may_bring_forward(tmp_path: Path) -> None:
    async with stores(tmp_path, 1) as (store,):
        job = {"provider_job_id": "job-shared"}
        await store.create_operation(
            values("later", next_check_at=NOW + 60, **job), kind="started", at=NOW - 100
        )
        await store.create_operation(
            values(
                "retry",
                next_check_at=NOW + 60,
                delay_source=DelaySource.PROVIDER_RETRY_AFTER,
                account_context="x",
                **job,
            ),
            kind="started",
            at=NOW - 100,
        )
        woken = await store.wake(
            provider="acme",
            job_id="job-shared",
            event_id="ev",
            event_type="done",
            now=NOW,
            remember_seconds=600,
        )
        replay = await store.wake(
            provider="acme",
            job_id="job-shared",
            event_id="ev",
            event_type="done",
            now=NOW,
            remember_seconds=600,
        )
        later: OperationRecord | None = await store.get("later")
        story = await kinds(store, "later")
    # Issue 30: a Retry-After delay no longer stops a wake-up; only its not_before_at bounds it (none here).
    assert (woken.outcome, woken.woken) == (WakeOutcome.WOKEN, ("later", "retry"))
    assert replay.outcome == WakeOutcome.REPLAYED
    assert later is not None
    assert (later.next_check_at, later.woken_at) == (NOW, NOW)
    assert story == ["started", "woken_by_webhook"]


# -- Execute: the statements a plan runs beside the operation's writes ------------------------------


async def approved_extension(store: Store, operation_id: str) -> OperationRecord:
    """An escalated operation with an approved extension question (`ap-<id>`) about it as it is."""
    created, _ = await store.create_operation(
        values(operation_id, status=Status.ESCALATED), kind="started", at=NOW - 100
    )
    await store.open_approval(
        approval_id=f"ap-{operation_id}",
        record=created,
        kind="extension",
        request={"extra_requests": 2},
        at=NOW,
        ttl_seconds=600,
    )
    decided = await store.decide_approval(
        f"ap-{operation_id}", approve=True, by="alice", at=NOW + 1, method="tty"
    )
    assert decided is not None
    assert decided.status == ApprovalStatus.APPROVED
    return created


async def extend(store: Store, record: OperationRecord) -> OperationRecord | None:
    """Apply the approved extension `ap-<id>` to `record`'s operation, bound to the version asked about."""
    return await store.apply_extension(
        record.operation_id,
        bound_version=record.version,
        changes={"status": Status.WAITING, "max_status_requests": record.max_status_requests + 2},
        at=NOW + 2,
        approval_id=f"ap-{record.operation_id}",
        payload_extra={},
    )


async def test_an_extension_marks_its_approval_applied_in_the_same_transaction(tmp_path: Path) -> None:
    async with stores(tmp_path, 1) as (store,):
        asked = await approved_extension(store, "op")
        extended = await extend(store, asked)
        approval = await store.get_approval("ap-op")
        story = await kinds(store, "op")
    assert extended is not None
    assert (extended.status, extended.max_status_requests, extended.extensions_used) == (
        Status.WAITING,
        12,
        1,
    )
    assert extended.version == asked.version + 1
    assert approval is not None
    assert approval.status == ApprovalStatus.APPLIED
    assert story == ["started", "approval_pending", "approval_granted", "extension_approved"]


async def test_one_extension_applied_by_two_stores_at_once_is_granted_once(tmp_path: Path) -> None:
    async with stores(tmp_path, 2) as (first, second):
        asked = await approved_extension(first, "op")
        results: list[OperationRecord | None] = []

        async def apply(store: Store) -> None:
            results.append(await extend(store, asked))

        async with anyio.create_task_group() as tg:
            tg.start_soon(apply, first)
            tg.start_soon(apply, second)
        record = await second.get("op")
        story = await kinds(second, "op")
    assert sum(r is not None for r in results) == 1  # the other's guard (the version asked about) failed
    assert record is not None
    assert (record.extensions_used, record.max_status_requests) == (1, 12)
    assert story.count("extension_approved") == 1


async def test_two_people_deciding_one_question_at_once_leave_one_decision(tmp_path: Path) -> None:
    async with stores(tmp_path, 2) as (first, second):
        created, _ = await first.create_operation(
            values("op", status=Status.ESCALATED), kind="started", at=NOW - 100
        )
        await first.open_approval(
            approval_id="ap-op", record=created, kind="extension", request={}, at=NOW, ttl_seconds=600
        )
        decided: list[ApprovalRecord | None] = []

        async def answer(store: Store, approve: bool) -> None:
            by = "alice" if approve else "bob"
            decided.append(
                await store.decide_approval("ap-op", approve=approve, by=by, at=NOW + 1, method="tty")
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(answer, first, True)
            tg.start_soon(answer, second, False)
        stored = await first.get_approval("ap-op")
        story = await kinds(first, "op")
    assert stored is not None
    assert stored.decided_by in {"alice", "bob"}
    # The later answer found it no longer pending: it wrote nothing and was told the first one.
    assert [(d.status, d.decided_by) if d else None for d in decided] == [
        (stored.status, stored.decided_by)
    ] * 2
    assert len([kind for kind in story if kind.startswith(("approval_granted", "extension_denied"))]) == 1


async def approved_cancel_sent(store: Store, expect_version: int, status: str = "sent") -> tuple[Any, bool]:
    """Record the cancel call `fu-1` that approval `ap-op` allowed, answered 202, on `op` as it was at
    `expect_version`; what `record_followup` returns."""
    return await store.record_followup(
        followup_id="fu-1",
        operation_id="op",
        kind="cancel",
        status=status,
        at=NOW + 3,
        approval_id="ap-op",
        http_status=202,
        operation_changes={"status": Status.CANCELLED},
        expect_version=expect_version,
    )


async def test_a_followup_is_recorded_with_its_story_and_uses_its_approval(tmp_path: Path) -> None:
    async with stores(tmp_path, 1) as (store,):
        asked = await approved_extension(store, "op")
        recorded = await approved_cancel_sent(store, asked.version)
        followups = await store.list_followups("op")
        approval = await store.get_approval("ap-op")
        record = await store.get("op")
        story = await kinds(store, "op")
    assert recorded[1] is True
    assert [(f.followup_id, f.kind, f.status, f.http_status) for f in followups] == [
        ("fu-1", FollowupKind.CANCEL, FollowupStatus.SENT, 202)
    ]
    assert approval is not None
    assert (approval.status, approval.note) == (ApprovalStatus.APPLIED, "used by fu-1")
    assert record is not None
    assert (record.status, record.version) == (Status.CANCELLED, asked.version + 1)
    assert story[-1] == "cancel_sent"


async def test_a_followup_sent_while_the_operation_moved_is_recorded_and_leaves_the_operation_as_it_is(
    tmp_path: Path,
) -> None:
    async with stores(tmp_path, 1) as (store,):
        asked = await approved_extension(store, "op")
        # The cancel call is out; meanwhile the operation moves (another approval's extension applied).
        moved = await store.apply_extension(
            "op",
            bound_version=asked.version,
            changes={"status": Status.WAITING},
            at=NOW + 2,
            approval_id=None,
            payload_extra={},
        )
        assert moved is not None
        recorded, applied = await approved_cancel_sent(store, asked.version, status="done")
        followups = await store.list_followups("op")
        approval = await store.get_approval("ap-op")
        record = await store.get("op")
        rows = await store.audit_rows("op")
    assert (recorded.followup_id, applied) == ("fu-1", False)
    assert [(f.followup_id, f.kind, f.http_status) for f in followups] == [("fu-1", FollowupKind.CANCEL, 202)]
    assert approval is not None
    assert approval.status == ApprovalStatus.APPLIED  # the call it approved went out
    assert record is not None
    assert (record.status, record.version) == (Status.WAITING, moved.version)  # not cancelled over it
    assert rows[-1].kind == "cancel_done"
    assert str(rows[-1].payload_obj["note"]).endswith(
        f"(version {asked.version} → {moved.version}): not changed"
    )


async def test_a_plan_that_fails_midway_writes_nothing_at_all(tmp_path: Path) -> None:
    # The fault: the plan's second statement (a follow-up id already taken) fails after its Update ran.
    async with stores(tmp_path, 1) as (store,):
        asked = await approved_extension(store, "op")
        first = await store.record_followup(
            followup_id="fu-1", operation_id="op", kind="fetch_result", status="refused", at=NOW + 3
        )
        before = await store.audit_rows("op")
        with pytest.raises(StoreError, match=r"(?i)unique|duplicate"):  # each engine's words for it
            await store.record_followup(
                followup_id="fu-1",
                operation_id="op",
                kind="cancel",
                status="sent",
                at=NOW + 4,
                approval_id="ap-op",
                operation_changes={"status": Status.CANCELLED},
                expect_version=asked.version,
            )
        record = await store.get("op")
        approval = await store.get_approval("ap-op")
        after = await store.audit_rows("op")
        followups = await store.list_followups("op")
    assert first[1] is True
    assert record is not None
    assert (record.status, record.version) == (Status.ESCALATED, asked.version)  # the Update rolled back
    assert approval is not None
    assert approval.status == ApprovalStatus.APPROVED  # not used
    assert [row.seq for row in after] == [row.seq for row in before]  # no row appended
    assert [f.kind for f in followups] == [FollowupKind.FETCH_RESULT]


async def test_two_stores_racing_for_one_pace_admit_one_and_pace_the_other(tmp_path: Path) -> None:
    fleet: dict[str, FleetSpec | None] = {"acme": FleetSpec(max_requests_per_second=2.0, burst=1)}
    async with stores(tmp_path, 2) as (first, second):
        await first.create_operation(values("a"), kind="started", at=NOW - 100)
        await first.create_operation(values("b"), kind="started", at=NOW - 100)
        results: list[CheckStart] = []

        async def reserve(store: Store, operation_id: str) -> None:
            results.append(await check(store, operation_id, NOW, fleets=fleet))

        async with anyio.create_task_group() as tg:
            tg.start_soon(reserve, first, "a")
            tg.start_soon(reserve, second, "b")
    steps = sorted(str(r.decision.kind) for r in results)
    assert steps == sorted([str(Verdict.RESERVE), str(Verdict.PACED)])
    paced = next(r for r in results if r.decision.kind == Verdict.PACED)
    assert paced.decision.allowed_at == NOW + 0.5  # the one slot behind the admitted request
    assert paced.record.status_requests_used == 0


async def test_refusals_counted_by_two_stores_at_once_are_all_counted(tmp_path: Path) -> None:
    async with stores(tmp_path, 2) as (first, second):
        await first.create_operation(values("op", next_check_at=NOW + 600), kind="started", at=NOW - 100)

        async def refuse(store: Store, times: int) -> None:
            for i in range(times):
                assert (await check(store, "op", NOW + i)).decision.kind == Verdict.NOT_YET

        async with anyio.create_task_group() as tg:
            tg.start_soon(refuse, first, 5)
            tg.start_soon(refuse, second, 5)
        await first.flush_refusals("op")
        rows = await first.audit_rows("op")
    assert rows[0].kind == "started"
    assert sum(int(str(row.payload_obj["count"])) for row in rows[1:]) == 10  # no count lost to the race


# -- fair shares: a principal's next slot handed to its operation waiting longest (issue 29) ----------

PACED_FLEET: dict[str, FleetSpec | None] = {"acme": FleetSpec(max_requests_per_second=2.0, burst=1)}


async def _sibling_and_slot_holder(store: Store, where: DatabaseLocation) -> None:
    """alice's `holder`, whose slot came, and `waiting`, waiting for the pace longer, its agent coming."""
    for operation_id, next_check_at in (("holder", NOW - 0.1), ("waiting", NOW + 0.3)):
        changes = {"owner": "alice", "next_check_at": next_check_at, "delay_source": DelaySource.FLEET_PACING}
        await store.create_operation(values(operation_id, **changes), kind="started", at=NOW - 100)
    harness.db_write(
        where,
        f"UPDATE operations SET fleet_slot_at = {NOW - 0.1}, request_sent_at = {NOW - 10} "
        "WHERE operation_id = 'holder'",
    )
    harness.db_write(
        where, f"UPDATE operations SET request_sent_at = {NOW - 50} WHERE operation_id = 'waiting'"
    )


async def test_a_request_that_leaves_hands_its_principals_next_slot_to_its_operation_waiting_longest(
    tmp_path: Path,
) -> None:
    where = harness.database_in(tmp_path)
    async with open_store(where) as store:
        await _sibling_and_slot_holder(store, where)
        before = await store.get("waiting")
        sent = await check(store, "holder", NOW, fleets=PACED_FLEET, fleet_slots=1)
        after = await store.get("waiting")
        # The next free slot is the sibling's: one paced check later it is told that slot, not a new one.
        paced = await check(store, "waiting", NOW + 0.3, fleets=PACED_FLEET, fleet_slots=1)
    assert sent.decision.kind == Verdict.RESERVE
    assert before is not None
    assert after is not None
    assert before.fleet_slot_at is None
    assert after.fleet_slot_at == NOW  # the next free slot on the bookings' clock
    assert after.version == before.version + 1  # a cached copy of its row is no longer current
    assert paced.decision.kind == Verdict.PACED
    assert paced.decision.allowed_at == NOW + 0.5  # its slot came; the sends' clock has room then
    assert paced.record.fleet_slot_at == NOW  # it keeps the slot's own time (its place)


async def test_an_operation_whose_lease_expired_is_handed_its_principals_slot_and_sends(
    tmp_path: Path,
) -> None:
    # Its process died mid-request: the expired lease is no lease for fair shares (it was never handed
    # a slot and never sent again, review of issue 29); it is recovered when it reserves.
    where = harness.database_in(tmp_path)
    async with open_store(where) as store:
        await _sibling_and_slot_holder(store, where)
        harness.db_write(
            where,
            f"UPDATE operations SET lease_owner = 'dead-call', lease_expires_at = {NOW - 1} "
            "WHERE operation_id = 'waiting'",
        )
        await check(store, "holder", NOW, fleets=PACED_FLEET, fleet_slots=1)
        handed = await store.get("waiting")
        sent = await check(store, "waiting", NOW + 0.5, fleets=PACED_FLEET, fleet_slots=1)
        story = await kinds(store, "waiting")
    assert handed is not None
    assert handed.fleet_slot_at == NOW
    assert sent.decision.kind == Verdict.RESERVE
    assert "lease_recovered" in story


async def _operation_of(
    store: Store,
    where: DatabaseLocation,
    operation_id: str,
    *,
    next_check_at: float,
    source: DelaySource,
    sent_at: float,
    also: str | None = None,
    owner: str = "alice",
) -> None:
    """An operation of `owner`'s, its last request sent at `sent_at` (and `also`, an SQL assignment)."""
    changes = {"owner": owner, "next_check_at": next_check_at, "delay_source": source}
    await store.create_operation(values(operation_id, **changes), kind="started", at=NOW - 100)
    extra = "" if also is None else f"{also}, "
    harness.db_write(
        where,
        f"UPDATE operations SET {extra}request_sent_at = {sent_at} WHERE operation_id = '{operation_id}'",
    )


async def test_a_sibling_due_by_its_own_schedule_whose_agent_is_still_coming_is_handed_the_slot(
    tmp_path: Path,
) -> None:
    # Issue 29: an agent that comes a little after its own schedule (its jitter, a slower path) was
    # never "waiting" when a sibling sent, so its principal's slot went to the others: 14 requests
    # against its siblings' 20 in the simulation. Due within the hold, no request in flight, it counts.
    where = harness.database_in(tmp_path)
    async with open_store(where) as store:
        await _sibling_and_slot_holder(store, where)
        backoff, pacing = DelaySource.LOCAL_BACKOFF, DelaySource.FLEET_PACING
        await _operation_of(store, where, "later", next_check_at=NOW + 5, source=backoff, sent_at=NOW - 90)
        await _operation_of(store, where, "due", next_check_at=NOW - 0.5, source=backoff, sent_at=NOW - 80)
        # Due too, and served even longer ago, but none of them may send (review of issue 29): a slot
        # handed to one would go unused for its hold, and room be kept for it on the sends' clock.
        cannot = {
            "spent": "status_requests_used = max_status_requests",
            "retry_after": f"not_before_at = {NOW + 60}",
            "past_deadline": f"deadline_at = {NOW - 1}",
        }
        for operation_id, why in cannot.items():
            await _operation_of(
                store,
                where,
                operation_id,
                next_check_at=NOW - 0.5,
                source=backoff,
                sent_at=NOW - 95,
                also=why,
            )
        # Told to wait for the pace but to come back only in 5 s (its server's turn at the pace row was
        # busy), served longest ago: a slot handed now would wait for it, held (second review).
        await _operation_of(
            store, where, "told_later", next_check_at=NOW + 5, source=pacing, sent_at=NOW - 99
        )
        await check(store, "holder", NOW, fleets=PACED_FLEET, fleet_slots=1)
        due, later, waiting, *others = [
            await store.get(o) for o in ("due", "later", "waiting", *cannot, "told_later")
        ]
    assert due is not None
    assert later is not None
    assert waiting is not None
    assert due.fleet_slot_at == NOW  # served longer ago than `waiting`, and due: it gets the slot
    assert later.fleet_slot_at is None  # served longest ago, but not due for 5 s: not handed a slot
    assert waiting.fleet_slot_at is None
    assert [None if o is None else o.fleet_slot_at for o in others] == [None, None, None, None]


@pytest.mark.postgres_only
async def test_a_sibling_row_another_transaction_holds_is_skipped_and_handed_a_slot_once_it_is_free(
    tmp_path: Path,
) -> None:
    where = harness.database_in(tmp_path)
    async with open_store(where) as store:
        await _sibling_and_slot_holder(store, where)
        slot = {"owner": "alice", "next_check_at": NOW - 0.1, "delay_source": DelaySource.FLEET_PACING}
        await store.create_operation(values("holder-2", **slot), kind="started", at=NOW - 100)
        harness.db_write(
            where,
            f"UPDATE operations SET fleet_slot_at = {NOW - 0.1}, request_sent_at = {NOW - 10} "
            "WHERE operation_id = 'holder-2'",
        )
        with _row_held_by_its_own_check(where, "waiting") as holder:
            with anyio.fail_after(10):  # skipped, never waited for (a wait here would deadlock)
                sent = await check(store, "holder", NOW, fleets=PACED_FLEET, fleet_slots=2)
            skipped = await store.get("waiting")
            tat = holder.execute("SELECT tat FROM fleet_buckets WHERE provider = 'acme'").fetchone()
        # Once the row is free, the next request that leaves hands it the slot.
        again = await check(store, "holder-2", NOW + 0.5, fleets=PACED_FLEET, fleet_slots=2)
        handed = await store.get("waiting")
    assert sent.decision.kind == Verdict.RESERVE
    assert skipped is not None
    assert skipped.fleet_slot_at is None
    assert tat is not None
    # The bookings' clock as the request left it (a clock never used starts at now), not moved on
    # for a slot nobody holds (NOW + 0.5 when the slot is handed).
    assert tat[0] == NOW
    assert again.decision.kind == Verdict.RESERVE
    assert handed is not None
    assert handed.fleet_slot_at is not None


@pytest.mark.postgres_only
async def test_under_fair_shares_a_paced_send_takes_no_more_trips_than_without(tmp_path: Path) -> None:
    # The fair-share reads go in the trip that locks the pace row: none of their own while it is held.
    where = harness.database_in(tmp_path)
    trips: dict[int | None, int] = {}
    async with open_store(where) as store:
        for fleet_slots, at in ((None, NOW), (1, NOW + 10)):  # 10 s apart: the pace has room for each
            name = f"op-{fleet_slots}"
            slot = {"owner": "alice", "next_check_at": at - 0.1, "delay_source": DelaySource.FLEET_PACING}
            await store.create_operation(values(name, **slot), kind="started", at=NOW - 100)
            harness.db_write(
                where, f"UPDATE operations SET fleet_slot_at = {at - 0.1} WHERE operation_id = '{name}'"
            )
            before = store.stats.trips
            sent = await check(store, name, at, fleets=PACED_FLEET, fleet_slots=fleet_slots)
            assert sent.decision.kind == Verdict.RESERVE
            trips[fleet_slots] = store.stats.trips - before
    assert trips[1] == trips[None], trips


async def test_room_is_kept_for_a_held_slot_whose_operations_lease_expired(tmp_path: Path) -> None:
    # Its process died mid-request, and its slot came: the sends' clock keeps room for it, as for any
    # held slot whose agent is on its way (an expired lease is no lease).
    where = harness.database_in(tmp_path)
    async with open_store(where) as store:
        slot = {"next_check_at": NOW - 0.1, "delay_source": DelaySource.FLEET_PACING}
        await store.create_operation(values("late", **slot), kind="started", at=NOW - 100)
        await store.create_operation(values("other"), kind="started", at=NOW - 100)
        harness.db_write(
            where,
            f"UPDATE operations SET fleet_slot_at = {NOW - 0.1}, lease_owner = 'dead-call', "
            f"lease_expires_at = {NOW - 1} WHERE operation_id = 'late'",
        )
        other = await check(store, "other", NOW, fleets=PACED_FLEET)
        late = await check(store, "late", NOW + 0.05, fleets=PACED_FLEET)
    assert other.decision.kind == Verdict.PACED  # the room is the late slot's
    assert late.decision.kind == Verdict.RESERVE


async def test_an_agent_whose_slot_was_moved_is_told_it_earlier_by_its_calls_lag_and_sends_on_time(
    tmp_path: Path,
) -> None:
    # Issue 29: its slot came at NOW - 0.5; the sends' clock has room at NOW + 1 only. Its call came at
    # NOW and was decided 0.3 s later (the database's round trips): it is told NOW + 0.7, and its next
    # call, told so and as slow, is decided at NOW + 1 on the slot it still holds.
    where = harness.database_in(tmp_path)
    async with open_store(where) as store:
        slot = {"next_check_at": NOW - 0.5, "delay_source": DelaySource.FLEET_PACING}
        await store.create_operation(values("slow", **slot), kind="started", at=NOW - 100)
        harness.db_write(where, f"UPDATE operations SET fleet_slot_at = {NOW - 0.5}")
        pace_row = (
            f"INSERT INTO fleet_buckets (provider, tat, sent_tat) VALUES ('acme', {NOW + 1}, {NOW + 1})"
        )
        harness.db_write(where, pace_row)
        moved = await check(store, "slow", NOW, fleets=PACED_FLEET, clock=lambda: NOW + 0.3)
        assert moved.decision.kind == Verdict.PACED
        assert moved.decision.allowed_at == pytest.approx(NOW + 0.7)
        assert moved.record.next_check_at == pytest.approx(NOW + 0.7)
        assert moved.record.fleet_slot_at == NOW - 0.5  # the slot keeps its own time among the bookings
        sent = await check(store, "slow", NOW + 0.7, fleets=PACED_FLEET, clock=lambda: NOW + 1.0)
    assert sent.decision.kind == Verdict.RESERVE
    assert sent.record.status_requests_used == 1


async def test_a_principals_request_in_flight_counts_as_served_when_it_was_reserved(tmp_path: Path) -> None:
    # Issue 29: a request in flight counted as served *now*, so a principal always with one in flight (a
    # provider slow to answer) never came first: on virtual time, with the provider answering in 0.5 s,
    # principals of 15 and 5 operations ended up to 15 % from their halves (the simulation's rule
    # "served-now"). Its reservation is when it was served: alice's, 5 s ago, is older than bob's 2 s.
    where = harness.database_in(tmp_path)
    async with open_store(where) as store:
        in_flight = values("in_flight", owner="alice", next_check_at=NOW - 5)
        await store.create_operation(in_flight, kind="started", at=NOW - 100)
        reserved = await check(store, "in_flight", NOW - 5, fleets=PACED_FLEET, fleet_slots=1)
        await _operation_of(
            store,
            where,
            "alices",
            next_check_at=NOW - 0.5,
            source=DelaySource.LOCAL_BACKOFF,
            sent_at=NOW - 50,
        )
        due = DelaySource.LOCAL_BACKOFF
        await _operation_of(store, where, "bobs", next_check_at=NOW, source=due, sent_at=NOW - 2, owner="bob")
        bobs = await check(store, "bobs", NOW, fleets=PACED_FLEET, fleet_slots=1)
        flying = await store.get("in_flight")
    assert reserved.decision.kind == Verdict.RESERVE
    assert flying is not None
    assert flying.lease_owner is not None  # its answer has not come
    assert flying.request_sent_at == NOW - 5
    assert bobs.decision.kind == Verdict.PACED  # the pace has room, but it is alice's turn


async def _bobs(store: Store, where: DatabaseLocation) -> None:
    """bob's two operations, due, served 60 and 30 s ago (longer ago than alice's 10 s)."""
    for operation_id, sent_at in (("bobs_oldest", NOW - 60), ("bobs_younger", NOW - 30)):
        due = DelaySource.LOCAL_BACKOFF
        await _operation_of(
            store, where, operation_id, next_check_at=NOW - 0.5, source=due, sent_at=sent_at, owner="bob"
        )


async def test_a_request_that_leaves_while_another_principal_comes_first_hands_it_a_slot_before_its_sibling(
    tmp_path: Path,
) -> None:
    # Issue 29: a turn that passed while none of a principal's few operations waited was lost, and the
    # other's slot went on from sibling to sibling (with the provider answering in 0.5 s, principals of
    # 15 and 5 operations up to 23 % from their halves on virtual time). bob was served longer ago than
    # alice: when alice's request leaves, bob's operation waiting longest is handed the next slot first.
    where = harness.database_in(tmp_path)
    async with open_store(where) as store:
        await _sibling_and_slot_holder(store, where)  # alice last served 10 s ago
        await _bobs(store, where)
        sent = await check(store, "holder", NOW, fleets=PACED_FLEET, fleet_slots=1)
        oldest, younger, alices = [await store.get(o) for o in ("bobs_oldest", "bobs_younger", "waiting")]
        bobs_turn = await check(store, "bobs_oldest", NOW + 0.1, fleets=PACED_FLEET, fleet_slots=1)
    assert sent.decision.kind == Verdict.RESERVE
    assert oldest is not None
    assert younger is not None
    assert alices is not None
    assert oldest.fleet_slot_at == NOW  # the next free slot: bob's turn
    assert younger.fleet_slot_at is None  # bob holds his one slot
    assert alices.fleet_slot_at == NOW + 0.5  # then alice's sibling's
    assert bobs_turn.decision.kind == Verdict.PACED  # its slot came; the sends' clock has room at NOW + 0.5
    assert bobs_turn.record.fleet_slot_at == NOW


@pytest.mark.postgres_only
async def test_when_the_principal_that_comes_first_is_skipped_its_slot_is_not_given_to_the_senders_sibling(
    tmp_path: Path,
) -> None:
    # bob's operation is in its own check (its row locked, waiting for the pace row): the hand-off skips
    # it. Handing alice's sibling the slot after it would leave bob's unbooked, and bob's turn lost;
    # nothing is handed, and bob's check, once it reaches the pace row, sends in the room left.
    where = harness.database_in(tmp_path)
    async with open_store(where) as store:
        await _sibling_and_slot_holder(store, where)
        await _bobs(store, where)
        with _row_held_by_its_own_check(where, "bobs_oldest") as bobs_check:
            with anyio.fail_after(10):
                sent = await check(store, "holder", NOW, fleets=PACED_FLEET, fleet_slots=1)
            oldest, alices = [await store.get(o) for o in ("bobs_oldest", "waiting")]
            tat = bobs_check.execute("SELECT tat FROM fleet_buckets WHERE provider = 'acme'").fetchone()
        bobs_turn = await check(store, "bobs_oldest", NOW + 0.5, fleets=PACED_FLEET, fleet_slots=1)
    assert sent.decision.kind == Verdict.RESERVE
    assert oldest is not None
    assert alices is not None
    assert oldest.fleet_slot_at is None  # skipped
    assert alices.fleet_slot_at is None  # and not handed the slot after it
    assert tat is not None
    assert tat[0] == NOW  # the bookings' clock as the request left it
    assert bobs_turn.decision.kind == Verdict.RESERVE
