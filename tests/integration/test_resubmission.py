"""A resubmission needs a person: the same payload again after it ended or escalated is sent only once approved.

Elicitation in both protocol eras, an operator's decision for clients that
cannot ask, the earlier outcome shown to the person, the approval audited as
a resubmission approval, and nothing sent before it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp.client import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult

from harness import Harness, make_harness, make_operator, view
from pollwarden.audit.chain import read_rows
from pollwarden.core.clock import FakeClock
from tests.support.fake_provider import FakeProvider, Step, failed, pending

# SQLite only: the subject is the resubmission flow's questions (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]
PAYLOAD = {"report": "q3", "format": "csv"}


class Person:
    """An elicitation callback that answers as told and remembers what it was asked."""

    def __init__(self, action: str, content: dict[str, Any] | None = None) -> None:
        self.action = action
        self.content = content
        self.questions: list[str] = []

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        self.questions.append(params.message)
        return ElicitResult(action=self.action, content=self.content)  # type: ignore[arg-type]


def submissions(fake: FakeProvider) -> int:
    return len([e for e in fake.log() if e["route"] == "submit"])


async def ended(h: Harness, client: Any, first: list[Step], *, budget: int = 12) -> dict[str, Any]:
    """Submit PAYLOAD as op-first and check it until it stops with the scripted answers."""
    h.fake.script_new_jobs(first)
    args = {"provider": "acme", "operation_id": "op-first", "submit": PAYLOAD, "max_status_requests": budget}
    view(await client.call_tool("start_operation", args))
    v = view(await client.call_tool("check_status", {"operation_id": "op-first", "wait_seconds": 30}))
    assert v["status"] != "waiting", v
    h.fake.script_new_jobs([pending("running")])
    return v


def again(operation_id: str | None = "op-again") -> dict[str, Any]:
    args: dict[str, Any] = {"provider": "acme", "submit": PAYLOAD}
    if operation_id is not None:
        args["operation_id"] = operation_id
    return args


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(
    ("first", "outcome"),
    [
        pytest.param([failed("disk full")], "failed (provider_failure)", id="provider_failure"),
        pytest.param([pending("cancelled")], "cancelled (cancelled)", id="cancelled"),
        pytest.param([pending("expired")], "expired (expired)", id="expired"),
        pytest.param([pending("running")], "escalated (request_budget_exhausted)", id="escalated"),
    ],
)
async def test_the_same_payload_after_it_ended_or_escalated_is_sent_only_after_a_person_approves(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any], first: list[Step], outcome: str
) -> None:
    person = Person("accept", {"decision": "resubmit"})
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=person, **era) as client:
        await ended(h, client, first, budget=1)
        assert submissions(fake) == 1
        second = view(await client.call_tool("start_operation", again()))
    assert submissions(fake) == 2
    assert (second["operation_id"], second["status"]) == ("op-again", "waiting")
    assert second["provider_job_id"] == "job_0002"
    (question,) = person.questions
    assert "Approve submitting the same payload to acme again?" in question
    assert "It was submitted before as op-first, provider job job_0001" in question
    assert f"Earlier outcome: {outcome} at " in question
    assert "Choices: resubmit or keep_stopped." in question
    rows = read_rows(h.db_path, "op-again")
    approved = [r for r in rows if r.kind == "resubmission_approved"]
    assert len(approved) == 1
    payload = approved[0].payload_obj
    assert (payload["resubmission_of"], payload["approved_by"], payload["authenticated_by"]) == (
        "op-first",
        "person (elicitation)",
        "elicitation",
    )
    kinds = [r.kind for r in rows]
    assert kinds.index("resubmission_approved") < kinds.index("submit_sending")


async def test_the_person_sees_the_earlier_error_quoted_as_untrusted_text(
    tmp_path: Path, fake: FakeProvider
) -> None:
    person = Person("accept", {"decision": "keep_stopped"})
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=person) as client:
        await ended(h, client, [failed("quota exceeded\nChoices: resubmit")])
        await client.call_tool("start_operation", again())
    lines = person.questions[0].splitlines()
    assert 'Provider error (untrusted): "quota exceeded Choices: resubmit"' in lines
    assert lines[-1] == "Choices: resubmit or keep_stopped."


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(("action", "content"), [("decline", None), ("accept", {"decision": "keep_stopped"})])
async def test_a_resubmission_the_person_refuses_sends_nothing(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any], action: str, content: Any
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=Person(action, content), **era) as client:
        await ended(h, client, [failed("disk full")])
        held = view(await client.call_tool("start_operation", again()))
        assert held["status"] == "submitting"
        assert held["provider_job_id"] is None
        assert "denied resubmitting the payload of op-first; nothing was sent" in held["message"]
        # Checking it sends nothing either: there is no job.
        assert (
            view(await client.call_tool("check_status", {"operation_id": "op-again"}))["outcome"] == "stopped"
        )
    assert submissions(fake) == 1
    assert "resubmission_denied" in [r.kind for r in read_rows(h.db_path, "op-again")]


def _cli(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    operator = make_operator(h.tmp / "operator")
    extra = ["--operator-key", str(operator.key_file)] if args[0] in ("approve", "deny") else []
    return subprocess.run(
        [sys.executable, "-m", "pollwarden", *args, *extra, "--db", str(h.db_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **operator.env()},
    )


async def test_without_elicitation_an_operator_approves_and_the_next_call_sends_it_once(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    h.operator = make_operator(h.tmp / "operator").policy()  # the server trusts the key _cli signs with
    async with h.client() as client:
        await ended(h, client, [failed("disk full")])
        held = view(await client.call_tool("start_operation", again(None)))
        held_id = held["operation_id"]
        assert held["status"] == "submitting"
        assert "A person must decide" in held["message"]
        assert "pollwarden approve" not in held["message"]
        assert submissions(fake) == 1
        # Asking again while the operator has not decided sends nothing and asks nobody new.
        assert view(await client.call_tool("start_operation", again(None)))["operation_id"] == held_id
        listed = _cli(h, "approvals", "list")
        assert listed.returncode == 0, listed.stderr
        assert "asks to resubmit the payload of op-first as a new job" in listed.stdout
        assert "Earlier outcome: failed (provider_failure)" in listed.stdout
        approval_id = listed.stdout.split()[0]
        decided = _cli(h, "approve", approval_id, "--by", "ops-alice")
        assert decided.returncode == 0, decided.stderr
        assert submissions(fake) == 1  # nothing is sent before the agent's next call
        sent = view(await client.call_tool("start_operation", again(None)))
        assert (sent["operation_id"], sent["status"]) == (held_id, "waiting")
        assert submissions(fake) == 2
        same = view(await client.call_tool("start_operation", again(held_id)))
        assert (same["operation_id"], same["status"]) == (held_id, "waiting")
    assert submissions(fake) == 2
    approved = [r for r in read_rows(h.db_path, held_id) if r.kind == "resubmission_approved"]
    assert approved[0].payload_obj["approved_by"] == "ops-alice"
    assert approved[0].payload_obj["authenticated_by"].startswith("operator-key:")


async def test_an_operator_denial_keeps_the_resubmission_unsent(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    h.operator = make_operator(h.tmp / "operator").policy()  # the server trusts the key _cli signs with
    async with h.client() as client:
        await ended(h, client, [failed("disk full")])
        view(await client.call_tool("start_operation", again()))
        approval_id = _cli(h, "approvals", "list").stdout.split()[0]
        assert _cli(h, "deny", approval_id).returncode == 0
        after = view(await client.call_tool("start_operation", again()))
    assert after["status"] == "submitting"
    assert "denied resubmitting" in after["message"]
    assert submissions(fake) == 1


async def test_tracking_a_job_whose_fingerprint_equals_a_failed_payloads_does_not_let_it_be_resent_unasked(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # A payload shaped like the tracking key ({"provider_job_id": …}) has a tracked job's fingerprint;
    # tracking that job sends nothing, so the failed submission still decides.
    h = make_harness(tmp_path, fake)
    payload = {"provider_job_id": "zzz"}
    async with h.client() as client:
        fake.script_new_jobs([failed("disk full")])
        args = {"provider": "acme", "operation_id": "op-first", "submit": payload}
        view(await client.call_tool("start_operation", args))
        assert (
            view(await client.call_tool("check_status", {"operation_id": "op-first", "wait_seconds": 30}))[
                "stop_reason"
            ]
            == "provider_failure"
        )
        fake.script("zzz", [pending("running")])
        tracked = view(
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "op-track", "provider_job_id": "zzz"}
            )
        )
        assert tracked["status"] == "waiting"
        held = view(
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "op-b", "submit": payload}
            )
        )
    assert (held["status"], held["provider_job_id"]) == ("submitting", None)
    assert "A person must decide" in held["message"]
    assert submissions(fake) == 1


async def test_a_payload_still_in_flight_is_not_a_resubmission_and_its_operation_stays_idempotent(
    tmp_path: Path, fake: FakeProvider
) -> None:
    person = Person("accept", {"decision": "resubmit"})
    h = make_harness(tmp_path, fake)
    fake.script_new_jobs([pending("running")])
    async with h.client(elicitation_callback=person) as client:
        args = {"provider": "acme", "operation_id": "op-flight", "submit": PAYLOAD}
        first = view(await client.call_tool("start_operation", args))
        same = view(await client.call_tool("start_operation", args))
    assert first["provider_job_id"] == same["provider_job_id"] == "job_0001"
    assert submissions(fake) == 1
    assert person.questions == []


async def test_a_held_resubmission_is_never_claimed_for_sending_by_the_store(
    tmp_path: Path, fake: FakeProvider
) -> None:
    from pollwarden.store import open_store

    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await ended(h, client, [failed("disk full")])
        view(await client.call_tool("start_operation", again()))
    async with open_store(h.database) as store:
        claimed = await store.claim_submission(
            "op-again", owner="x", now=h.clock.now(), lease_seconds=30, allow_stale=True, note="test"
        )
    assert claimed is None
