"""One job, one budget: a new operation_id never buys a job more status requests (issue 12, item 1).

Found by trying it as an agent would: after a budget of 2 was spent and the
operation escalated, three start_operation calls with new ids on the same job
sent 18 more status requests with nobody asked. The job is (provider table,
account context, provider job id); at most one operation holds it, in any
status, also when two processes start it at once, also when a submission's
answer names a job another operation tracks, and in files written before the rule.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from harness import Harness, check, database_in, db_rows, db_write, error_text, make_harness, track, view
from pollwarden.audit.chain import read_rows
from pollwarden.store import open_store
from pollwarden.store.migrations.sqlite import MIGRATIONS, split_sql
from tests.support.fake_provider import FakeProvider, failed, http, pending, succeeded
from tests.support.live import stdio_server, write_table

pytestmark = pytest.mark.anyio

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]


async def start_as(client: Any, operation_id: str, job_id: str, **extra: Any) -> dict[str, Any]:
    args = {"provider": "acme", "operation_id": operation_id, "provider_job_id": job_id, **extra}
    return view(await client.call_tool("start_operation", args))


@pytest.mark.parametrize("era", ERAS)
async def test_new_operation_ids_after_the_budget_escalated_get_the_same_operation_and_send_nothing(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("exp", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client(**era) as client:
        await track(client, "exp", max_status_requests=2)
        await check(client, "exp", wait=30)
        stopped = await check(client, "exp", wait=30)
        assert (stopped["status"], stopped["stop_reason"]) == ("escalated", "request_budget_exhausted")
        for attempt in range(3):
            h.clock.advance(600)
            again = await start_as(client, f"retry-{attempt}", "exp", max_status_requests=12)
            # The existing operation, with its budget, its stop and what may be done: nothing new.
            assert again["operation_id"] == "op-exp"
            assert again["requested_operation_id"] == f"retry-{attempt}"
            assert (again["status"], again["stop_reason"]) == ("escalated", "request_budget_exhausted")
            assert (again["status_requests_used"], again["max_status_requests"]) == (2, 2)
            assert again["deadline_at"] == stopped["deadline_at"]
            assert again["allowed_actions"] == ["request_extension"]
            assert again["escalation"]["reason"] == "request_budget_exhausted"
            assert "already tracked as operation op-exp" in again["message"]
            assert "no new budget or deadline" in again["message"]
            refused = await client.call_tool(
                "check_status", {"operation_id": f"retry-{attempt}", "wait_seconds": 30}
            )
            assert "no operation 'retry-" in error_text(refused)
            listed = view(await client.call_tool("list_operations", {}))
            assert [o["operation_id"] for o in listed["operations"]] == ["op-exp"]
    assert len(fake.status_requests("exp")) == 2
    assert read_rows(h.db_path, "retry-0") == []


async def test_a_waiting_job_started_again_under_a_new_id_keeps_its_one_budget_and_deadline(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("w", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        first = await track(client, "w", max_status_requests=3, deadline_seconds=600)
        h.clock.advance(100)
        second = await start_as(client, "w-again", "w", max_status_requests=10, deadline_seconds=3600)
        assert second["operation_id"] == "op-w"
        assert (second["status"], second["max_status_requests"]) == ("waiting", 3)
        assert second["deadline_at"] == first["deadline_at"]
        assert second["allowed_actions"] == ["check_status"]
        # Checking through every id the agent knows still spends the one budget of 3.
        for _ in range(6):
            await check(client, "w", wait=30)
        final = await check(client, "w")
        assert (final["stop_reason"], final["status_requests_used"]) == ("request_budget_exhausted", 3)
    assert len(fake.status_requests("w")) == 3


@pytest.mark.parametrize(
    ("steps", "status", "reason", "allowed"),
    [
        pytest.param([succeeded()], "succeeded", "succeeded", ["fetch_result"], id="succeeded"),
        pytest.param([failed("disk full")], "failed", "provider_failure", [], id="failed"),
        pytest.param([pending("cancelled")], "cancelled", "cancelled", [], id="cancelled"),
        pytest.param([http(403)], "escalated", "authorization_denied", [], id="refused"),
    ],
)
async def test_a_job_that_ended_or_stopped_is_answered_with_its_operation_whatever_the_new_id(
    tmp_path: Path, fake: FakeProvider, steps: list[Any], status: str, reason: str, allowed: list[str]
) -> None:
    fake.script("e", [*steps, pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "e")
        await check(client, "e", wait=30)
        again = await start_as(client, "e-new", "e")
        assert (again["operation_id"], again["requested_operation_id"]) == ("op-e", "e-new")
        assert (again["status"], again["stop_reason"], again["allowed_actions"]) == (status, reason, allowed)
        # Without an operation_id too: a generated id is a new id.
        anonymous = view(
            await client.call_tool("start_operation", {"provider": "acme", "provider_job_id": "e"})
        )
        assert anonymous["operation_id"] == "op-e"
    assert len(fake.status_requests("e")) == 1


async def test_the_same_job_id_on_another_provider_table_is_another_job(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("shared", [pending("running")])
    h = make_harness(tmp_path, fake)
    write_table(h.tables_dir, dict(h.table, name="acme-eu"))
    async with h.client() as client:
        await track(client, "shared")
        elsewhere = view(
            await client.call_tool(
                "start_operation", {"provider": "acme-eu", "operation_id": "eu", "provider_job_id": "shared"}
            )
        )
        assert (elsewhere["operation_id"], elsewhere["requested_operation_id"]) == ("eu", None)


def _values(operation_id: str, job_id: str) -> dict[str, object]:
    return {
        "operation_id": operation_id,
        "provider": "acme",
        "provider_job_id": job_id,
        "account_context": "https://api.acme.example as anonymous",
        "request_fingerprint": f"fp-{job_id}",
        "idempotency_key": None,
        "expected_terminal_state": "succeeded",
        "status": "waiting",
        "started_at": 1000.0,
        "deadline_at": 3400.0,
        "business_deadline_at": None,
        "max_status_requests": 12,
        "max_transport_failures": 3,
        "max_rate_limited": 3,
        "next_check_at": 1005.0,
        "delay_source": "local_backoff",
        "submit_payload_json": None,
        "created_at": 1000.0,
        "updated_at": 1000.0,
    }


async def race_two_connections(
    db: Any, values_of: Callable[[str, int], dict[str, object]], *, rounds: int, kind: str
) -> None:
    """Two store connections create operations `a-i` and `b-i` at once, `rounds` times: one is created each time.

    `values_of(operation_id, i)` gives the columns; both of a round name one job (or one payload).
    """

    async def start(results: dict[str, tuple[str, bool]], store: Any, operation_id: str, i: int) -> None:
        record, created = await store.create_operation(values_of(operation_id, i), kind=kind, at=1000.0)
        results[operation_id] = (record.operation_id, created)

    async with open_store(db) as a, open_store(db) as b:
        for i in range(rounds):
            results: dict[str, tuple[str, bool]] = {}
            async with anyio.create_task_group() as tg:
                tg.start_soon(start, results, a, f"a-{i}", i)
                tg.start_soon(start, results, b, f"b-{i}", i)
            winners = [op for op, (_, created) in results.items() if created]
            assert len(winners) == 1, results
            assert {held for held, _ in results.values()} == set(winners)


async def race_two_servers(h: Harness, arguments: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Two `pollwarden serve` processes call start_operation at once (`from-one`, `from-two`); the one answer.

    Both are answered with one operation; the loser's answer names the id it asked for.
    """
    h.server()  # writes the table
    answers: dict[str, dict[str, Any]] = {}
    async with (
        stdio_server(h.db_path, h.tables_dir, errlog=h.tmp / "one.log") as one,
        stdio_server(h.db_path, h.tables_dir, errlog=h.tmp / "two.log") as two,
    ):

        async def start(client: Any, operation_id: str) -> None:
            answers[operation_id] = view(await client.call_tool("start_operation", arguments(operation_id)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(start, one, "from-one")
            tg.start_soon(start, two, "from-two")
    held = {a["operation_id"] for a in answers.values()}
    assert len(held) == 1
    [holder] = held
    loser = "from-two" if holder == "from-one" else "from-one"
    assert answers[loser]["requested_operation_id"] == loser
    assert db_rows(h.db_path, "SELECT operation_id FROM operations") == [{"operation_id": holder}]
    return answers[holder]


@pytest.mark.both_engines
async def test_two_connections_starting_one_job_under_different_ids_at_once_make_one_operation(
    tmp_path: Path,
) -> None:
    db = database_in(tmp_path)
    jobs = 40
    await race_two_connections(db, lambda op, i: _values(op, f"job-{i}"), rounds=jobs, kind="tracking")
    per_job = db_rows(db, "SELECT provider_job_id, count(*) AS n FROM operations GROUP BY provider_job_id")
    assert len(per_job) == jobs
    assert {row["n"] for row in per_job} == {1}
    [tracking] = db_rows(db, "SELECT count(*) AS n FROM audit WHERE kind = 'tracking'")
    assert tracking["n"] == jobs


@pytest.mark.slow
async def test_two_server_processes_starting_one_job_at_once_make_one_operation(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("proc", [pending("running")])
    h = make_harness(tmp_path, fake)
    await race_two_servers(h, lambda op: {"provider": "acme", "operation_id": op, "provider_job_id": "proc"})


async def test_a_submission_answered_with_a_job_another_operation_tracks_adopts_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("known", [pending("running")])
    fake.script_submit([http(202, body={"id": "known", "state": "queued"})])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "known", max_status_requests=2)
        answer = view(
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "sub", "submit": {"report": "x"}}
            )
        )
        assert (answer["operation_id"], answer["requested_operation_id"]) == ("op-known", "sub")
        assert (answer["status"], answer["max_status_requests"]) == ("waiting", 2)
        dup = view(await client.call_tool("get_operation", {"operation_id": "sub"}))
        assert (dup["status"], dup["stop_reason"], dup["duplicate_of"]) == (
            "escalated",
            "job_already_tracked",
            "op-known",
        )
        assert dup["provider_job_id"] == "known"
        assert dup["allowed_actions"] == []
        assert "tracked as operation op-known" in dup["message"]
        refused = view(await client.call_tool("check_status", {"operation_id": "sub", "wait_seconds": 30}))
        assert refused["outcome"] == "stopped"
        # Calling it again (same id) answers with the holder again and sends nothing.
        again = view(
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "sub", "submit": {"report": "x"}}
            )
        )
        assert again["operation_id"] == "op-known"
    assert len(fake.status_requests("known")) == 0
    assert [e["route"] for e in fake.log()].count("submit") == 1
    [stop] = [r for r in read_rows(h.db_path, "sub") if r.kind == "stopped"]
    assert stop.payload_obj["stop_reason"] == "job_already_tracked"


