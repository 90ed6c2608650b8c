"""The wait and approval card (MCP Apps) through the SDK's real client: the tools, the policy, the audit.

A client that negotiated `io.modelcontextprotocol/ui` gets the card's `ui://` page and its app-only tools;
one that did not sees today's tool list and results. Approve/Deny on the card go through the one decision
path, audited as ``app``, and the agent's next check_status applies them. The card in a real browser host
is tests/integration/test_app_card_host.py. SQLite only: the decision's store writes are the
both-engine approval tests' (tests/integration/test_approvals.py, test_engine_conformance.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.client import Client
from mcp.client.extension import advertise

from harness import Harness, make_harness, view
from pollwarden.access.auth import TokenFileVerifier
from pollwarden.access.operator_keys import OperatorPolicy
from pollwarden.audit.chain import read_rows
from pollwarden.surface.app_card import APP_ONLY_TOOLS, CARD_URI
from tests.integration.test_http_auth import AGENT, add_token, served
from tests.support.auth_helpers import bearer_client
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is the MCP Apps card and its tools (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

APPS = advertise("io.modelcontextprotocol/ui", {"mimeTypes": ["text/html;profile=mcp-app"]})
CARD_TOOLS = {"start_operation", "check_status", "get_operation", "request_extension", "cancel_operation"}
HOSTILE_REASON = '<img src=x onerror="parent.__pwned=1">please'


def apps_client(h: Harness, **kwargs: Any) -> Any:
    return Client(h.server(), extensions=[APPS], **kwargs)


async def escalated_with_question(h: Harness, job: str = "j1", reason: str = HOSTILE_REASON) -> str:
    """Budget 1 used up, then the agent asks for more from a client without a prompt: a pending approval."""
    h.fake.script(job, [pending("running")])
    async with h.client() as agent:
        view(
            await agent.call_tool(
                "start_operation",
                {
                    "provider": "acme",
                    "operation_id": f"op-{job}",
                    "provider_job_id": job,
                    "max_status_requests": 1,
                },
            )
        )
        stopped = view(
            await agent.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 30})
        )
        assert stopped["stop_reason"] == "request_budget_exhausted"
        asked = view(
            await agent.call_tool(
                "request_extension",
                {
                    "operation_id": f"op-{job}",
                    "extra_seconds": 60,
                    "extra_status_requests": 2,
                    "reason": reason,
                },
            )
        )
    assert asked["decision"] == "pending_approval"
    return str(asked["approval_id"])


def audit_of(h: Harness, job: str, kind: str) -> list[dict[str, Any]]:
    return [row.payload_obj for row in read_rows(h.db_path, f"op-{job}") if row.kind == kind]


@pytest.mark.parametrize("mode", ["legacy", "modern"])
async def test_a_client_without_apps_sees_todays_tool_list_and_cannot_call_the_cards_tools(
    tmp_path: Path, fake: FakeProvider, mode: str
) -> None:
    h = make_harness(tmp_path, fake)
    kwargs: dict[str, Any] = {"mode": "legacy"} if mode == "legacy" else {}
    async with h.client(**kwargs) as plain:
        tools = (await plain.list_tools()).tools
        assert {t.name for t in tools}.isdisjoint(APP_ONLY_TOOLS)
        assert all(not (t.meta or {}).get("ui") for t in tools)
        refused = await plain.call_tool("app_card_state", {"operation_id": "op-x"})
        assert refused.is_error


@pytest.mark.parametrize("mode", ["legacy", "modern"])
async def test_an_apps_client_gets_the_card_page_with_a_strict_csp_and_the_app_only_tools(
    tmp_path: Path, fake: FakeProvider, mode: str
) -> None:
    h = make_harness(tmp_path, fake)
    kwargs: dict[str, Any] = {"mode": "legacy"} if mode == "legacy" else {}
    async with apps_client(h, **kwargs) as host:
        tools = {t.name: t for t in (await host.list_tools()).tools}
        for name in CARD_TOOLS:
            assert (tools[name].meta or {})["ui"] == {"resourceUri": CARD_URI}, name
        for name in APP_ONLY_TOOLS:
            assert (tools[name].meta or {})["ui"]["visibility"] == ["app"], name
        [page] = (await host.read_resource(CARD_URI)).contents
        assert page.mime_type == "text/html;profile=mcp-app"
        csp = (page.meta or {})["ui"]["csp"]
        assert all(domains == [] for domains in csp.values())
        text = getattr(page, "text", "")
        assert "innerHTML" not in text
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text


async def test_the_results_a_client_without_apps_gets_are_the_same_as_an_apps_client_gets(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    fake.script("same", [pending("queued")])
    arguments = {"provider": "acme", "operation_id": "op-same", "provider_job_id": "same"}
    async with h.client() as plain, apps_client(h) as host:
        first = await plain.call_tool("start_operation", arguments)
        again = await host.call_tool("start_operation", arguments)
        assert first.structured_content == again.structured_content
        assert first.content == again.content


async def test_the_card_shows_the_question_a_person_would_be_asked_with_the_reason_apart(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    approval_id = await escalated_with_question(h)
    async with apps_client(h) as host:
        card = view(await host.call_tool("app_card_state", {"operation_id": "op-j1"}))
    [asked] = card["approvals"]
    assert asked["approval_id"] == approval_id
    assert asked["reason"] == HOSTILE_REASON
    assert asked["question"].startswith("Approve more waiting for op-j1?")
    assert card["operation"]["status"] == "escalated"
    assert card["chart"]["budget_used"] == 1
    assert card["app_channel"] is False  # not opted in: shown, not offered
    assert "--approval app" in card["app_channel_note"]


async def test_approve_on_the_card_is_audited_as_app_and_the_agents_next_check_status_applies_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    h.app_channel = True
    approval_id = await escalated_with_question(h)
    async with apps_client(h) as host:
        decided = view(
            await host.call_tool("app_decide_approval", {"approval_id": approval_id, "decision": "approve"})
        )
        assert decided["decided"] is True
        assert decided["status"] == "approved"
        assert decided["card"]["approvals"] == []
        twice = view(
            await host.call_tool("app_decide_approval", {"approval_id": approval_id, "decision": "deny"})
        )
        assert twice["decided"] is False
        assert "already approved; nothing changed" in twice["message"]
    [recorded] = audit_of(h, "j1", "approval_granted")
    assert recorded["authenticated_by"] == "app"
    async with h.client() as agent:
        after = view(await agent.call_tool("check_status", {"operation_id": "op-j1"}))
    assert after["max_status_requests"] == 3
    [applied] = audit_of(h, "j1", "extension_approved")
    assert applied["authenticated_by"] == "app"


async def test_deny_on_the_card_changes_nothing_and_the_agent_sees_the_denial(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    h.app_channel = True
    approval_id = await escalated_with_question(h)
    async with apps_client(h) as host:
        denied = view(
            await host.call_tool("app_decide_approval", {"approval_id": approval_id, "decision": "deny"})
        )
    assert denied["status"] == "denied"
    async with h.client() as agent:
        after = view(await agent.call_tool("check_status", {"operation_id": "op-j1"}))
    assert (after["status"], after["max_status_requests"]) == ("escalated", 1)
    assert audit_of(h, "j1", "extension_approved") == []


async def test_the_card_cannot_decide_where_the_operator_requires_a_key_and_nothing_is_recorded(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    h.app_channel = True
    h.operator = OperatorPolicy(require_key=True)
    approval_id = await escalated_with_question(h)
    async with apps_client(h) as host:
        card = view(await host.call_tool("app_card_state", {"operation_id": "op-j1"}))
        refused = await host.call_tool(
            "app_decide_approval", {"approval_id": approval_id, "decision": "approve"}
        )
    assert card["app_channel"] is False
    assert "operator key" in card["app_channel_note"]
    assert refused.is_error
    assert "Nothing was decided" in str(refused.content)
    assert audit_of(h, "j1", "approval_granted") == []


async def test_a_card_decision_recorded_before_the_operator_required_a_key_is_refused_when_applied(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    h.app_channel = True
    approval_id = await escalated_with_question(h)
    async with apps_client(h) as host:
        view(await host.call_tool("app_decide_approval", {"approval_id": approval_id, "decision": "approve"}))
    h.operator = OperatorPolicy(require_key=True)
    async with h.client() as agent:
        after = view(await agent.call_tool("check_status", {"operation_id": "op-j1"}))
    assert after["max_status_requests"] == 1
    [refusal] = audit_of(h, "j1", "approval_refused")
    assert refusal["authenticated_by"] == "app"


async def test_on_an_authenticated_http_server_an_agent_principal_is_never_offered_the_cards_decision(
    tmp_path: Path, fake: FakeProvider
) -> None:
    tokens = tmp_path / "tokens"
    alice = add_token(tokens, "alice", AGENT)
    h = make_harness(tmp_path, fake)
    h.app_channel = True
    fake.script("team-1", [pending("running")])
    async with (
        served(h, lambda _: TokenFileVerifier(tokens)) as s,
        bearer_client(s.url, alice, extensions=[APPS]) as agent,
    ):
        start = {
            "provider": "acme",
            "operation_id": "op-team-1",
            "provider_job_id": "team-1",
            "max_status_requests": 1,
        }
        view(await agent.call_tool("start_operation", start))
        view(await agent.call_tool("check_status", {"operation_id": "op-team-1", "wait_seconds": 30}))
        asked = view(
            await agent.call_tool(
                "request_extension",
                {
                    "operation_id": "op-team-1",
                    "extra_seconds": 60,
                    "extra_status_requests": 2,
                    "reason": "more",
                },
            )
        )
        card = view(await agent.call_tool("app_card_state", {"operation_id": "op-team-1"}))
        refused = await agent.call_tool(
            "app_decide_approval", {"approval_id": asked["approval_id"], "decision": "approve"}
        )
    assert [a["approval_id"] for a in card["approvals"]] == [asked["approval_id"]]
    assert card["app_channel"] is False
    assert "an operator decides" in card["app_channel_note"]
    assert refused.is_error
    assert [row.kind for row in read_rows(h.db_path) if row.kind == "approval_granted"] == []
