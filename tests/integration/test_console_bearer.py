"""The console with operators' bearer tokens (`pollwarden console --auth-tokens FILE`) and the owner filter.

A team over real HTTP (tests/integration/test_owners_and_scopes.py's `team`): alice and bob hold
pollwarden:agent tokens, ops and carol pollwarden:operator tokens, all in one token file made with
`pollwarden tokens add`. Their operations are stored under their names; the console, on the same
database and token file, is read with an HTTP client sending `Authorization: Bearer`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest

from harness import Harness, db_rows, view
from pollwarden.access.auth import TokenFileVerifier
from pollwarden.audit.chain import read_rows
from pollwarden.console.app import ConsoleSettings, create_app
from pollwarden.console.cli import running_console
from pollwarden.surface.http_serve import HttpOptions, transport_security
from tests.integration.test_owners_and_scopes import Team, start_args, team
from tests.support.console import console_at_terminal
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is the console's bearer tokens (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


@asynccontextmanager
async def console(h: Harness, tokens: Path | None) -> AsyncGenerator[str]:
    """The console on the team's database, taking bearer tokens from `tokens`; its base URL."""
    settings = ConsoleSettings(
        config=h.config(),
        login_token=secrets.token_urlsafe(24),
        allowed_hosts=tuple(transport_security(HttpOptions(port=0)).allowed_hosts or ()),
        clock=h.clock,
        verifier=TokenFileVerifier(tokens) if tokens is not None else None,
    )
    async with running_console(create_app(settings), HttpOptions(port=0)) as root:
        yield root + settings.prefix


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def listed(html: str) -> list[str]:
    return re.findall(r'data-operation="([^"]+)"', html)


@asynccontextmanager
async def waiting(tmp_path: Path, fake: FakeProvider, *started: tuple[str, str]) -> AsyncGenerator[Team]:
    """The team, after each (principal, operation) started a queued job, one second apart, in that order."""
    async with team(tmp_path, fake) as t:
        for who, op in started:
            fake.script(f"job-{op}", [pending("queued")])
            async with t.as_(who) as client:
                view(await client.call_tool("start_operation", start_args(op, f"job-{op}")))
            t.s.h.clock.advance(1)
        yield t


async def stuck_asking(t: Team, who: str, op: str) -> str:
    """`who`'s operation stops on a budget of 1 and asks for more: the approval a person must decide."""
    t.s.h.fake.script(f"job-{op}", [pending("running")])
    async with t.as_(who) as client:
        view(await client.call_tool("start_operation", start_args(op, f"job-{op}", max_status_requests=1)))
        view(await client.call_tool("check_status", {"operation_id": op, "wait_seconds": 30}))
        asked = view(
            await client.call_tool(
                "request_extension",
                {"operation_id": op, "extra_seconds": 60, "extra_status_requests": 2, "reason": "more"},
            )
        )
    assert asked["decision"] == "pending_approval"
    return str(asked["approval_id"])


async def test_an_operators_token_opens_the_console_an_agents_is_refused_with_403_and_a_wrong_one_with_401(
    tmp_path: Path, fake: FakeProvider
) -> None:
    async with waiting(tmp_path, fake, ("alice", "a1")) as t:
        async with console(t.s.h, tmp_path / "tokens") as base, httpx2.AsyncClient() as client:
            seen = await client.get(base + "/", headers=bearer(t.tokens["ops"]))
            assert seen.status_code == 200
            assert listed(seen.text) == ["@alice/a1"]
            assert "deciding as ops (console) · http-operator" in seen.text
            agent = await client.get(base + "/", headers=bearer(t.tokens["alice"]))
            assert agent.status_code == 403
            assert (
                'error="insufficient_scope", scope="pollwarden:operator"' in agent.headers["www-authenticate"]
            )
            assert "@alice/a1" not in agent.text
            wrong = await client.get(base + "/", headers=bearer("pwt_" + "x" * 43))
            assert wrong.status_code == 401
            assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
            for path in ("/approvals", "/providers", "/audit", "/operation?id=@alice/a1"):
                assert (await client.get(base + path, headers=bearer(t.tokens["alice"]))).status_code == 403
                assert (await client.get(base + path, headers=bearer(t.tokens["carol"]))).status_code == 200
            assert (await client.get(base + "/")).status_code == 401  # neither token nor cookie
        # A console started without --auth-tokens takes no token at all, an operator's included.
        async with console(t.s.h, None) as base, httpx2.AsyncClient() as client:
            refused = await client.get(base + "/", headers=bearer(t.tokens["ops"]))
            assert refused.status_code == 401
            assert "--auth-tokens FILE" in refused.text