def test_the_database_refuses_a_second_operation_for_one_job(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    anyio.run(_fresh, db)
    columns = ", ".join(_values("x", "j"))
    marks = ", ".join("?" for _ in _values("x", "j"))
    with sqlite3.connect(db) as conn:
        conn.execute(
            f"INSERT INTO operations ({columns}) VALUES ({marks})", tuple(_values("first", "j").values())
        )
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            conn.execute(
                f"INSERT INTO operations ({columns}) VALUES ({marks})", tuple(_values("second", "j").values())
            )
        plan = " ".join(
            str(row[-1])
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT * FROM operations WHERE provider = 'acme' AND account_context = 'a' "
                "AND provider_job_id = 'j' AND duplicate_of IS NULL"
            )
        )
        assert "operations_one_per_job" in plan


async def _fresh(db: Path) -> None:
    async with open_store(db):
        pass


def _file_at_schema_5_with_duplicates(db: Path) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        for step in MIGRATIONS[:5]:
            for statement in split_sql(step.script):
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 5")
        columns = ", ".join(_values("x", "j"))
        marks = ", ".join("?" for _ in _values("x", "j"))
        for operation_id, created_at, status in (
            ("b-later", 1002.0, "waiting"),
            ("a-first", 1001.0, "escalated"),
            ("c-last", 1003.0, "waiting"),
        ):
            values = _values(operation_id, "dup-job")
            values.update(created_at=created_at, status=status)
            conn.execute(f"INSERT INTO operations ({columns}) VALUES ({marks})", tuple(values.values()))
        conn.execute(
            f"INSERT INTO operations ({columns}) VALUES ({marks})", tuple(_values("alone", "solo").values())
        )
    finally:
        conn.close()


