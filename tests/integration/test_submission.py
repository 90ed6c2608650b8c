"""Submission through start_operation: persisted first, one job at most, never a guessed id.

Every test drives the real server against the loopback fake provider, whose
log shows each request as the provider saw it (headers included), and whose
idempotency table shows how many jobs were actually created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from harness import Harness, db_rows, error_text, make_harness, view, write_table
from pollwarden.audit.chain import read_rows
from pollwarden.provider_io.provider_http import HttpLimits
from pollwarden.rules.job_identity import account_context_of, fingerprint
from pollwarden.surface.server import controller_factory
from pollwarden_providers.loader import load_table
from tests.support.fake_provider import (
    FakeProvider,
    RequestLogEntry,
    Step,
    drop_connection,
    http,
    running_fake_provider,
)
from tests.support.ports import free_port

# SQLite only: the subject is reading submit answers; tests marked both_engines are the store's (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

PAYLOAD = {"report": "sales", "month": "2025-04"}
NO_IDEMPOTENCY: dict[str, Any] = {"submit": {"idempotency_header": None}}
LOCATION_ONLY: dict[str, Any] = {"submit": {"job_id_field": None}}
# A submit request is cut off after this long (real seconds); slow steps take longer.
SHORT = HttpLimits(total_timeout_seconds=0.25)
SLOW_ACCEPT = Step(status=202, body={"id": "{job_id}", "state": "queued"}, delay_seconds=0.6)
ACCEPT = Step(status=202, body={"id": "{job_id}", "state": "queued"})


async def submit(client: Any, operation_id: str = "op-sub", **extra: Any) -> dict[str, Any]:
    args = {"provider": "acme", "operation_id": operation_id, "submit": PAYLOAD, **extra}
    return view(await client.call_tool("start_operation", args))


def submits(fake: FakeProvider) -> list[RequestLogEntry]:
    return [entry for entry in fake.log() if entry["route"] == "submit"]


def stored(h: Harness, operation_id: str = "op-sub") -> dict[str, Any]:
    [row] = db_rows(h.db_path, "SELECT * FROM operations WHERE operation_id = ?", operation_id)
    return row


def audit_kinds(h: Harness, operation_id: str = "op-sub") -> list[str]:
    return [row.kind for row in read_rows(h.db_path, operation_id)]


@pytest.mark.both_engines
async def test_the_record_fingerprint_and_idempotency_key_are_on_disk_before_the_submit_request(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        started = await submit(client)
    assert started["status"] == "waiting"
    assert started["provider_job_id"] == "job_0001"
    assert started["allowed_actions"] == ["check_status"]
    row = stored(h)
    table = load_table(write_table(h.tables_dir, h.table))
    assert row["request_fingerprint"] == fingerprint("acme", account_context_of(table), PAYLOAD)
    [sent] = submits(fake)
    assert sent["method"] == "POST"
    assert sent["idempotency_key"] == row["idempotency_key"]
    assert row["idempotency_key"].startswith("pw-")
    # The record (with its key) was written, then the lease taken, then the request sent.
    assert audit_kinds(h) == ["submission_recorded", "submit_sending", "submitted"]
    first = read_rows(h.db_path, "op-sub")[0].payload_obj
    assert first["status"] == "submitting"


@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
async def test_a_202_with_a_location_on_the_tables_origin_gives_the_job_id(
    tmp_path: Path, fake: FakeProvider, absolute: bool
) -> None:
    prefix = fake.base_url if absolute else ""
    fake.script_submit([http(202, headers={"Location": prefix + "/v1/jobs/{job_id}"})])
    h = make_harness(tmp_path, fake, table=LOCATION_ONLY)
    async with h.client() as client:
        started = await submit(client)
    assert (started["status"], started["provider_job_id"]) == ("waiting", "job_0001")
    assert started["last_http_status"] == 202
    notes = [row.payload_obj.get("note") for row in read_rows(h.db_path, "op-sub") if row.kind == "submitted"]
    assert notes == ["HTTP 202, job id from the Location header"]


async def test_a_202_with_a_location_on_another_origin_is_refused_and_never_followed(
    tmp_path: Path, fake: FakeProvider
) -> None:
    with running_fake_provider() as other:
        fake.script_submit([http(202, headers={"Location": other.base_url + "/v1/jobs/{job_id}"})])
        h = make_harness(tmp_path, fake, table=LOCATION_ONLY)
        async with h.client() as client:
            started = await submit(client)
        assert other.log() == []
    assert started["status"] == "escalated"
    assert started["stop_reason"] == "integration_failure"
    assert started["provider_job_id"] is None
    assert started["allowed_actions"] == []
    assert f"is not on {fake.base_url}" in started["stop_detail"]
    assert other.base_url.removeprefix("http://") in started["stop_detail"]
    assert len(submits(fake)) == 1


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (http(202), "there is no Location header"),
        (http(202, headers={"Location": "/v2/somewhere/else"}), "does not match status_path"),
        (http(202, headers={"Location": "/v1/jobs/.."}), "does not match status_path"),
    ],
    ids=["no-location", "location-off-the-status-path", "dot-dot-location"],
)
async def test_a_202_without_a_usable_location_stops_without_guessing_a_job_id(
    tmp_path: Path, fake: FakeProvider, answer: Step, why: str
) -> None:
    fake.script_submit([answer])
    h = make_harness(tmp_path, fake, table=LOCATION_ONLY)
    async with h.client() as client:
        started = await submit(client)
        again = await submit(client)
    assert started["stop_reason"] == "integration_failure"
    assert "never guesses" in started["stop_detail"]
    assert why in started["stop_detail"]
    assert again["stop_reason"] == "integration_failure"
    assert len(submits(fake)) == 1
    assert [e for e in fake.log() if e["route"] != "submit"] == []


async def test_the_documented_body_field_wins_over_a_location_on_another_origin(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_submit(
        [http(201, headers={"Location": "https://elsewhere.example/x"}, body={"id": "{job_id}"})]
    )
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        started = await submit(client)
    assert (started["status"], started["provider_job_id"]) == ("waiting", "job_0001")


@pytest.mark.parametrize("lost", [SLOW_ACCEPT, drop_connection()], ids=["timeout", "connection-lost"])
async def test_a_submit_without_idempotency_whose_fate_is_unknown_stops_as_delivery_ambiguous_for_good(
    tmp_path: Path, fake: FakeProvider, lost: Step
) -> None:
    fake.script_submit([lost, ACCEPT])
    h = make_harness(tmp_path, fake, table=NO_IDEMPOTENCY, http_limits=SHORT)
    async with h.client() as client:
        started = await submit(client)
        assert started["status"] == "escalated"
        assert started["stop_reason"] == "delivery_ambiguous"
        assert "never resubmitted" in started["stop_detail"]
        assert started["allowed_actions"] == []
        assert started["transport_failures_used"] == 1
        h.clock.advance(3600)
        again = await submit(client)
    assert again["stop_reason"] == "delivery_ambiguous"
    [sent] = submits(fake)
    assert sent["idempotency_key"] is None
    assert stored(h)["idempotency_key"] is None


@pytest.mark.both_engines
async def test_a_submit_with_idempotency_that_times_out_is_resent_with_the_same_key_and_one_job(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_submit([SLOW_ACCEPT, ACCEPT])
    h = make_harness(tmp_path, fake, http_limits=SHORT)
    async with h.client() as client:
        first = await submit(client)
        assert first["status"] == "submitting"
        assert first["transport_failures_used"] == 1
        assert first["allowed_actions"] == ["start_operation"]
        assert "same idempotency key" in first["message"]
        # Too early: the retry time is in stop_detail, and nothing is sent before it.
        early = await submit(client)
        assert early["status"] == "submitting"
        assert len(submits(fake)) == 1
        h.clock.advance(10)
        second = await submit(client)
    assert (second["status"], second["provider_job_id"]) == ("waiting", "job_0001")
    assert second["stop_detail"] is None
    one, two = submits(fake)
    assert one["idempotency_key"] == two["idempotency_key"] == stored(h)["idempotency_key"]
    assert (one["job_id"], two["job_id"]) == ("job_0001", "job_0001")
    assert two["idempotent_replay"] is True
    assert "submit_unanswered" in audit_kinds(h)


@pytest.mark.both_engines
async def test_a_crash_after_sending_is_recovered_by_resending_the_same_key_and_no_second_job(
    tmp_path: Path, fake: FakeProvider
) -> None:
    """The process dies with the submit request at the provider: the lease is left, no answer recorded."""
    fake.script_submit([SLOW_ACCEPT, ACCEPT])
    h = make_harness(tmp_path, fake)
    write_table(h.tables_dir, h.table)
    factory = controller_factory(h.config(), clock=h.clock, rng=h.rng, environ=h.environ)
    async with factory() as controller:
        with anyio.move_on_after(0.3):  # the "crash": the call is abandoned mid-request
            await controller.start_operation(provider="acme", operation_id="op-sub", submit=PAYLOAD)
        lease_seconds = controller.lease_seconds
    [crashed] = submits(fake)
    row = stored(h)
    assert (row["status"], row["lease_owner"] is not None) == ("submitting", True)
    assert crashed["idempotency_key"] == row["idempotency_key"]

    async with h.client() as client:  # a new process on the same database
        in_flight = await submit(client)
        assert in_flight["status"] == "submitting"
        assert len(submits(fake)) == 1  # the lease is still live: nothing sent
        h.clock.advance(lease_seconds)
        recovered = await submit(client)
    assert (recovered["status"], recovered["provider_job_id"]) == ("waiting", "job_0001")
    first, second = submits(fake)
    assert first["idempotency_key"] == second["idempotency_key"]
    assert second["idempotent_replay"] is True
    assert {first["job_id"], second["job_id"]} == {"job_0001"}


@pytest.mark.both_engines
async def test_a_crash_after_sending_without_idempotency_stops_as_delivery_ambiguous_and_sends_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_submit([SLOW_ACCEPT, ACCEPT])
    h = make_harness(tmp_path, fake, table=NO_IDEMPOTENCY)
    write_table(h.tables_dir, h.table)
    factory = controller_factory(h.config(), clock=h.clock, rng=h.rng, environ=h.environ)
    async with factory() as controller:
        with anyio.move_on_after(0.3):
            await controller.start_operation(provider="acme", operation_id="op-sub", submit=PAYLOAD)
        lease_seconds = controller.lease_seconds
    async with h.client() as client:
        h.clock.advance(lease_seconds)
        after = await submit(client)
        again = await submit(client)
    assert after["stop_reason"] == again["stop_reason"] == "delivery_ambiguous"
    assert "never resubmitted" in after["stop_detail"]
    assert len(submits(fake)) == 1
    assert stored(h)["lease_owner"] is None


async def test_a_refused_connection_is_not_ambiguous_and_a_later_call_submits_once(
    tmp_path: Path, fake: FakeProvider
) -> None:
    port = free_port()
    h = make_harness(tmp_path, fake, table={"base_url": f"http://127.0.0.1:{port}", **NO_IDEMPOTENCY})
    async with h.client() as client:
        refused = await submit(client)
        assert refused["status"] == "submitting"
        assert refused["stop_reason"] is None
        assert "nothing reached the provider" in refused["stop_detail"]
        assert refused["allowed_actions"] == ["start_operation"]
        with running_fake_provider(port) as provider:
            h.clock.advance(10)
            accepted = await submit(client)
            assert (accepted["status"], accepted["provider_job_id"]) == ("waiting", "job_0001")
            assert len(submits(provider)) == 1


async def test_refused_connections_stop_at_the_transport_failure_budget_without_claiming_ambiguity(
    tmp_path: Path, fake: FakeProvider
) -> None:
    port = free_port()
    table = {
        "base_url": f"http://127.0.0.1:{port}",
        "limits": {"max_transport_failures": 2},
        **NO_IDEMPOTENCY,
    }
    h = make_harness(tmp_path, fake, table=table)
    async with h.client() as client:
        await submit(client)
        h.clock.advance(10)
        last = await submit(client)
    assert last["stop_reason"] == "integration_failure"
    assert "nothing was delivered" in last["stop_detail"]
    assert last["transport_failures_used"] == 2


async def test_a_submission_is_never_sent_after_the_deadline(tmp_path: Path, fake: FakeProvider) -> None:
    fake.script_submit([SLOW_ACCEPT, ACCEPT])
    h = make_harness(tmp_path, fake, http_limits=SHORT)
    async with h.client() as client:
        await submit(client, deadline_seconds=60)
        h.clock.advance(61)
        late = await submit(client, deadline_seconds=60)
    assert late["stop_reason"] == "deadline_exceeded"
    assert len(submits(fake)) == 1


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (http(401), "authorization_denied"),
        (http(400, body={"error": "bad payload"}), "integration_failure"),
        (http(302, headers={"Location": "/v1/jobs/job_0001"}), "integration_failure"),
        (http(600), "integration_failure"),
        (http(999, headers={"Retry-After": "30"}), "integration_failure"),
    ],
    ids=["401", "400", "302", "600", "999"],
)
async def test_a_submission_answer_that_is_not_an_acceptance_stops_with_its_reason(
    tmp_path: Path, fake: FakeProvider, answer: Step, reason: str
) -> None:
    fake.script_submit([answer])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        started = await submit(client)
    assert started["stop_reason"] == reason
    assert started["last_http_status"] == answer.status
    assert len(fake.log()) == 1


async def test_a_5xx_on_submission_with_idempotency_is_resent_with_the_same_key(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_submit([http(503, headers={"Retry-After": "30"}), ACCEPT])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        first = await submit(client)
        assert first["status"] == "submitting"
        h.clock.advance(29)
        assert (await submit(client))["status"] == "submitting"  # Retry-After is a minimum
        h.clock.advance(1)
        second = await submit(client)
    assert (second["status"], second["provider_job_id"]) == ("waiting", "job_0001")
    one, two = submits(fake)
    assert one["idempotency_key"] == two["idempotency_key"]


@pytest.mark.both_engines
async def test_calling_again_with_another_payload_or_idempotency_key_is_a_conflict(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await submit(client, idempotency_key="mine-1")
        other_payload = await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-sub", "submit": {"report": "other"}}
        )
        assert "different provider, job or payload" in error_text(other_payload)
        other_key = await client.call_tool(
            "start_operation",
            {"provider": "acme", "operation_id": "op-sub", "submit": PAYLOAD, "idempotency_key": "mine-2"},
        )
        assert "different idempotency key" in error_text(other_key)
        bad_key = await client.call_tool(
            "start_operation",
            {"provider": "acme", "operation_id": "op-2", "submit": PAYLOAD, "idempotency_key": "a b\r\nX: y"},
        )
        assert "visible ASCII" in error_text(bad_key)
    [sent] = submits(fake)
    assert sent["idempotency_key"] == "mine-1"
