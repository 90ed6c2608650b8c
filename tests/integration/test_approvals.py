"""Escalation and approval: elicitation in both eras, the operator CLI, expiry, voiding, caps, follow-ups."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult

from harness import Harness, db_rows, make_harness, make_operator, view
from pollwarden.core.clock import FakeClock
from pollwarden.store import open_store
from tests.support.fake_provider import FakeProvider, http, pending

# SQLite only: the subject is the approval flow's questions; tests marked both_engines are the store's (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]


class Person:
    """An elicitation callback that answers as told and remembers what it was asked."""

    def __init__(self, action: str, content: dict[str, Any] | None = None) -> None:
        self.action = action
        self.content = content
        self.questions: list[str] = []

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        self.questions.append(params.message)
        return ElicitResult(action=self.action, content=self.content)  # type: ignore[arg-type]


async def _exhaust(h: Harness, client: Any, job: str, budget: int = 2) -> dict[str, Any]:
    h.fake.script(job, [pending("running")])
    await client.call_tool(
        "start_operation",
        {
            "provider": "acme",
            "operation_id": f"op-{job}",
            "provider_job_id": job,
            "max_status_requests": budget,
        },
    )
    last: dict[str, Any] = {}
    for _ in range(budget):
        last = view(await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 30}))
    assert last["stop_reason"] == "request_budget_exhausted"
    return last


def _extend(job: str, seconds: float = 900, requests: int = 4) -> dict[str, Any]:
    return {
        "operation_id": f"op-{job}",
        "extra_seconds": seconds,
        "extra_status_requests": requests,
        "reason": "the export is large",
    }


def _cli(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    """The operator CLI on the harness's database; approve/deny sign with the operator's key."""
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


@pytest.mark.both_engines
@pytest.mark.parametrize("era", ERAS)
async def test_an_approved_extension_adds_time_and_requests_and_keeps_the_counters(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    person = Person("accept", {"decision": "approve"})
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=person, **era) as client:
        stopped = await _exhaust(h, client, "ext1")
        result = view(await client.call_tool("request_extension", _extend("ext1")))
        assert result["decision"] == "approved"
        op = result["operation"]
        assert op["status"] == "waiting"
        assert op["status_requests_used"] == 2
        assert op["max_status_requests"] == 6
        assert op["deadline_at"] > stopped["deadline_at"]
        assert op["delay_source"] == "manual_extension"
        question = person.questions[0]
        for fact in (
            "State: running",
            "Elapsed:",
            "Status requests used: 2 of 2",
            "Would add:",
            "Resulting deadline",
        ):
            assert fact in question
        early = view(await client.call_tool("check_status", {"operation_id": "op-ext1"}))
        assert early["outcome"] == "not_yet"  # the table's base delay after the last request first
        after = view(await client.call_tool("check_status", {"operation_id": "op-ext1", "wait_seconds": 30}))
        assert after["outcome"] == "polled"
        assert after["status_requests_used"] == 3
    assert len(fake.status_requests("ext1")) == 3


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(
    ("action", "content", "expected"), [("decline", None, "denied"), ("cancel", None, "cancelled")]
)
async def test_a_declined_or_cancelled_extension_changes_nothing(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any], action: str, content: Any, expected: str
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=Person(action, content), **era) as client:
        stopped = await _exhaust(h, client, "ext2")
        result = view(await client.call_tool("request_extension", _extend("ext2")))
        assert result["decision"] == expected
        op = result["operation"]
        assert (op["status"], op["max_status_requests"], op["deadline_at"]) == (
            "escalated",
            2,
            stopped["deadline_at"],
        )
        assert (
            view(await client.call_tool("check_status", {"operation_id": "op-ext2"}))["outcome"] == "stopped"
        )


async def test_a_person_who_denies_in_the_prompt_denies(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=Person("accept", {"decision": "deny"})) as client:
        await _exhaust(h, client, "ext3")
        result = view(await client.call_tool("request_extension", _extend("ext3")))
        assert result["decision"] == "denied"
        assert result["operation"]["status"] == "escalated"


async def test_an_extension_while_still_waiting_is_refused_without_asking(
    tmp_path: Path, fake: FakeProvider
) -> None:
    person = Person("accept", {"decision": "approve"})
    h = make_harness(tmp_path, fake)
    fake.script("ext4", [pending("running")])
    async with h.client(elicitation_callback=person) as client:
        await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-ext4", "provider_job_id": "ext4"}
        )
        result = view(await client.call_tool("request_extension", _extend("ext4")))
    assert result["decision"] == "refused"
    assert "still waiting" in result["message"]
    assert person.questions == []


async def test_extensions_are_clipped_to_each_operator_and_table_cap(
    tmp_path: Path, fake: FakeProvider
) -> None:
    person = Person("accept", {"decision": "approve"})
    h = make_harness(
        tmp_path,
        fake,
        table={
            "limits": {
                "max_status_requests": 10,
                "default_max_status_requests": 5,
                "max_deadline_seconds": 3000,
            }
        },
    )
    async with h.client(elicitation_callback=person) as client:
        await _exhaust(h, client, "cap1")
        result = view(
            await client.call_tool("request_extension", _extend("cap1", seconds=99_999, requests=500))
        )
    assert result["decision"] == "approved"
    clipped = " ".join(result["clipped"])
    assert "operator cap 3600" in clipped
    assert "max_deadline_seconds" in clipped
    assert "operator cap 20" in clipped
    assert "max_status_requests is 10" in clipped
    assert result["granted_extra_status_requests"] == 8
    assert result["granted_extra_seconds"] == pytest.approx(600)
    assert result["operation"]["max_status_requests"] == 10
    assert "Clipped:" in person.questions[0]


@pytest.mark.both_engines
async def test_the_number_of_extensions_per_operation_is_capped(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=Person("accept", {"decision": "approve"})) as client:
        await _exhaust(h, client, "cap2", budget=1)
        for _ in range(3):
            assert (
                view(await client.call_tool("request_extension", _extend("cap2", requests=1)))["decision"]
                == "approved"
            )
            again = view(
                await client.call_tool("check_status", {"operation_id": "op-cap2", "wait_seconds": 30})
            )
            assert again["stop_reason"] == "request_budget_exhausted"
        fourth = view(await client.call_tool("request_extension", _extend("cap2", requests=1)))
    assert fourth["decision"] == "refused"
    assert "limit (3)" in fourth["message"]


async def test_extension_refused_without_asking_after_authorization_denied(
    tmp_path: Path, fake: FakeProvider
) -> None:
    from tests.support.fake_provider import http

    person = Person("accept", {"decision": "approve"})
    h = make_harness(tmp_path, fake)
    fake.script("auth1", [http(401)])
    async with h.client(elicitation_callback=person) as client:
        await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-auth1", "provider_job_id": "auth1"}
        )
        stopped = view(
            await client.call_tool("check_status", {"operation_id": "op-auth1", "wait_seconds": 30})
        )
        assert stopped["stop_reason"] == "authorization_denied"
        assert stopped["allowed_actions"] == []
        result = view(await client.call_tool("request_extension", _extend("auth1")))
    assert result["decision"] == "refused"
    assert "credentials" in result["message"]
    assert person.questions == []


async def test_a_client_without_elicitation_gets_an_operator_approval_applied_on_the_next_check(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    h.operator = make_operator(h.tmp / "operator").policy()  # the server trusts the key _cli signs with
    async with h.client() as client:
        await _exhaust(h, client, "cli1")
        pending_result = view(await client.call_tool("request_extension", _extend("cli1")))
        assert pending_result["decision"] == "pending_approval"
        approval_id = pending_result["approval_id"]
        assert approval_id in pending_result["message"]
        assert "pollwarden approve" not in pending_result["message"]  # a person decides, not the agent

        listed = _cli(h, "approvals", "list")
        assert listed.returncode == 0, listed.stderr
        assert approval_id in listed.stdout
        assert "Would add:" in listed.stdout

        decided = _cli(h, "approve", approval_id, "--by", "ops-alice")
        assert decided.returncode == 0, decided.stderr
        assert "approved" in decided.stdout

        applied = view(
            await client.call_tool("check_status", {"operation_id": "op-cli1", "wait_seconds": 30})
        )
        assert applied["outcome"] == "polled"
        assert applied["max_status_requests"] == 6
        assert applied["status_requests_used"] == 3
        again = _cli(h, "approve", approval_id)
        assert again.returncode == 1
        assert "already applied" in again.stderr


async def test_a_client_without_elicitation_sees_an_operator_denial(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    h.operator = make_operator(h.tmp / "operator").policy()  # the server trusts the key _cli signs with
    async with h.client() as client:
        await _exhaust(h, client, "cli2")
        approval_id = view(await client.call_tool("request_extension", _extend("cli2")))["approval_id"]
        decided = _cli(h, "deny", approval_id)
        assert decided.returncode == 0, decided.stderr
        after = view(await client.call_tool("check_status", {"operation_id": "op-cli2"}))
    assert after["outcome"] == "stopped"
    assert after["max_status_requests"] == 2


@pytest.mark.both_engines
async def test_an_approval_decided_after_it_expired_approves_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # The server's clock is 20 minutes behind the operator's: the approval (15 minutes) has expired.
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time() - 1200))
    h.operator = make_operator(h.tmp / "operator").policy()  # the server trusts the key _cli signs with
    async with h.client() as client:
        await _exhaust(h, client, "exp1")
        approval_id = view(await client.call_tool("request_extension", _extend("exp1")))["approval_id"]
        decided = _cli(h, "approve", approval_id)
        assert decided.returncode == 1
        assert "expired" in decided.stderr
        after = view(await client.call_tool("check_status", {"operation_id": "op-exp1"}))
    assert after["outcome"] == "stopped"
    assert after["max_status_requests"] == 2


@pytest.mark.both_engines
async def test_a_pending_approval_expires_on_the_servers_clock(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    async with h.client() as client:
        await _exhaust(h, client, "exp2")
        approval_id = view(await client.call_tool("request_extension", _extend("exp2")))["approval_id"]
        h.clock.advance(16 * 60)
        view(await client.call_tool("check_status", {"operation_id": "op-exp2"}))
    listed = _cli(h, "approvals", "list", "--all")
    assert f"{approval_id}  expired" in listed.stdout


@pytest.mark.both_engines
async def test_an_approval_is_void_when_the_operation_changed_after_the_question(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    h.operator = make_operator(h.tmp / "operator").policy()  # the server trusts the key _cli signs with
    async with h.client() as plain:
        await _exhaust(h, plain, "void1", budget=1)
        stale_id = view(await plain.call_tool("request_extension", _extend("void1", requests=1)))[
            "approval_id"
        ]
    # Another client asking meanwhile gets the one open question (issue 30): its person is not asked.
    person = Person("accept", {"decision": "approve"})
    async with h.client(elicitation_callback=person) as other:
        again = view(await other.call_tool("request_extension", _extend("void1", requests=1)))
        assert (again["decision"], again["approval_id"]) == ("pending_approval", stale_id)
    assert person.questions == []
    # Then the operation changes by another way (more requests granted as another question was).
    async with open_store(h.database) as store:
        record = await store.get("op-void1")
        assert record is not None
        changed = await store.apply_extension(
            "op-void1",
            bound_version=record.version,
            changes={"max_status_requests": record.max_status_requests + 1},
            at=h.clock.now(),
            approval_id=None,
            payload_extra={},
        )
        assert changed is not None
    decided = _cli(h, "approve", stale_id)
    assert decided.returncode == 1
    assert "void" in decided.stderr
    assert "changed" in decided.stderr


async def test_tool_confirmation_mode_trusts_the_clients_own_prompt(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    h.approval_mode = "tool-confirmation"
    person = Person("accept", {"decision": "deny"})
    async with h.client(elicitation_callback=person) as client:
        await _exhaust(h, client, "tc1")
        result = view(await client.call_tool("request_extension", _extend("tc1")))
    assert result["decision"] == "approved"
    assert person.questions == []


@pytest.mark.both_engines
async def test_fetch_result_is_refused_before_success_and_recorded_after(
    tmp_path: Path, fake: FakeProvider
) -> None:
    from tests.support.fake_provider import succeeded

    h = make_harness(tmp_path, fake)
    fake.script("fr1", [pending("running"), succeeded()])
    async with h.client() as client:
        await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-fr1", "provider_job_id": "fr1"}
        )
        early = view(await client.call_tool("fetch_result", {"operation_id": "op-fr1"}))
        assert early["decision"] == "refused"
        assert early["allowed_actions"] == ["check_status"]
        view(await client.call_tool("check_status", {"operation_id": "op-fr1", "wait_seconds": 30}))
        view(await client.call_tool("check_status", {"operation_id": "op-fr1", "wait_seconds": 30}))
        done = view(await client.call_tool("fetch_result", {"operation_id": "op-fr1"}))
        assert done["decision"] == "done"
        assert done["result"] == {"result_url": "https://files.example/fr1.csv"}
        assert done["followup_id"].startswith("fu-")
        story = await client.read_resource("pollwarden://operations/op-fr1/audit")
    text = story.contents[0].text  # type: ignore[union-attr]
    assert "fetch_result_done" in text
    assert len(fake.status_requests("fr1")) == 2


async def test_cancel_is_refused_on_a_table_without_cancel(tmp_path: Path, fake: FakeProvider) -> None:
    person = Person("accept", {"decision": "cancel_at_provider"})
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=person) as client:
        await _exhaust(h, client, "nc1")
        result = view(await client.call_tool("cancel_operation", {"operation_id": "op-nc1"}))
    assert result["decision"] == "refused"
    assert "no cancel call" in result["message"]
    assert person.questions == []
    assert [e for e in fake.log() if e["route"] == "cancel"] == []


@pytest.mark.both_engines
@pytest.mark.parametrize("era", ERAS)
async def test_an_approved_cancel_is_sent_once_and_recorded(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    person = Person("accept", {"decision": "cancel_at_provider"})
    h = make_harness(tmp_path, fake, table={"cancel": {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"}})
    async with h.client(elicitation_callback=person, **era) as client:
        stopped = await _exhaust(h, client, "c1")
        assert "cancel_operation" in stopped["allowed_actions"]
        assert any(o["action"] == "cancel_operation" for o in stopped["escalation"]["options"])
        result = view(await client.call_tool("cancel_operation", {"operation_id": "op-c1"}))
        assert result["decision"] == "done"
        assert result["provider_http_status"] == 202
        assert result["operation"]["status"] == "cancelled"
        assert "Cancel job c1" in person.questions[0]
        again = view(await client.call_tool("cancel_operation", {"operation_id": "op-c1"}))
        assert again["decision"] == "refused"
    assert len([e for e in fake.log() if e["route"] == "cancel"]) == 1


def _cancel_harness(tmp_path: Path, fake: FakeProvider) -> Harness:
    """A server whose table has [cancel], on the real clock, trusting the key `_cli` signs with."""
    h = make_harness(
        tmp_path,
        fake,
        clock=FakeClock(time.time()),
        table={"cancel": {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"}},
    )
    h.operator = make_operator(h.tmp / "operator").policy()
    return h


async def test_a_cancel_approved_by_an_operator_is_sent_on_the_next_call(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = _cancel_harness(tmp_path, fake)
    async with h.client() as client:
        await _exhaust(h, client, "c2")
        asked = view(await client.call_tool("cancel_operation", {"operation_id": "op-c2"}))
        assert asked["decision"] == "pending_approval"
        assert [e for e in fake.log() if e["route"] == "cancel"] == []
        assert _cli(h, "approve", asked["approval_id"]).returncode == 0
        sent = view(await client.call_tool("cancel_operation", {"operation_id": "op-c2"}))
    assert sent["decision"] == "done"
    assert len([e for e in fake.log() if e["route"] == "cancel"]) == 1


async def _approved_cancel_answered_slowly(h: Harness, client: Any, job: str, delay: float) -> None:
    """`op-<job>` stopped, its cancel approved by an operator; the provider answers the cancel `delay` s late."""
    h.fake.script_cancel(job, [http(202, body={"id": job, "state": "cancelled"}, delay_seconds=delay)])
    await _exhaust(h, client, job)
    asked = view(await client.call_tool("cancel_operation", {"operation_id": f"op-{job}"}))
    assert _cli(h, "approve", asked["approval_id"]).returncode == 0


async def test_one_approved_cancel_sends_one_cancel_call_when_two_calls_use_it_at_once(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = _cancel_harness(tmp_path, fake)
    async with h.client() as client:
        # The provider takes a while to answer the cancel: the second call reads the approval meanwhile.
        await _approved_cancel_answered_slowly(h, client, "c3", 0.3)
        decisions: list[str] = []

        async def cancel() -> None:
            decisions.append(
                view(await client.call_tool("cancel_operation", {"operation_id": "op-c3"}))["decision"]
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel)
            tg.start_soon(cancel)
    assert sorted(decisions) == ["done", "refused"]
    assert len([e for e in fake.log() if e["route"] == "cancel"]) == 1


async def test_an_approved_cancel_whose_call_the_client_gives_up_on_is_still_recorded_once_sent(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = _cancel_harness(tmp_path, fake)
    async with h.client() as client:
        await _approved_cancel_answered_slowly(h, client, "c4", 0.5)
        with anyio.CancelScope() as gave_up:

            async def give_up_once_the_call_is_out() -> None:
                for _ in range(500):  # bounded: 5 s
                    if [e for e in fake.log() if e["route"] == "cancel"]:
                        gave_up.cancel()
                        return
                    await anyio.sleep(0.01)

            async with anyio.create_task_group() as tg:
                tg.start_soon(give_up_once_the_call_is_out)
                await client.call_tool("cancel_operation", {"operation_id": "op-c4"})
        for _ in range(500):  # the server records the provider's answer after the client left
            if db_rows(h.db_path, "SELECT 1 FROM followups"):
                break
            await anyio.sleep(0.01)
        after = view(await client.call_tool("get_operation", {"operation_id": "op-c4"}))
    followups = db_rows(h.db_path, "SELECT status, http_status FROM followups")
    assert followups == [{"status": "done", "http_status": 202}]
    assert after["status"] == "cancelled"
    assert len([e for e in fake.log() if e["route"] == "cancel"]) == 1


async def test_the_person_sees_when_the_new_deadline_would_fall_after_the_business_deadline(
    tmp_path: Path, fake: FakeProvider
) -> None:
    from pollwarden.core.timefmt import iso

    person = Person("accept", {"decision": "deny"})
    h = make_harness(tmp_path, fake)
    fake.script("biz1", [pending("running")])
    business = iso(h.clock.now() + 600)
    async with h.client(elicitation_callback=person) as client:
        await client.call_tool(
            "start_operation",
            {
                "provider": "acme",
                "operation_id": "op-biz1",
                "provider_job_id": "biz1",
                "max_status_requests": 1,
                "business_deadline_at": business,
            },
        )
        stopped = view(
            await client.call_tool("check_status", {"operation_id": "op-biz1", "wait_seconds": 30})
        )
        assert stopped["stop_reason"] == "request_budget_exhausted"
        assert stopped["business_deadline_at"] == business
        await client.call_tool("request_extension", _extend("biz1", seconds=1800, requests=4))
    question = person.questions[0]
    assert "Impact: the new deadline falls after the business deadline" in question
    assert "waiting stops at the business deadline" in question


async def test_no_cancel_is_sent_when_the_tables_account_changed_since_the_operation_was_recorded(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table={"cancel": {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"}})
    async with h.client() as client:
        await _exhaust(h, client, "acct")
    # The table now points at another origin (another account): the same host by another name.
    h.table = {**h.table, "base_url": fake.base_url.replace("127.0.0.1", "localhost")}
    person = Person("accept", {"decision": "cancel_at_provider"})
    async with h.client(elicitation_callback=person) as client:
        result = view(await client.call_tool("cancel_operation", {"operation_id": "op-acct"}))
    assert result["decision"] == "refused"
    assert "account_context_changed" in result["message"]
    assert [e for e in fake.log() if e["route"] == "cancel"] == []
