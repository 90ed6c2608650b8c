"""No identical request after a refusal until an operator says the cause is fixed (issue 12, item 3).

Found by trying it: after a 403, a new operation id on the same job sent the
identical request again. Now the job keeps its stop under every operation id;
the agent is told a person must fix the cause and an operator reopen it; and
`pollwarden reopen` needs the same proof of a person as `pollwarden approve`
(a terminal where the operation id is typed, or a configured operator key), is
audited, and resumes inside the same budget and deadline.

The pure checks are tests/unit/test_reopen_after_refusal.py.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from harness import Harness, error_text, make_harness, make_operator, view
from pollwarden.access.operator_keys import REQUIRE_ENV, DecisionFacts, load_operator_key
from pollwarden.audit.chain import read_rows
from pollwarden.core.clock import FakeClock
from tests.integration.test_operator_decisions import at_terminal, cli
from tests.support.fake_provider import FakeProvider, Step, http, pending

pytestmark = pytest.mark.anyio


REFUSALS = [
    pytest.param(http(403, body={"error": "token revoked"}), "authorization_denied", id="403"),
    pytest.param(http(401), "authorization_denied", id="401"),
    pytest.param(Step(raw_body_text="{not json"), "integration_failure", id="unparseable"),
]


def harness(tmp_path: Path, fake: FakeProvider) -> Harness:
    # The operator CLI stamps decisions with the real time: the server's fake clock starts there.
    return make_harness(tmp_path, fake, clock=FakeClock(time.time()))


async def call(client: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    return view(await client.call_tool(tool, arguments))


async def refused_once(h: Harness, job: str, refusal: Step, reason: str) -> dict[str, Any]:
    """Track `job` as op-<job>; its first status answer is the refusal."""
    h.fake.script(job, [refusal, pending("running")])
    async with h.client() as client:
        await call(client, "start_operation", provider="acme", operation_id=f"op-{job}", provider_job_id=job)
        stopped = await call(client, "check_status", operation_id=f"op-{job}", wait_seconds=30)
    assert (stopped["status"], stopped["stop_reason"]) == ("escalated", reason)
    return stopped


@pytest.mark.parametrize(("refusal", "reason"), REFUSALS)
async def test_after_a_refusal_no_operation_id_sends_the_identical_request_and_the_agent_is_told_why(
    tmp_path: Path, fake: FakeProvider, refusal: Step, reason: str
) -> None:
    h = harness(tmp_path, fake)
    await refused_once(h, "j", refusal, reason)
    async with h.client() as client:
        for attempt in range(3):
            h.clock.advance(3600)
            again = await call(
                client, "start_operation", provider="acme", operation_id=f"new-{attempt}", provider_job_id="j"
            )
            assert (again["operation_id"], again["stop_reason"], again["allowed_actions"]) == (
                "op-j",
                reason,
                [],
            )
            assert "until a person fixes the cause and an operator reopens" in again["message"]
            assert [o["action"] for o in again["escalation"]["options"]] == [
                "operator_reopen",
                "inspect_provider_console",
            ]
            assert "fix the cause and reopen" in again["escalation"]["message"]
            stopped = await call(client, "check_status", operation_id="op-j", wait_seconds=30)
            assert stopped["outcome"] == "stopped"
        asked = await client.call_tool(
            "request_extension",
            {"operation_id": "op-j", "extra_seconds": 60, "extra_status_requests": 1, "reason": "try again"},
        )
        text = view(asked)["message"] if not asked.is_error else error_text(asked)
        assert "an operator must reopen this operation" in text
        assert "pollwarden" not in again["message"]  # never a command for the agent to run
    assert len(fake.status_requests("j")) == 1


async def test_reopen_needs_a_person_and_an_operator_key_reopens_it_audited_inside_the_same_budget(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    key = load_operator_key(operator.key_file)
    h = harness(tmp_path, fake)
    h.operator = operator.policy()
    before = await refused_once(h, "k", http(403), "authorization_denied")

    forged = cli(h, "reopen", "op-k", "--reason", "fixed, trust me")
    assert forged.returncode == 2
    assert "needs a person" in forged.stderr
    assert "Nothing was reopened" in forged.stderr

    done = cli(
        h,
        "reopen",
        "op-k",
        "--reason",
        "rotated the token",
        "--by",
        "alice",
        "--operator-key",
        str(operator.key_file),
        env=operator.env(),
    )
    assert done.returncode == 0, done.stderr
    assert "Reopen operation op-k?" in done.stdout
    assert "Stopped because: authorization_denied" in done.stdout
    assert "op-k: reopen recorded by alice" in done.stdout
    assert "same budget and deadline (1 of 12 used" in done.stdout
    # Recorded, not applied: the server verifies who decided first, on the agent's next check.
    assert [r for r in read_rows(h.db_path, "op-k") if r.kind == "reopened"] == []

    async with h.client() as client:
        resumed = await call(client, "check_status", operation_id="op-k", wait_seconds=30)
    assert (resumed["outcome"], resumed["status"]) == ("polled", "waiting")
    assert (resumed["status_requests_used"], resumed["max_status_requests"]) == (2, 12)
    assert resumed["deadline_at"] == before["deadline_at"]
    assert len(fake.status_requests("k")) == 2

    [row] = [r for r in read_rows(h.db_path, "op-k") if r.kind == "reopened"]
    audit = row.payload_obj
    assert (audit["status"], audit["stop_reason"], audit["stop_reason_before"]) == (
        "waiting",
        None,
        "authorization_denied",
    )
    assert (audit["reason"], audit["reopened_by"]) == ("rotated the token", "alice")
    assert audit["authenticated_by"] == f"operator-key:{key.public.key_id}"
    assert audit["delay_source"] == "manual_extension"
    # The signature covers the operation as shown, the reason and who decided: anyone can check it later.
    facts = DecisionFacts(
        approval_id=str(audit["approval_id"]),
        operation_id="op-k",
        kind="reopen",
        bound_version=int(str(audit["bound_version"])),
        request_json=str(audit["signed_request"]),
        decision="approved",
        decided_at=float(str(audit["decided_at"])),
        decided_by="alice",
    )
    assert json.loads(str(audit["signed_request"]))["reason"] == "rotated the token"
    key.public.key.verify(base64.b64decode(str(audit["signature"])), facts.message())

    twice = cli(
        h, "reopen", "op-k", "--reason", "again", "--operator-key", str(operator.key_file), env=operator.env()
    )
    assert twice.returncode == 1
    assert "which reopen does not apply to" in twice.stderr


async def test_an_operator_at_a_terminal_reopens_by_typing_the_operation_id(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    await refused_once(h, "t", Step(raw_body_text="<html>"), "integration_failure")
    code, shown = at_terminal(h, "reopen", "op-t", "--reason", "fixed the table", typed="yes")
    assert code == 1
    assert "op-t: nothing reopened" in shown
    code, shown = at_terminal(h, "reopen", "op-t", "--reason", "fixed the table", typed="op-t")
    assert code == 0, shown
    assert "Stopped because: integration_failure" in shown
    async with h.client() as client:
        resumed = await call(client, "check_status", operation_id="op-t", wait_seconds=30)
    [row] = [r for r in read_rows(h.db_path, "op-t") if r.kind == "reopened"]
    assert row.payload_obj["authenticated_by"] == "tty"
    assert resumed["outcome"] == "polled"
    assert len(fake.status_requests("t")) == 2


async def test_reopen_refuses_a_stop_that_a_person_extends_instead(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    h = harness(tmp_path, fake)
    fake.script("b", [pending("running")])
    async with h.client() as client:
        await call(
            client,
            "start_operation",
            provider="acme",
            operation_id="op-b",
            provider_job_id="b",
            max_status_requests=1,
        )
        stopped = await call(client, "check_status", operation_id="op-b", wait_seconds=30)
    assert stopped["stop_reason"] == "request_budget_exhausted"
    refused = cli(
        h, "reopen", "op-b", "--reason", "more", "--operator-key", str(operator.key_file), env=operator.env()
    )
    assert refused.returncode == 1
    assert "request_extension and a person's approval" in refused.stderr
    assert [r.kind for r in read_rows(h.db_path, "op-b")].count("reopened") == 0


async def test_an_agent_reopening_with_its_own_key_and_keys_file_sends_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    trusted = make_operator(tmp_path / "opkeys", "operator")
    agent = make_operator(tmp_path / "agentkeys", "agent")  # the agent ran `operator-key init`
    for require_key in (True, False):
        h = harness(tmp_path / f"require-{require_key}", fake)
        h.operator = trusted.policy(require_key=require_key)  # the server trusts only the operator's key
        job = f"self-{require_key}"
        await refused_once(h, job, http(403, body={"error": "token revoked"}), "authorization_denied")
        done = cli(
            h,
            "reopen",
            f"op-{job}",
            "--reason",
            "fixed",
            "--operator-key",
            str(agent.key_file),
            "--operator-pubkeys",
            str(agent.pubkeys_file),
            "--by",
            "alice",
            env={REQUIRE_ENV: "1"} if require_key else None,
        )
        async with h.client() as client:
            again = await call(client, "check_status", operation_id=f"op-{job}", wait_seconds=30)
        assert (again["status"], again["stop_reason"]) == ("escalated", "authorization_denied")
        assert len(fake.status_requests(job)) == 1
        kinds = [r.kind for r in read_rows(h.db_path, f"op-{job}")]
        assert "reopened" not in kinds
        if require_key:  # the database's policy names the keys it trusts: the command refuses at once
            assert done.returncode == 2
            assert "not among the operator public keys" in done.stderr
        else:  # the server refuses the key-signed decision when it would apply it
            assert "approval_refused" in kinds