async def test_a_file_holding_several_operations_for_one_job_keeps_them_and_the_earliest_keeps_the_job(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    _file_at_schema_5_with_duplicates(db)
    async with open_store(db) as store:
        first = await store.get("a-first")
        later = await store.get("b-later")
        last = await store.get("c-last")
        alone = await store.get("alone")
        assert first is not None
        assert later is not None
        assert last is not None
        assert alone is not None
        assert (first.duplicate_of, later.duplicate_of, last.duplicate_of, alone.duplicate_of) == (
            None,
            "a-first",
            "a-first",
            None,
        )
        # A new start of the job is answered with the earliest operation.
        held, created = await store.create_operation(_values("d-new", "dup-job"), kind="tracking", at=2000.0)
        assert (held.operation_id, created) == ("a-first", False)


@pytest.mark.sqlite_only  # a file an older release wrote
async def test_an_older_duplicate_still_waiting_stops_at_its_next_check_and_sends_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("dup-job", [pending("running")])
    h = make_harness(tmp_path, fake)
    h.tmp.mkdir(exist_ok=True)
    _file_at_schema_5_with_duplicates(h.db_path)
    with sqlite3.connect(h.db_path) as conn:  # the old rows, on this harness's table and clock
        account = f"{fake.base_url} as anonymous"
        conn.execute(
            "UPDATE operations SET account_context = ?, started_at = ?, deadline_at = ?, next_check_at = ?",
            (account, h.clock.now(), h.clock.now() + 2400, h.clock.now()),
        )
    async with h.client() as client:
        stopped = view(
            await client.call_tool("check_status", {"operation_id": "b-later", "wait_seconds": 30})
        )
        assert (stopped["outcome"], stopped["stop_reason"], stopped["duplicate_of"]) == (
            "stopped",
            "job_already_tracked",
            "a-first",
        )
        assert stopped["status_requests_used"] == 0
        assert "a-first" in stopped["stop_detail"]
    assert fake.status_requests("dup-job") == []


REVIEWED: dict[str, Any] = {
    "states": {"pending": ["queued", "running"], "awaiting_review": ["needs_approval"]},
    "awaiting_review": {"where": "https://console.acme.example/jobs/{job_id} (Approve)"},
}


async def test_a_job_waiting_for_a_person_is_answered_with_where_to_act_and_no_new_budget(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("rev", [pending("needs_approval"), pending("running")])
    h = make_harness(tmp_path, fake, table=REVIEWED)
    async with h.client() as client:
        await track(client, "rev")
        await check(client, "rev", wait=30)
        again = await start_as(client, "rev-again", "rev")
    assert (again["operation_id"], again["stop_reason"]) == ("op-rev", "awaiting_review")
    assert again["person_must_act_at"] == "https://console.acme.example/jobs/rev (Approve)"
    assert again["allowed_actions"] == ["request_extension"]
    assert "Do not poll again" in again["message"]
    assert len(fake.status_requests("rev")) == 1


async def test_job_ids_are_compared_in_the_tables_canonical_form_so_one_job_written_three_ways_has_one_budget(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # Issue 30: the table declares its job id an integer and its letters case-insensitive.
    fake.script("run-42", [pending("running")])
    h = make_harness(tmp_path, fake, table={"job_id": {"case_insensitive": ["job_id"]}})
    async with h.client() as client:
        first = await start_as(client, "one", "run-42", max_status_requests=2)
        assert first["provider_job_id"] == "run-42"
        for name, written in (("two", "Run-42"), ("three", "RUN-42")):
            again = await start_as(client, name, written, max_status_requests=10)
            assert (again["operation_id"], again["requested_operation_id"]) == ("one", name)
            assert again["max_status_requests"] == 2
        polled = view(await client.call_tool("check_status", {"operation_id": "one", "wait_seconds": 30}))
        assert polled["outcome"] == "polled"
    assert len(fake.status_requests("run-42")) == 1
    assert [r["operation_id"] for r in db_rows(h.db_path, "SELECT operation_id FROM operations")] == ["one"]


async def test_a_duplicate_marked_across_principals_stops_without_naming_the_other_principals_operation(
    tmp_path: Path, fake: FakeProvider
) -> None:
    from functools import partial

    from pollwarden.access.ownership import renamed, stored_id
    from pollwarden.access.principals import Principal
    from pollwarden.surface.server import controller_factory

    alice, bob = Principal("alice", authenticated=True), Principal("bob", authenticated=True)
    fake.script("shared-old", [pending("running")])
    fake.script("bobs-old", [pending("running")])
    h = make_harness(tmp_path, fake)
    write_table(h.tables_dir, h.table)
    factory = controller_factory(h.config(), clock=h.clock, rng=h.rng, environ=h.environ)
    async with factory() as controller:
        for principal, name, job in ((alice, "held-here", "shared-old"), (bob, "his", "bobs-old")):
            await controller.start_operation(
                provider="acme",
                operation_id=name,
                provider_job_id=job,
                owner=principal.name,
                stored_id=partial(stored_id, principal),
            )
        # What schema step 14 did to a database where two principals tracked one job: the later one is
        # marked duplicate_of the earliest, whoever owns it.
        db_write(
            h.database,
            "UPDATE operations SET duplicate_of = ?, provider_job_id = ?, next_check_at = ? WHERE operation_id = ?",
            "@alice/held-here",
            "shared-old",
            h.clock.now(),
            "@bob/his",
        )
        stopped = renamed(await controller.check_status("@bob/his", wait_seconds=30), bob)
        shown = renamed(await controller.get_operation("@bob/his"), bob)
    for seen in (stopped, shown):
        assert (seen.stop_reason, seen.duplicate_of) == ("job_already_tracked", None)
        text = seen.model_dump_json()
        assert "alice" not in text
        assert "held-here" not in text
        assert "under another principal" in (seen.stop_detail or "")
        assert "under another principal" in seen.message
    assert fake.status_requests("shared-old") == []
    rows = db_rows(h.database, "SELECT duplicate_of FROM operations WHERE operation_id = ?", "@bob/his")
    assert rows == [{"duplicate_of": "@alice/held-here"}]  # an operator still reads it in the store
