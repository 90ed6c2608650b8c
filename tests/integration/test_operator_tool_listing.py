"""Operator tools are for operators (issue 31, item 11): listed only to operator principals, in both eras."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import make_harness, view
from tests.integration.test_owners_and_scopes import ERAS, start_args, team
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is which tools are listed (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

OPERATOR_TOOLS = {"list_approvals", "decide_approval"}


async def tool_names(client: Any) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


@pytest.mark.parametrize("era", ERAS)
async def test_the_stdio_agent_is_not_shown_the_operator_tools_and_their_refusal_hands_it_no_command(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client(**era) as client:
        names = await tool_names(client)
        refused = await client.call_tool("list_approvals", {})
    assert "start_operation" in names
    assert not names & OPERATOR_TOOLS
    assert refused.is_error
    text = json.dumps([getattr(b, "text", "") for b in refused.content])
    assert "operator console" in text
    assert "pollwarden approve" not in text
    assert "pollwarden approvals" not in text
    assert "`" not in text


@pytest.mark.parametrize("era", ERAS)
async def test_over_bearer_auth_only_operator_principals_are_shown_the_operator_tools(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    async with team(tmp_path, fake) as t:
        async with t.as_("alice", **era) as alice:
            agents = await tool_names(alice)
        async with t.as_("ops", **era) as ops:
            operators = await tool_names(ops)
    assert not agents & OPERATOR_TOOLS
    assert operators >= OPERATOR_TOOLS


async def test_a_bearer_agent_is_told_an_operator_decides_not_that_its_client_cannot_ask(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("why", [pending("running")])
    async with team(tmp_path, fake) as t, t.as_("alice") as alice:
        view(await alice.call_tool("start_operation", start_args("w", "why", max_status_requests=1)))
        view(await alice.call_tool("check_status", {"operation_id": "w", "wait_seconds": 30}))
        asked = view(
            await alice.call_tool(
                "request_extension",
                {"operation_id": "w", "extra_seconds": 60, "extra_status_requests": 1, "reason": "r"},
            )
        )
    assert asked["decision"] == "pending_approval"
    assert "an operator decides every approval" in asked["message"]
    assert "cannot show them the question" not in asked["message"]
