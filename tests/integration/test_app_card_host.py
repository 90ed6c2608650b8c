"""The card in a real MCP Apps host: the ext-apps app-bridge in headless Chromium against `pollwarden serve`.

A real `pollwarden serve --transport http --approval app` (a child process) on the test's database; the
host (tests/support/app_host.py) reads the card's `ui://` resource through the SDK's HTTP client, renders
it in a sandboxed iframe at 320 px under the CSP the resource asks for, and forwards the page's tool calls
to the server. A person clicks Approve or Deny in the page; the agent's next check_status applies it.
Skipped, with the reason, where Chromium (or npm, to build the host) is missing; CI has both.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client import Client
from playwright.async_api import Frame

from harness import Harness, base_table, make_harness, make_operator, merge, view
from pollwarden.audit.chain import read_rows
from pollwarden.surface.app_card import APP_ONLY_TOOLS
from tests.integration.test_restart_and_transports import (
    FAST,
    child_process,
    free_port,
    serve_args,
    wait_until_listening,
)
from tests.support.app_host import (
    APPS,
    CARD_WIDTH,
    CardHost,
    axe_violations,
    card_host,
    dumps,
    host_missing,
    page_call,
)
from tests.support.browser import NO_CHROMIUM, chromium_path
from tests.support.fake_provider import FakeProvider, pending, succeeded
from tests.support.live import write_table

if chromium_path() is None:
    pytest.skip(NO_CHROMIUM, allow_module_level=True)
if (missing := host_missing()) is not None:
    pytest.skip(missing, allow_module_level=True)

# SQLite only: the subject is the card in a real MCP Apps host (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

HOSTILE_STATE = '<img src=x onerror="parent.__pwned=1"><script>parent.__pwned=2</script>'
HOSTILE_REASON = '</pre><img src=x onerror="parent.__pwned=3">need more'
# A table whose first check is minutes away: the card counts it down.
SLOW = {"schedule": {"base_delay_seconds": 600, "max_delay_seconds": 1200}}


@asynccontextmanager
async def host_on(h: Harness, tmp_path: Path, *extra: str) -> AsyncGenerator[CardHost]:
    """A browser host, and the MCP client it speaks for, on a fresh `pollwarden serve --approval app`.

    The server has the harness's fast `acme` table and a `slow` one.
    """
    write_table(h.tables_dir, merge(base_table(h.fake.base_url, "slow"), SLOW))
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    args = serve_args(h, "--transport", "http", "--port", str(port), "--approval", "app", *extra)
    with child_process(args, log) as proc:
        await wait_until_listening(proc, port, log)
        async with (
            Client(f"http://127.0.0.1:{port}/mcp", extensions=[APPS]) as client,
            card_host(client) as host,
        ):
            yield host
        assert proc.poll() is None, log.read_text()


async def agent_escalates(
    client: Client, job: str, reason: str = HOSTILE_REASON
) -> tuple[dict[str, Any], Any]:
    """Budget 1 used on a hostile provider state, then an extension asked where nobody can be prompted."""
    args = {"provider": "acme", "operation_id": f"op-{job}", "provider_job_id": job, "max_status_requests": 1}
    view(await client.call_tool("start_operation", args))
    stopped = view(await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 5}))
    assert stopped["status"] == "escalated", stopped
    arguments = {
        "operation_id": f"op-{job}",
        "extra_seconds": 600,
        "extra_status_requests": 2,
        "reason": reason,
    }
    asked = await client.call_tool("request_extension", arguments)
    assert view(asked)["decision"] == "pending_approval"
    return arguments, asked


def audit_of(h: Harness, job: str, kind: str) -> list[dict[str, Any]]:
    return [row.payload_obj for row in read_rows(h.db_path, f"op-{job}") if row.kind == kind]


async def assert_inert(frame: Frame) -> None:
    """Hostile text shows as text: no element it named exists, no script it carried ran."""
    assert await frame.locator("main img, main script").count() == 0
    assert await frame.evaluate("() => window.__pwned === undefined")
    assert await frame.page.evaluate("() => window.__pwned === undefined")


async def fits(frame: Frame) -> bool:
    return bool(await frame.evaluate(f"() => document.documentElement.scrollWidth <= {CARD_WIDTH}"))


async def test_the_card_renders_a_waiting_operations_countdown_from_the_ui_resource_in_a_real_host(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=FAST)
    fake.script("slow-1", [pending("queued")])
    async with host_on(h, tmp_path) as host:
        visible = await host.model_visible()
        assert "check_status" in visible
        assert set(visible).isdisjoint(APP_ONLY_TOOLS), visible
        arguments = {"provider": "slow", "operation_id": "op-slow-1", "provider_job_id": "slow-1"}
        started = await host.client.call_tool("start_operation", arguments)
        page, card = await host.show("start_operation", arguments, started)
        assert await card.inner_text("main h1 .badge") == "waiting"
        countdown = await card.inner_text("#countdown")
        assert re.fullmatch(r"\d+:\d\d", countdown), countdown
        minutes, seconds = countdown.split(":")
        assert 60 <= int(minutes) * 60 + int(seconds) <= 1200
        await card.wait_for_selector("svg.chart")  # refreshed through the app-only read tool
        assert host.calls == ["app_card_state"]  # the page never asks for a status request
        assert await fits(card)
        await host.snapshot(page, "waiting")
        assert await axe_violations(card) == []
        page, dark = await host.show("start_operation", arguments, started, theme="dark")
        assert await dark.evaluate("() => document.documentElement.dataset.theme") == "dark"
        assert await axe_violations(dark) == [], "dark mode"
        await host.snapshot(page, "waiting-dark")
    assert fake.status_requests("slow-1") == []


async def test_approve_in_the_card_is_audited_as_app_and_the_agents_next_check_status_applies_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=FAST)
    fake.script("esc-1", [pending(HOSTILE_STATE)])
    async with host_on(h, tmp_path) as host:
        arguments, asked = await agent_escalates(host.client, "esc-1")
        _, card = await host.show("request_extension", arguments, asked)
        question = await card.wait_for_selector("section.approval pre")
        assert question is not None
        assert "Approve more waiting for op-esc-1?" in await question.inner_text()
        assert HOSTILE_REASON in await card.inner_text("section.approval blockquote")
        assert HOSTILE_STATE in await card.inner_text("main dl")
        await assert_inert(card)
        assert await fits(card)
        assert await axe_violations(card) == []
        await card.focus("button.approve")  # keyboard: the person tabs to Approve and presses Enter
        await card.page.keyboard.press("Enter")
        status = await card.wait_for_selector("[role=status]")
        assert status is not None
        assert "approved" in await status.inner_text(), await status.inner_text()
        assert host.calls[-1] == "app_decide_approval"
        [granted] = audit_of(h, "esc-1", "approval_granted")
        assert granted["authenticated_by"] == "app"
        after = view(await host.client.call_tool("check_status", {"operation_id": "op-esc-1"}))
    assert after["max_status_requests"] == 3, dumps(after)
    [applied] = audit_of(h, "esc-1", "extension_approved")
    assert applied["authenticated_by"] == "app"


async def test_deny_in_the_card_changes_nothing_and_the_agent_sees_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=FAST)
    fake.script("esc-2", [pending("running")])
    async with host_on(h, tmp_path) as host:
        arguments, asked = await agent_escalates(host.client, "esc-2", reason="more please")
        page, card = await host.show("request_extension", arguments, asked)
        await card.wait_for_selector("section.approval button.deny")
        await host.snapshot(page, "escalated")
        await card.press("button.deny", "Enter")
        status = await card.wait_for_selector("[role=status]")
        assert status is not None
        assert "denied" in await status.inner_text()
        after = view(await host.client.call_tool("check_status", {"operation_id": "op-esc-2"}))
    assert (after["status"], after["max_status_requests"]) == ("escalated", 1)
    assert audit_of(h, "esc-2", "extension_approved") == []


async def test_where_the_policy_requires_an_operator_key_the_card_offers_no_buttons_and_a_decision_is_refused(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=FAST)
    fake.script("esc-3", [pending("running")])
    operator = make_operator(tmp_path / "keys")
    policy = ("--require-operator-key", "--operator-pubkeys", str(operator.pubkeys_file))
    async with host_on(h, tmp_path, *policy) as host:
        arguments, asked = await agent_escalates(host.client, "esc-3", reason="more please")
        _, card = await host.show("request_extension", arguments, asked)
        await card.wait_for_selector("section.approval")
        assert await card.locator("button").count() == 0
        assert "operator key" in await card.inner_text("section.approval")
        approval_id = str(view(asked)["approval_id"])
        answer = await page_call(
            card, "app_decide_approval", {"approval_id": approval_id, "decision": "approve"}
        )
        assert answer["result"]["isError"] is True, dumps(answer)
        assert "Nothing was decided" in answer["result"]["content"][0]["text"]
    assert audit_of(h, "esc-3", "approval_granted") == []


async def test_a_succeeded_operation_shows_its_result_as_text(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake, table=FAST)
    fake.script("ok-1", [succeeded(output_file=HOSTILE_STATE)])
    async with host_on(h, tmp_path) as host:
        view(
            await host.client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "op-ok-1", "provider_job_id": "ok-1"}
            )
        )
        arguments = {"operation_id": "op-ok-1", "wait_seconds": 5}
        done = await host.client.call_tool("check_status", arguments)
        assert view(done)["status"] == "succeeded"
        page, card = await host.show("check_status", arguments, done)
        assert await card.inner_text("main h1 .badge") == "succeeded"
        assert await card.locator("#countdown").count() == 0
        await assert_inert(card)
        await card.wait_for_selector("svg.chart")
        await host.snapshot(page, "succeeded")
        assert await axe_violations(card) == []