async def test_the_operations_page_filters_by_the_principal_that_started_each_operation(
    tmp_path: Path, fake: FakeProvider
) -> None:
    started = (("alice", "a1"), ("bob", "b1"), ("alice", "a2"))
    async with (
        waiting(tmp_path, fake, *started) as t,
        console(t.s.h, tmp_path / "tokens") as base,
        httpx2.AsyncClient() as client,
    ):
        everyone = await client.get(base + "/", headers=bearer(t.tokens["ops"]))
        assert listed(everyone.text) == ["@alice/a2", "@bob/b1", "@alice/a1"]
        assert re.findall(r'<option value="([^"]*)"', everyone.text.split('name="owner"')[1])[:3] == [
            "",
            "alice",
            "bob",
        ]
        alices = await client.get(base + "/?owner=alice", headers=bearer(t.tokens["ops"]))
        assert listed(alices.text) == ["@alice/a2", "@alice/a1"]
        assert "2 operations" in alices.text
        assert '<option value="alice" selected>' in alices.text
        both = await client.get(base + "/?owner=bob&status=waiting", headers=bearer(t.tokens["ops"]))
        assert listed(both.text) == ["@bob/b1"]
        assert listed((await client.get(base + "/?owner=nobody", headers=bearer(t.tokens["ops"]))).text) == []


async def test_an_operator_decides_with_a_bearer_token_by_name_but_never_on_an_operation_they_started(
    tmp_path: Path, fake: FakeProvider
) -> None:
    async with team(tmp_path, fake) as t:
        alices = await stuck_asking(t, "alice", "big")
        carols = await stuck_asking(t, "carol", "mine")
        async with console(t.s.h, tmp_path / "tokens") as base, httpx2.AsyncClient() as client:
            decide = base + "/approvals/decide"
            agent = await client.post(
                decide, data={"approval_id": alices, "decision": "approve"}, headers=bearer(t.tokens["alice"])
            )
            assert agent.status_code == 403
            own = await client.post(
                decide, data={"approval_id": carols, "decision": "approve"}, headers=bearer(t.tokens["carol"])
            )
            assert own.status_code == 403
            assert "another operator must decide it" in own.text
            # A header is no ambient credential: no CSRF token needed, and the answer is the outcome itself.
            approved = await client.post(
                decide, data={"approval_id": alices, "decision": "approve"}, headers=bearer(t.tokens["carol"])
            )
            assert approved.status_code == 200
            assert f'{alices} approved for "@alice/big" by "carol (console)" (http-operator)' in approved.text
            again = await client.post(
                decide, data={"approval_id": alices, "decision": "deny"}, headers=bearer(t.tokens["ops"])
            )
            assert again.status_code == 409  # decided once
        (row,) = db_rows(t.s.h.database, "SELECT status FROM approvals WHERE approval_id = ?", carols)
        assert row["status"] == "pending"
    granted = [r.payload_obj for r in read_rows(t.s.h.db_path, "@alice/big") if r.kind == "approval_granted"]
    assert [(g["note"], g["authenticated_by"]) for g in granted] == [
        (f"{alices} by carol (console)", "http-operator")
    ]


async def test_pollwarden_console_with_auth_tokens_accepts_an_operators_token_from_the_file(
    tmp_path: Path, fake: FakeProvider
) -> None:
    async with waiting(tmp_path, fake, ("bob", "t1")) as t:
        tokens = tmp_path / "tokens"
        async with (
            console_at_terminal(t.s.h.database, "--auth-tokens", str(tokens)) as (_, shown),
            httpx2.AsyncClient() as client,
        ):
            found = re.search(r"(http://127\.0\.0\.1:\d+/c/[\w-]+)/login\?token=", shown)
            assert found is not None, shown
            assert f"operators' bearer tokens from {tokens} (scope pollwarden:operator) are accepted" in shown
            page = await client.get(found.group(1) + "/", headers=bearer(t.tokens["ops"]))
            assert page.status_code == 200
            assert listed(page.text) == ["@bob/t1"]
            assert (
                await client.get(found.group(1) + "/", headers=bearer(t.tokens["bob"]))
            ).status_code == 403
