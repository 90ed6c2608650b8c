"""MCP Tasks (`serve --tasks`): a task is an operation, and its pollIntervalMs is the one the controller enforces.

The client is the SDK's own `Client` declaring the extension (tests/support/tasks_client.py); every task
message pollwarden sends is checked against the extension's published JSON schema.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from harness import Harness, db_rows, make_harness, view, write_table
from pollwarden.access.auth import AuthOptions, TokenFileVerifier, auth_settings
from pollwarden.access.operator_keys import OperatorPolicy
from pollwarden.surface.http_serve import HttpOptions, transport_security
from pollwarden.surface.server import build_server, controller_factory
from tests.integration.test_http_auth import AGENT, add_token
from tests.support.auth_helpers import bearer_client, serving
from tests.support.fake_provider import FakeProvider, pending, succeeded
from tests.support.ports import free_port
from tests.support.tasks_client import TasksClientExtension, cancel_task, get_task, start_as_task, update_task

# SQLite only: the subject is the MCP Tasks protocol (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

CANCEL = {"cancel": {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"}}


def tasks_harness(tmp_path: Path, fake: FakeProvider, table: dict[str, Any] | None = None) -> Harness:
    h = make_harness(tmp_path, fake, table=table)
    h.tasks = True
    return h


@asynccontextmanager
async def task_client(h: Harness) -> AsyncGenerator[Client]:
    async with h.client(extensions=[TasksClientExtension()]) as client:
        yield client


def start_args(job: str) -> dict[str, Any]:
    return {"provider": "acme", "operation_id": f"op-{job}", "provider_job_id": job}


async def test_a_start_by_a_task_client_answers_with_a_task_whose_interval_is_the_time_to_the_first_check(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j1", [pending("running")])
    h = tasks_harness(tmp_path, fake)
    async with task_client(h) as client:
        task = await start_as_task(client, start_args("j1"))
        record = db_rows(h.db_path, "SELECT next_check_at, started_at FROM operations")[0]
    assert task["resultType"] == "task"
    assert task["taskId"] == "op-j1"
    assert task["status"] == "working"
    assert task["ttlMs"] is None  # the operation's record, and so its task, is kept for good
    assert task["pollIntervalMs"] == pytest.approx((record["next_check_at"] - h.clock.now()) * 1000, abs=1)
    assert task["pollIntervalMs"] > 0
    assert fake.status_requests("j1") == []


async def test_tasks_get_before_the_allowed_time_sends_nothing_and_at_it_sends_the_one_request(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j2", [pending("running")])
    h = tasks_harness(tmp_path, fake)
    async with task_client(h) as client:
        task = await start_as_task(client, start_args("j2"))
        told = task["pollIntervalMs"] / 1000
        h.clock.advance(told - 0.01)
        early = await get_task(client, "op-j2")
        assert early["status"] == "working"
        assert fake.status_requests("j2") == []
        assert early["pollIntervalMs"] == pytest.approx(10, abs=1)  # the rest of the same wait, not a new one
        h.clock.advance(early["pollIntervalMs"] / 1000)
        polled = await get_task(client, "op-j2")
        assert len(fake.status_requests("j2")) == 1
        assert polled["status"] == "working"
        assert polled["pollIntervalMs"] > 0


async def test_a_thousand_tasks_get_in_a_tight_loop_cause_at_most_the_budget_and_never_before_the_told_time(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j3", [pending("running")])
    h = tasks_harness(tmp_path, fake, table={"limits": {"default_max_status_requests": 6}})
    sent_at: list[float] = []
    allowed_at = 0.0
    async with task_client(h) as client:
        task = await start_as_task(client, start_args("j3"))
        allowed_at = h.clock.now() + task["pollIntervalMs"] / 1000
        for _ in range(1000):
            h.clock.advance(0.25)
            before = len(fake.status_requests("j3"))
            got = await get_task(client, "op-j3")
            if len(fake.status_requests("j3")) > before:
                sent_at.append(h.clock.now())
                assert h.clock.now() >= allowed_at - 1e-6, "a request went out before the interval it told"
            if got["status"] == "working":
                allowed_at = h.clock.now() + got["pollIntervalMs"] / 1000
        story = await client.read_resource("pollwarden://operations/op-j3/audit")
    assert 1 <= len(sent_at) <= 6
    assert len(fake.status_requests("j3")) == len(sent_at)
    text = "".join(getattr(c, "text", "") for c in story.contents)
    refused = sum(int(n) for n in re.findall(r"refused (\d+) (?:early )?checks", text))
    assert refused + len(sent_at) == 1000  # every poll that sent nothing is counted, summarised in the story


async def test_a_succeeded_task_completes_with_the_validated_result_fetch_result_hands_over(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j4", [succeeded(result_url="https://files.example/j4.csv")])
    h = tasks_harness(tmp_path, fake)
    async with task_client(h) as client:
        task = await start_as_task(client, start_args("j4"))
        h.clock.advance(task["pollIntervalMs"] / 1000)
        done = await get_task(client, "op-j4")
        fetched = view(await client.call_tool("fetch_result", {"operation_id": "op-j4"}))
    assert done["status"] == "completed"
    result = done["result"]
    assert result["isError"] is False
    assert result["structuredContent"]["result"] == fetched["result"]
    assert result["structuredContent"]["result"]["result_url"] == "https://files.example/j4.csv"


async def _escalate(h: Harness, client: Client, job: str) -> dict[str, Any]:
    """Start `job` as a task and poll it until its budget of 1 is used: the task then asks the person."""
    task = await start_as_task(client, {**start_args(job), "max_status_requests": 1})
    h.clock.advance(task["pollIntervalMs"] / 1000)
    return await get_task(client, f"op-{job}")


async def test_after_the_budget_is_used_the_task_asks_the_person_and_an_approved_extension_applies(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j5", [pending("running")])
    h = tasks_harness(tmp_path, fake)
    async with task_client(h) as client:
        asked = await _escalate(h, client, "j5")
        assert asked["status"] == "input_required"
        (key, request), *others = asked["inputRequests"].items()
        assert others == []
        assert key.startswith("ap-")
        assert request["method"] == "elicitation/create"
        assert (
            "Status requests" in request["params"]["message"]
            or "status request" in request["params"]["message"]
        )
        assert request["params"]["requestedSchema"]["properties"]["decision"]["enum"] == ["approve", "deny"]
        again = await get_task(client, "op-j5")
        assert list(again["inputRequests"]) == [key]  # the same question, not a second one
        await update_task(client, "op-j5", {key: {"action": "accept", "content": {"decision": "approve"}}})
        resumed = await get_task(client, "op-j5")
        assert resumed["status"] == "working"
        h.clock.advance(resumed["pollIntervalMs"] / 1000)
        await get_task(client, "op-j5")
    assert len(fake.status_requests("j5")) == 2
    decided = db_rows(h.db_path, "SELECT status, decided_method FROM approvals")
    assert decided == [{"status": "applied", "decided_method": "task-input"}]


async def test_in_tool_confirmation_mode_tasks_get_sends_no_status_request_a_person_must_approve_unasked(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # tasks/get is a protocol request: no client prompt stood before it, so the table's "a person approves
    # every status request" is asked of a person (tasks/update), never taken as a tool confirmation.
    fake.script("tc", [pending("running")])
    h = tasks_harness(tmp_path, fake, table={"approval": {"every_status_request": True}})
    h.approval_mode = "tool-confirmation"
    async with task_client(h) as client:
        task = await start_as_task(client, start_args("tc"))
        for _ in range(3):
            h.clock.advance(task.get("pollIntervalMs", 0) / 1000 + 0.01)
            task = await get_task(client, "op-tc")
            assert task["status"] == "input_required"
        assert fake.status_requests("tc") == []
        (key, request), *others = task["inputRequests"].items()
        assert others == []
        assert request["params"]["requestedSchema"]["properties"]["decision"]["enum"][0] == "send"
        await update_task(client, "op-tc", {key: {"action": "accept", "content": {"decision": "send"}}})
        await get_task(client, "op-tc")
    assert len(fake.status_requests("tc")) == 1
    approved = db_rows(h.db_path, "SELECT decided_method FROM approvals")
    assert approved == [{"decided_method": "task-input"}]


async def test_a_denied_extension_ends_the_task_with_its_stop_reason_and_is_not_asked_again(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j6", [pending("running")])
    h = tasks_harness(tmp_path, fake)
    async with task_client(h) as client:
        asked = await _escalate(h, client, "j6")
        key = next(iter(asked["inputRequests"]))
        await update_task(client, "op-j6", {key: {"action": "accept", "content": {"decision": "deny"}}})
        ended = await get_task(client, "op-j6")
        ended_again = await get_task(client, "op-j6")
    assert ended["status"] == "completed"
    assert ended["result"]["isError"] is True
    assert ended["result"]["structuredContent"]["stop_reason"] == "request_budget_exhausted"
    assert ended_again["status"] == "completed"
    assert len(db_rows(h.db_path, "SELECT approval_id FROM approvals")) == 1
    assert len(fake.status_requests("j6")) == 1


async def test_tasks_cancel_asks_the_person_and_the_approved_cancel_is_sent_once(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j7", [pending("running")])
    h = tasks_harness(tmp_path, fake, table=CANCEL)
    async with task_client(h) as client:
        asked = await _escalate(h, client, "j7")
        extension_key = next(iter(asked["inputRequests"]))
        await update_task(client, "op-j7", {extension_key: {"action": "decline"}})
        await cancel_task(client, "op-j7")
        cancel_question = await get_task(client, "op-j7")
        assert cancel_question["status"] == "input_required"
        key, request = next(iter(cancel_question["inputRequests"].items()))
        assert "cancel_at_provider" in str(request["params"]["requestedSchema"])
        assert [e for e in fake.log() if e["route"] == "cancel"] == []  # nothing before a person approves
        answer = {key: {"action": "accept", "content": {"decision": "cancel_at_provider"}}}
        await update_task(client, "op-j7", answer)
        cancelled = await get_task(client, "op-j7")
        await get_task(client, "op-j7")
    assert cancelled["status"] == "cancelled"
    assert len([e for e in fake.log() if e["route"] == "cancel"]) == 1


async def test_tasks_cancel_of_a_waiting_operation_is_refused_with_the_reason(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j8", [pending("running")])
    h = tasks_harness(tmp_path, fake, table=CANCEL)
    async with task_client(h) as client:
        await start_as_task(client, start_args("j8"))
        with pytest.raises(MCPError) as refused:
            await cancel_task(client, "op-j8")
    assert "not cancelled" in refused.value.error.message
    assert [e for e in fake.log() if e["route"] == "cancel"] == []


async def test_where_the_operator_requires_a_key_the_chat_is_never_asked_and_answers_are_refused(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j9", [pending("running")])
    h = tasks_harness(tmp_path, fake)
    h.operator = OperatorPolicy(require_key=True)
    async with task_client(h) as client:
        ended = await _escalate(h, client, "j9")
        with pytest.raises(MCPError) as refused:
            await update_task(client, "op-j9", {"ap-0000000000": {"action": "accept", "content": {}}})
    assert ended["status"] == "completed"
    assert "operator key" in refused.value.error.message
    assert db_rows(h.db_path, "SELECT approval_id FROM approvals") == []


async def test_an_unknown_task_id_is_an_error(tmp_path: Path, fake: FakeProvider) -> None:
    h = tasks_harness(tmp_path, fake)
    async with task_client(h) as client:
        with pytest.raises(MCPError) as unknown:
            await get_task(client, "op-nobody")
    assert "unknown task" in unknown.value.error.message


async def test_clients_that_do_not_declare_tasks_and_2025_11_25_connections_see_todays_tools_only(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j10", [pending("running")])
    fake.script("j11", [pending("running")])
    h = tasks_harness(tmp_path, fake)
    async with h.client() as plain:
        started = view(await plain.call_tool("start_operation", start_args("j10")))
        assert started["status"] == "waiting"
    async with h.client(mode="legacy", extensions=[TasksClientExtension()]) as legacy:
        started = view(await legacy.call_tool("start_operation", start_args("j11")))
        assert started["status"] == "waiting"
        with pytest.raises(MCPError):
            await get_task(legacy, "op-j11")


async def test_a_server_without_tasks_advertises_none_and_answers_a_plain_start(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j12", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client(extensions=[TasksClientExtension()]) as client:
        started = view(await client.call_tool("start_operation", start_args("j12")))
        assert "io.modelcontextprotocol/tasks" not in (client.server_capabilities.extensions or {})
    assert started["status"] == "waiting"


async def test_over_authenticated_http_another_principals_task_is_unknown_and_an_agent_cannot_answer(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j13", [pending("running")])
    h = tasks_harness(tmp_path, fake)
    tokens = tmp_path / "tokens"
    alice, bob = add_token(tokens, "alice", AGENT), add_token(tokens, "bob", AGENT)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    write_table(h.tables_dir, h.table)
    factory = controller_factory(h.config(), clock=h.clock, rng=h.rng, environ=h.environ)
    server = build_server(
        factory,
        auth=auth_settings(AuthOptions(), resource_url=url),
        token_verifier=TokenFileVerifier(tokens),
        tasks=True,
    )
    app = server.streamable_http_app(transport_security=transport_security(HttpOptions(port=port)))
    async with serving(app, port):
        async with bearer_client(url, alice, extensions=[TasksClientExtension()]) as as_alice:
            task = await start_as_task(as_alice, {**start_args("j13"), "max_status_requests": 1})
            h.clock.advance(task["pollIntervalMs"] / 1000)
            waiting = await get_task(as_alice, "op-j13")
            with pytest.raises(MCPError) as refused:
                await update_task(as_alice, "op-j13", {"ap-0000000000": {"action": "accept", "content": {}}})
        async with bearer_client(url, bob, extensions=[TasksClientExtension()]) as as_bob:
            with pytest.raises(MCPError) as unknown:
                await get_task(as_bob, "op-j13")
    assert task["taskId"] == "op-j13"  # alice's own id, never the stored @alice/ form
    assert waiting["status"] == "completed"  # escalated: no question in the chat, an operator decides
    assert "operators decide" in refused.value.error.message
    assert "unknown task" in unknown.value.error.message
