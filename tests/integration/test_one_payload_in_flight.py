"""One payload in flight is one job: a new operation_id never submits it a second time (issue 12, items 1-2).

Found by trying it as an agent would: the same `submit` payload, while its
first operation was still waiting, started again under a new `operation_id`,
sent a second submission and created a second job with a budget of its own.
Now the call is answered with the operation in flight (its id, status and
allowed actions; `requested_operation_id` names the id asked for) and nothing
is created or sent, also while it is still being submitted, while it is a
resubmission held for a person, and when two processes submit it at once.
Once the operation ended the rules of a resubmission apply as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import database_in, db_rows, error_text, make_harness, view
from pollwarden.audit.chain import read_rows
from tests.integration.test_one_job_one_budget import _values as job_values
from tests.integration.test_one_job_one_budget import race_two_connections, race_two_servers
from tests.integration.test_resubmission import Person, submissions
from tests.support.fake_provider import FakeProvider, failed, http, pending, succeeded

pytestmark = pytest.mark.anyio

PAYLOAD = {"report": "q4", "format": "csv"}


def submit(operation_id: str | None) -> dict[str, Any]:
    args: dict[str, Any] = {"provider": "acme", "submit": PAYLOAD}
    if operation_id is not None:
        args["operation_id"] = operation_id
    return args


async def test_the_same_payload_in_flight_under_a_new_operation_id_is_answered_with_its_operation(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_new_jobs([pending("running"), succeeded()])
    person = Person("accept", {"decision": "resubmit"})
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=person) as client:
        first = view(await client.call_tool("start_operation", submit("op-first")))
        assert (first["status"], first["provider_job_id"]) == ("waiting", "job_0001")
        other = view(await client.call_tool("start_operation", submit("op-other")))
        assert (other["operation_id"], other["requested_operation_id"]) == ("op-first", "op-other")
        assert (other["status"], other["provider_job_id"]) == ("waiting", "job_0001")
        assert other["max_status_requests"] == first["max_status_requests"]
        assert other["message"].startswith(
            "This payload is already in flight as operation op-first (waiting); no operation op-other was "
            "created and nothing was sent"
        )
        assert "Use operation_id op-first" in other["message"]
        assert other["allowed_actions"] == first["allowed_actions"]
        # Without an operation_id, the same answer.
        unnamed = view(await client.call_tool("start_operation", submit(None)))
        assert unnamed["operation_id"] == "op-first"
        missing = await client.call_tool("get_operation", {"operation_id": "op-other"})
        assert "no operation" in error_text(missing)
        assert submissions(fake) == 1
        assert person.questions == []

        # Once it succeeded, the same payload is a new job again (no person needed after a success).
        polled = view(
            await client.call_tool("check_status", {"operation_id": "op-first", "wait_seconds": 30})
        )
        assert (polled["outcome"], polled["status"]) == ("polled", "waiting")
        done = view(await client.call_tool("check_status", {"operation_id": "op-first", "wait_seconds": 30}))
        assert done["status"] == "succeeded"
        after = view(await client.call_tool("start_operation", submit("op-after")))
        assert (after["operation_id"], after["requested_operation_id"], after["provider_job_id"]) == (
            "op-after",
            None,
            "job_0002",
        )
    assert submissions(fake) == 2
    assert person.questions == []
    assert db_rows(h.db_path, "SELECT operation_id FROM operations ORDER BY created_at, operation_id") == [
        {"operation_id": "op-first"},
        {"operation_id": "op-after"},
    ]
    assert read_rows(h.db_path, "op-other") == []


async def test_a_payload_still_being_submitted_is_answered_with_its_operation_and_not_sent_again(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_submit([http(503, headers={"Retry-After": "20"})])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        first = view(await client.call_tool("start_operation", submit("op-a")))
        assert (first["status"], first["provider_job_id"]) == ("submitting", None)
        h.clock.advance(30)  # the retry time has come: a call under op-a would send it again
        other = view(await client.call_tool("start_operation", submit("op-b")))
        assert (other["operation_id"], other["requested_operation_id"], other["status"]) == (
            "op-a",
            "op-b",
            "submitting",
        )
        assert "already in flight as operation op-a (submitting)" in other["message"]
    assert submissions(fake) == 1


async def test_a_held_resubmission_is_the_payloads_one_operation_and_a_new_id_asks_nobody(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_new_jobs([failed("disk full")])
    refuses = Person("accept", {"decision": "keep_stopped"})
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=refuses) as client:
        view(await client.call_tool("start_operation", submit("op-first")))
        ended = view(await client.call_tool("check_status", {"operation_id": "op-first", "wait_seconds": 30}))
        assert ended["status"] == "failed"
        held = view(await client.call_tool("start_operation", submit("op-r1")))
        assert (held["operation_id"], held["status"]) == ("op-r1", "submitting")
        assert len(refuses.questions) == 1
        other = view(await client.call_tool("start_operation", submit("op-r2")))
        assert (other["operation_id"], other["requested_operation_id"]) == ("op-r1", "op-r2")
        assert "its resubmission waits for a person's approval" in other["message"]
        assert len(refuses.questions) == 1  # nobody is asked about an operation that is not created
    assert submissions(fake) == 1
    # Without an operation_id the call reaches the held one: the person is asked about op-r1 itself.
    approves = Person("accept", {"decision": "resubmit"})
    fake.script_new_jobs([pending("running")])
    async with h.client(elicitation_callback=approves) as client:
        sent = view(await client.call_tool("start_operation", submit(None)))
    assert (sent["operation_id"], sent["status"], sent["provider_job_id"]) == ("op-r1", "waiting", "job_0002")
    assert len(approves.questions) == 1
    assert "New operation: op-r1" in approves.questions[0]
    assert submissions(fake) == 2
    assert db_rows(h.db_path, "SELECT count(*) AS n FROM operations") == [{"n": 2}]


def _values(operation_id: str, fingerprint: str) -> dict[str, object]:
    """A submission of one payload (by its fingerprint), recorded before anything is sent."""
    return {
        **job_values(operation_id, "unused"),
        "provider_job_id": None,
        "request_fingerprint": fingerprint,
        "idempotency_key": f"key-{operation_id}",
        "status": "submitting",
        "submit_payload_json": '{"report": "q4"}',
    }


@pytest.mark.both_engines
async def test_two_connections_submitting_one_payload_under_different_ids_at_once_make_one_operation(
    tmp_path: Path,
) -> None:
    db = database_in(tmp_path)
    rounds = 40
    await race_two_connections(
        db, lambda op, i: _values(op, f"fp-{i}"), rounds=rounds, kind="submission_recorded"
    )
    per_payload = db_rows(db, "SELECT request_fingerprint, count(*) AS n FROM operations GROUP BY 1")
    assert len(per_payload) == rounds
    assert {row["n"] for row in per_payload} == {1}


@pytest.mark.slow
async def test_two_server_processes_submitting_one_payload_at_once_make_one_provider_submission(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_new_jobs([pending("running")])
    h = make_harness(tmp_path, fake)
    holder = await race_two_servers(h, submit)
    assert (holder["status"], holder["provider_job_id"]) == ("waiting", "job_0001")
    assert submissions(fake) == 1
