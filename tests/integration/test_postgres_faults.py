"""PostgreSQL faults: the server stopped mid-run, a lock held past lock_timeout, statement_timeout, read-only.

Each is a clear error for the agent (a tool error that names the problem and
the fix) and for the operator (the CLI's message), nothing is changed, and no
request reaches the provider without a committed reservation. The server
stopped mid-run is a real stop of a throwaway cluster of the test's own (the
shared test server stays up for the tests running beside it), started again at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest
from mcp.client import Client

from harness import error_text, full_delays, make_harness, merge, track, view, write_table
from pg_support import Cluster, with_options
from pollwarden.store import DatabaseLocation
from pollwarden.store.postgres.pace_turn import PaceTurn
from pollwarden.surface.server import build_server, controller_factory
from tests.support.fake_provider import FakeProvider, pending

pytestmark = [pytest.mark.anyio, pytest.mark.postgres_only, pytest.mark.slow]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}
    return subprocess.run(
        [sys.executable, "-m", "pollwarden", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


async def test_the_server_stopped_mid_run_is_a_clear_error_nothing_is_sent_and_checks_resume_when_it_returns(
    tmp_path: Path, fake: FakeProvider, own_postgres_cluster: Cluster
) -> None:
    cluster = own_postgres_cluster
    fake.script("down", [pending("running"), pending("running")])
    h = make_harness(tmp_path, fake)
    h.database_override = DatabaseLocation.postgres(cluster.url())
    async with h.client() as client:
        await track(client, "down")
        h.clock.advance(10)  # the first check is allowed
        cluster.stop()
        try:
            refused = await client.call_tool("check_status", {"operation_id": "op-down"})
            operator = _cli("approvals", "list", "--db", h.database.dsn)
        finally:
            cluster.start()  # waits until it accepts connections
        text = error_text(refused)
        assert f"cannot use PostgreSQL at postgresql://postgres@127.0.0.1:{cluster.port}/" in text
        assert "nothing was sent to the provider without a committed reservation" in text
        assert fake.status_requests("down") == []
        assert operator.returncode != 0
        assert "cannot use PostgreSQL" in operator.stderr
        assert "Traceback" not in operator.stderr
        # Back up: the next check reconnects and polls once; the refused one counted nothing.
        after = view(await client.call_tool("check_status", {"operation_id": "op-down"}))
        assert after["outcome"] == "polled"
        assert after["status_requests_used"] == 1
    assert len(fake.status_requests("down")) == 1


async def test_an_answer_that_arrives_while_the_server_is_down_is_recorded_when_it_returns_never_sent_twice(
    tmp_path: Path, fake: FakeProvider, own_postgres_cluster: Cluster
) -> None:
    cluster = own_postgres_cluster
    fake.script("blip", [pending("running"), pending("running")])
    h = make_harness(tmp_path, fake)
    h.database_override = DatabaseLocation.postgres(cluster.url())
    write_table(h.tables_dir, h.table)
    armed = [False]

    def stop_after_the_answer(step: str) -> None:
        if step == "after_response" and armed[0]:
            armed[0] = False
            cluster.stop()  # the request was sent and answered; the database goes away before it is recorded

    factory = controller_factory(
        h.config(), clock=h.clock, rng=h.rng, environ=h.environ, on_boundary=stop_after_the_answer
    )
    async with Client(build_server(factory)) as client:
        await track(client, "blip")
        h.clock.advance(10)
        armed[0] = True
        try:
            told = await client.call_tool("check_status", {"operation_id": "op-blip"})
        finally:
            cluster.start()
        text = error_text(told)
        assert "the status request for 'op-blip' was sent and the provider answered" in text
        assert "records it when the database returns" in text
        assert "nothing was sent" not in text
        assert len(fake.status_requests("blip")) == 1
        # Back: the held answer is recorded (here by the next check, or already by the retry), not sent again.
        after = view(await client.call_tool("check_status", {"operation_id": "op-blip"}))
        assert after["outcome"] == "not_yet"
        assert after["state"] == "running"
        assert after["status_requests_used"] == 1
        assert after["retry_after_seconds"] > 0
        assert len(fake.status_requests("blip")) == 1
        # The lease was released with the answer: the next allowed check sends at once, no 30 s wait.
        h.clock.advance(after["retry_after_seconds"])
        again = view(await client.call_tool("check_status", {"operation_id": "op-blip"}))
        assert (again["outcome"], again["status_requests_used"]) == ("polled", 2)
    assert len(fake.status_requests("blip")) == 2


async def test_a_row_locked_past_lock_timeout_is_a_clear_error_and_changes_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("locked", [pending("running")])
    h = make_harness(tmp_path, fake)
    h.busy_timeout_seconds = 0.3
    async with h.client() as client:
        await track(client, "locked")
        h.clock.advance(10)
        with psycopg.connect(h.database.dsn) as holder:  # another session holds the operation's row
            holder.execute("SELECT 1 FROM operations WHERE operation_id = 'op-locked' FOR UPDATE")
            refused = await client.call_tool("check_status", {"operation_id": "op-locked"})
            before = view(await client.call_tool("get_operation", {"operation_id": "op-locked"}))
        text = error_text(refused)
        assert "an operation's row (operations) stayed locked by session " in text
        assert "for more than 0.3 s (lock_timeout)" in text
        assert "nothing was changed and no request was sent" in text
        assert before["status_requests_used"] == 0
        assert fake.status_requests("locked") == []
        assert (
            view(await client.call_tool("check_status", {"operation_id": "op-locked"}))["outcome"] == "polled"
        )


async def test_a_held_pace_row_costs_only_its_own_provider_and_the_error_names_the_row_and_its_holder(
    tmp_path: Path, fake: FakeProvider
) -> None:
    paced = [f"paced-{i:02d}" for i in range(12)]  # more checks than the pool has connections
    for job in [*paced, "free"]:
        fake.script(job, [pending("running")])
    h = make_harness(tmp_path, fake, table={"fleet": {"max_requests_per_second": 100, "burst": 100}})
    h.busy_timeout_seconds = 2.0
    write_table(h.tables_dir, merge(h.table, {"name": "other", "fleet": None}))
    done: list[str] = []
    errors: dict[str, str] = {}
    async with h.client() as client:
        for job in paced:
            await track(client, job)
        await client.call_tool(
            "start_operation", {"provider": "other", "operation_id": "op-free", "provider_job_id": "free"}
        )
        h.clock.advance(10)
        with psycopg.connect(h.database.dsn, application_name="holder") as holder:
            holder.execute("INSERT INTO fleet_buckets (provider) VALUES ('acme') ON CONFLICT DO NOTHING")
            holder.commit()
            holder.execute("SELECT 1 FROM fleet_buckets WHERE provider = 'acme' FOR UPDATE")
            pid = holder.info.backend_pid

            async def check(op: str) -> None:
                result = await client.call_tool("check_status", {"operation_id": op})
                if result.is_error:
                    errors[op] = error_text(result)
                done.append(op)

            async with anyio.create_task_group() as tg:
                for job in paced:
                    tg.start_soon(check, f"op-{job}")
                await anyio.lowlevel.checkpoint()
                tg.start_soon(check, "op-free")
    # The other provider's check went out while every acme check was still waiting for the row.
    assert done[0] == "op-free"
    assert "op-free" not in errors
    assert len(fake.status_requests("free")) == 1
    assert sorted(errors) == sorted(f"op-{job}" for job in paced)
    for text in errors.values():
        assert ("pace row" in text and "'acme'" in text) or "pace row (fleet_buckets)" in text, text
        assert "nothing was changed and no request was sent" in text
        assert "check that the server is up" not in text
    named = [t for t in errors.values() if f"session {pid} (application 'holder'" in t]
    assert named, next(iter(errors.values()))
    assert all(fake.status_requests(job) == [] for job in paced)


async def test_a_check_before_its_own_booked_slot_is_told_the_slot_without_waiting_for_a_held_pace_row(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # Issue 29: each paced check holds the pace row a round trip; one that is only told its own slot
    # takes neither the row's lock nor this process's turn at it.
    for job in ("a", "b", "c"):
        fake.script(job, [pending("running"), pending("running")])
    table = {
        "fleet": {"max_requests_per_second": 1, "burst": 1},
        "schedule": {"base_delay_seconds": 0.5, "max_delay_seconds": 8},
    }
    h = make_harness(tmp_path, fake, table=table, rng=full_delays())
    h.busy_timeout_seconds = 0.5
    async with h.client() as client:
        for job in ("a", "b", "c"):
            await track(client, job)
        h.clock.advance(0.5)  # every first check due at once: a sends, b and c book the next slots
        assert view(await client.call_tool("check_status", {"operation_id": "op-a"}))["outcome"] == "polled"
        for job in ("b", "c"):
            assert view(await client.call_tool("check_status", {"operation_id": f"op-{job}"}))["outcome"] == (
                "not_yet"
            )
        h.clock.advance(1.0)  # b's slot: it sends while c's slot is still booked, so it books the next
        sent = view(await client.call_tool("check_status", {"operation_id": "op-b"}))
        assert sent["outcome"] == "polled"
        h.clock.advance(sent["retry_after_seconds"])  # its schedule's next check, before that slot
        with psycopg.connect(h.database.dsn, application_name="holder") as holder:
            holder.execute("SELECT 1 FROM fleet_buckets WHERE provider = 'acme' FOR UPDATE")
            told = await client.call_tool("check_status", {"operation_id": "op-b"})
            assert not told.is_error, error_text(told)
            result = view(told)
            # c, whose slot came, needs the pace row: it waits for it and is told so.
            refused = await client.call_tool("check_status", {"operation_id": "op-c"})
    assert result["outcome"] == "not_yet"
    assert result["delay_source"] == "fleet_pacing"
    assert result["retry_after_seconds"] > 0
    assert refused.is_error
    assert "pace row" in error_text(refused)
    assert len(fake.status_requests("b")) == 1
    assert fake.status_requests("c") == []


def _paced_controller(tmp_path: Path, fake: FakeProvider, job: str) -> tuple[Any, Any]:
    """A harness whose acme has a [fleet] pace and a 1 s lock_timeout (long enough that a loaded
    machine never times a wait out before its turn goes by), and its controller factory."""
    fake.script(job, [pending("running")])
    h = make_harness(tmp_path, fake, table={"fleet": {"max_requests_per_second": 5, "burst": 3}})
    h.busy_timeout_seconds = 1.0
    h.server()  # writes the provider table the factory loads
    return h, controller_factory(h.config(), clock=h.clock, rng=h.rng)


def _acme_turn(controller: Any) -> PaceTurn:
    """This process's turn at acme's pace row (`PostgresBase._pace_turns`)."""
    turns = controller.store._pace_turns  # pyright: ignore[reportPrivateUsage]
    return turns.setdefault("acme", PaceTurn())


async def _hold(turn: PaceTurn, release: anyio.Event) -> None:
    """Another check of this process, in its turn at the pace row until `release`."""
    async with turn.take(10):
        await release.wait()


async def _busy_turn_answers(
    controller: Any, operation_id: str, *, then_again: bool = True
) -> list[dict[str, Any]]:
    """check_status while this process's turn at acme's pace row is busy: one turn goes by while the
    check waits, the next holds it past lock_timeout; with `then_again`, a second call before the
    turn is free. The answers, in order."""
    turn = _acme_turn(controller)
    first, second = anyio.Event(), anyio.Event()
    told: list[dict[str, Any]] = []

    async def check() -> None:
        told.append((await controller.check_status(operation_id)).model_dump())

    async with anyio.create_task_group() as tg:
        tg.start_soon(_hold, turn, first)
        await anyio.lowlevel.checkpoint()
        tg.start_soon(_hold, turn, second)
        while turn.waiting < 1:
            await anyio.lowlevel.checkpoint()
        tg.start_soon(check)
        while turn.waiting < 2:
            await anyio.lowlevel.checkpoint()
        first.set()
        while not told:
            await anyio.lowlevel.checkpoint()
        if then_again:
            await check()
        second.set()
    return told


async def test_a_check_that_cannot_get_its_turn_at_a_busy_pace_row_is_told_when_to_come_back_not_an_error(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # Issue 29: 400 ms from the database a process's paced checks came faster than each could hold
    # the pace row for its round trip; one that waited past lock_timeout while turns went by failed
    # ("stayed locked ... another check of this server was still waiting"). It is told when to come back.
    h, factory = _paced_controller(tmp_path, fake, "busy")
    async with factory() as controller:
        await controller.start_operation(provider="acme", operation_id="op-busy", provider_job_id="busy")
        h.clock.advance(10)
        # What it is told is written: a call before that time is held by the gate, at once, without
        # queueing for the turn that is still taken (review of issue 29).
        busy, early = await _busy_turn_answers(controller, "op-busy")
        assert (early["outcome"], early["delay_source"]) == ("not_yet", "fleet_pacing")
        assert early["retry_after_seconds"] == busy["retry_after_seconds"]
        assert busy["outcome"] == "not_yet"
        assert busy["delay_source"] == "fleet_pacing"
        assert 0 < busy["retry_after_seconds"] <= 1.0
        assert busy["status_requests_used"] == 0
        assert fake.status_requests("busy") == []
        h.clock.advance(busy["retry_after_seconds"])
        again = (await controller.check_status("op-busy")).model_dump()
        assert (again["outcome"], again["status_requests_used"]) == ("polled", 1)
    assert len(fake.status_requests("busy")) == 1


async def test_a_busy_turns_answer_never_waits_for_its_operations_row(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # Second review of issue 29: the answer's write waited for the operation's row, which another
    # server's check of the same operation may hold while it waits for the same pace row; that ended
    # in the lock_timeout error after all. Held, the row is left as it is and the agent only told.
    h, factory = _paced_controller(tmp_path, fake, "held")
    async with factory() as controller:
        await controller.start_operation(provider="acme", operation_id="op-held", provider_job_id="held")
        h.clock.advance(10)
        with psycopg.connect(h.database.dsn) as holder:
            holder.execute("SELECT 1 FROM operations WHERE operation_id = 'op-held' FOR UPDATE")
            [told] = await _busy_turn_answers(controller, "op-held", then_again=False)
        seen = (await controller.get_operation("op-held")).model_dump()
    assert (told["outcome"], told["delay_source"]) == ("not_yet", "fleet_pacing")
    assert told["retry_after_seconds"] > 0
    assert seen["delay_source"] != "fleet_pacing"  # not written
    assert fake.status_requests("held") == []


async def test_a_check_that_stops_takes_no_turn_at_the_pace_row(tmp_path: Path, fake: FakeProvider) -> None:
    # Review of issue 29: every check of a paced provider waited for its process's turn at the pace
    # row, so a stop (its budget used) was kept behind reservations, or answered as paced.
    h, factory = _paced_controller(tmp_path, fake, "spent")
    async with factory() as controller:
        await controller.start_operation(provider="acme", operation_id="op-spent", provider_job_id="spent")
        with psycopg.connect(h.database.dsn, autocommit=True) as db:
            db.execute("UPDATE operations SET status_requests_used = max_status_requests")
        h.clock.advance(10)
        release = anyio.Event()
        seen: list[dict[str, Any]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(_hold, _acme_turn(controller), release)  # a reservation, in its turn
            await anyio.lowlevel.checkpoint()
            seen.append((await controller.check_status("op-spent")).model_dump())
            release.set()
    [stopped] = seen
    assert (stopped["outcome"], stopped["stop_reason"]) == ("stopped", "request_budget_exhausted")
    assert fake.status_requests("spent") == []


async def test_a_statement_cancelled_by_statement_timeout_is_a_clear_error_and_changes_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("slow", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "slow")  # the schema exists
    h.database_override = DatabaseLocation.postgres(with_options(h.database.dsn, "statement_timeout=200"))
    async with h.client() as client:
        h.clock.advance(10)
        with psycopg.connect(h.database.dsn) as holder:
            holder.execute("SELECT 1 FROM operations WHERE operation_id = 'op-slow' FOR UPDATE")
            refused = await client.call_tool("check_status", {"operation_id": "op-slow"})
        text = error_text(refused)
        assert "cancelled a statement (statement_timeout" in text
        assert "nothing was changed and no request was sent" in text
        assert fake.status_requests("slow") == []
        assert (
            view(await client.call_tool("check_status", {"operation_id": "op-slow"}))["outcome"] == "polled"
        )


async def test_a_read_only_session_serves_reads_and_refuses_every_write_with_the_fix(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("ro", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "ro")
    h.database_override = DatabaseLocation.postgres(
        with_options(h.database.dsn, "default_transaction_read_only=on")
    )
    async with h.client() as client:
        h.clock.advance(10)
        refused = await client.call_tool("check_status", {"operation_id": "op-ro"})
        text = error_text(refused)
        assert "runs this session read-only" in text
        assert "point --db at the primary" in text
        read = view(await client.call_tool("get_operation", {"operation_id": "op-ro"}))
        assert read["status_requests_used"] == 0
    assert fake.status_requests("ro") == []
