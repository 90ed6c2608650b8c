"""Approval by consequence: a table may require a person for every status request (a high-privilege status API).

The default stays "routine polls inside approved bounds need no click". With
`[approval] every_status_request = true` check_status asks before each send, in
both protocol eras; a refusal, a dismissed question or a client that cannot ask
sends nothing, and an operator's approval lets the next check send one request.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp.client import ClientRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitRequestParams, ElicitResult

from harness import Harness, acme_refusal, acme_table, make_harness, make_operator, view
from pollwarden.audit.chain import read_rows
from pollwarden.core.clock import FakeClock
from pollwarden.core.records import ApprovalRecord
from pollwarden.core.vocabulary import ApprovalStatus
from pollwarden.flows.status_approval import StatusRequestFlow, plan
from pollwarden.store import Store
from pollwarden.surface.server import controller_factory
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is a table's approval policy and its questions (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]
EVERY = {"approval": {"every_status_request": True}}


class Person:
    """An elicitation callback that answers as told and remembers what it was asked."""

    def __init__(self, action: str, content: dict[str, Any] | None = None) -> None:
        self.action = action
        self.content = content
        self.questions: list[str] = []

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        self.questions.append(params.message)
        return ElicitResult(action=self.action, content=self.content)  # type: ignore[arg-type]


async def started(client: Any, job: str) -> None:
    args = {"provider": "acme", "operation_id": f"op-{job}", "provider_job_id": job}
    view(await client.call_tool("start_operation", args))


async def check(client: Any, job: str, wait: float = 30) -> dict[str, Any]:
    return view(await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": wait}))


@pytest.mark.parametrize("era", ERAS)
async def test_each_status_request_is_sent_only_after_a_person_approves_it(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    person = Person("accept", {"decision": "send"})
    h = make_harness(tmp_path, fake, table=EVERY)
    fake.script("every", [pending("running")])
    async with h.client(elicitation_callback=person, **era) as client:
        await started(client, "every")
        first = await check(client, "every")
        second = await check(client, "every")
    assert (first["outcome"], second["outcome"]) == ("polled", "polled")
    assert len(fake.status_requests("every")) == 2
    assert len(person.questions) == 2
    lines = person.questions[0].splitlines()
    assert lines[0] == "Approve one status request to acme?"
    assert "Status requests: 0 of 12 used; this would be number 1" in lines
    assert "Status requests: 1 of 12 used; this would be number 2" in person.questions[1]
    approved = [r for r in read_rows(h.db_path, "op-every") if r.kind == "status_request_approved"]
    assert [r.payload_obj["authenticated_by"] for r in approved] == ["elicitation", "elicitation"]


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(
    ("action", "content", "said"),
    [
        ("accept", {"decision": "skip"}, "the person denied it"),
        ("decline", None, "the person denied it"),
        ("cancel", None, "dismissed the question without an answer"),
    ],
)
async def test_a_refused_or_unanswered_question_sends_nothing(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any], action: str, content: Any, said: str
) -> None:
    h = make_harness(tmp_path, fake, table=EVERY)
    fake.script("no", [pending("running")])
    async with h.client(elicitation_callback=Person(action, content), **era) as client:
        await started(client, "no")
        refused = await check(client, "no")
    assert refused["outcome"] == "not_yet"
    assert refused["status_requests_used"] == 0
    assert said in refused["message"]
    assert refused["message"].startswith("Nothing was sent")
    assert fake.status_requests("no") == []


async def test_the_default_needs_no_click_for_routine_polls(tmp_path: Path, fake: FakeProvider) -> None:
    person = Person("accept", {"decision": "send"})
    h = make_harness(tmp_path, fake)
    fake.script("routine", [pending("running")])
    async with h.client(elicitation_callback=person) as client:
        await started(client, "routine")
        assert (await check(client, "routine"))["outcome"] == "polled"
    assert person.questions == []


async def test_nobody_is_asked_when_no_request_would_go_out(tmp_path: Path, fake: FakeProvider) -> None:
    person = Person("accept", {"decision": "send"})
    h = make_harness(tmp_path, fake, table=EVERY)
    async with h.client(elicitation_callback=person) as client:
        await started(client, "early")
        early = await check(client, "early", wait=0)  # the first check is allowed 5 s after the start
    assert early["outcome"] == "not_yet"
    assert person.questions == []
    assert fake.status_requests("early") == []


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


async def test_without_elicitation_an_operator_approves_one_request_at_a_time(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=EVERY, clock=FakeClock(time.time()))
    h.operator = make_operator(h.tmp / "operator").policy()  # the server trusts the key _cli signs with
    fake.script("op", [pending("running")])
    async with h.client() as client:
        await started(client, "op")
        held = await check(client, "op")
        assert held["outcome"] == "not_yet"
        assert "A person must decide" in held["message"]
        assert fake.status_requests("op") == []
        again = await check(client, "op")  # still waiting for the operator: the same approval, nothing sent
        assert fake.status_requests("op") == []
        listed = _cli(h, "approvals", "list")
        assert listed.stdout.count("asks to send one status request") == 1, listed.stdout
        approval_id = listed.stdout.split()[0]
        assert approval_id in again["message"]
        assert _cli(h, "approve", approval_id).returncode == 0
        sent = await check(client, "op")
        assert sent["outcome"] == "polled"
        assert len(fake.status_requests("op")) == 1
        after = await check(client, "op", wait=30)  # the next request needs a new approval
        assert after["outcome"] == "not_yet"
    assert len(fake.status_requests("op")) == 1


async def test_a_send_that_comes_after_the_client_stopped_waiting_is_told_as_such_and_sends_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    gate = anyio.Event()

    async def late_person(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        await gate.wait()
        return ElicitResult(action="accept", content={"decision": "send"})

    h = make_harness(tmp_path, fake, table=EVERY)
    fake.script("late", [pending("running")])
    async with h.client(elicitation_callback=late_person, mode="legacy") as client:
        await started(client, "late")
        with pytest.raises(MCPError, match="timed out"):
            await client.call_tool(
                "check_status", {"operation_id": "op-late", "wait_seconds": 30}, read_timeout_seconds=0.3
            )
        gate.set()  # the person says send after the client gave up on the call
        rows: list[Any] = []
        for _ in range(1000):  # the row lands in the database after the call ended: look for 10 s at most
            rows = [r for r in read_rows(h.db_path, "op-late") if r.kind == "status_request_unanswered"]
            if rows:
                break
            await anyio.sleep(0.01)
    assert "(the person answered send); nothing was sent" in rows[0].payload_obj["note"]
    assert "dismissed" not in rows[0].payload_obj["note"]
    assert fake.status_requests("late") == []


class UsedMeanwhile:
    """A store on which another call uses an operator's approval right after this call read it."""

    def __init__(self, store: Store, at: float) -> None:
        self._store = store
        self._at = at

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        read = await self._store.get_approval(approval_id)
        other = await self._store.close_approval(
            approval_id, status=ApprovalStatus.APPLIED, at=self._at, note="used by the other call"
        )
        assert other is not None  # the other call won the claim
        return read


async def test_two_calls_that_read_one_operator_approval_at_once_send_one_request(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=EVERY, clock=FakeClock(time.time()))
    h.operator = make_operator(h.tmp / "operator").policy()
    fake.script("op", [pending("running")])
    async with h.client() as client:
        await started(client, "op")
        await check(client, "op")  # opens the question for an operator
        approval_id = _cli(h, "approvals", "list").stdout.split()[0]
        assert _cli(h, "approve", approval_id).returncode == 0
    factory = controller_factory(h.config(), clock=h.clock, rng=h.rng, environ=h.environ)
    async with factory() as controller:
        planned = await plan(controller, "op-op", wait_seconds=30)
        assert planned.operator_approval_id == approval_id
        racing = replace(controller, store=cast(Store, UsedMeanwhile(controller.store, h.clock.now())))
        late = await StatusRequestFlow().ask_operator(racing, planned)
    assert late.granted is False  # the approval bought the other call's request, not this one too
    assert "A person must decide" in (late.refusal or "")
    assert fake.status_requests("op") == []


def test_the_approval_table_is_validated_like_the_rest(tmp_path: Path) -> None:
    assert acme_table(tmp_path, EVERY).approval.every_status_request is True
    assert acme_table(tmp_path, {}).approval.every_status_request is False
    wrong_type = acme_refusal(tmp_path, {"approval": {"every_status_request": "yes"}})
    assert "every_status_request" in str(wrong_type)
    unknown = acme_refusal(tmp_path, {"approval": {"every_poll": True}})
    assert "every_poll" in str(unknown)
