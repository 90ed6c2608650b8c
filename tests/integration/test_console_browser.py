"""The operator console in a real browser: log in once, watch a wait, decide an approval, nothing executes.

Headless Chromium from the system packages (`apt-get install -y chromium`), driven by Playwright. The
console runs in this test's event loop on the harness's clock, beside the agent's in-process MCP client,
both on one database (SQLite: the console's reads run on both engines in test_console_pages.py); `pollwarden console` itself runs on a pseudo-terminal where the test is about
starting it. Skipped, with the reason, where Chromium is not installed.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from playwright.async_api import BrowserContext, Page

from harness import Harness, make_harness, view
from pollwarden.audit.chain import read_rows
from pollwarden.console.app import ConsoleSettings, create_app
from pollwarden.console.cli import running_console
from pollwarden.core.clock import FakeClock
from pollwarden.store import open_store
from pollwarden.surface.http_serve import HttpOptions, transport_security
from tests.support.a11y import serious_violations
from tests.support.browser import NO_CHROMIUM, chromium, chromium_path
from tests.support.console import console_at_terminal
from tests.support.fake_provider import FakeProvider, failed, http, pending, succeeded
from tests.support.live import write_table

if chromium_path() is None:  # one skip, with the reason, for the whole module
    pytest.skip(NO_CHROMIUM, allow_module_level=True)

# SQLite only: the subject is the console in a browser (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

HOSTILE = '<img src=x onerror="window.__pwned=1"></script><script>window.__pwned=2</script>'


def harness(tmp_path: Path, fake: FakeProvider) -> Harness:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    write_table(h.tables_dir, h.table)
    return h


@asynccontextmanager
async def console(h: Harness, **extra: Any) -> AsyncGenerator[tuple[str, str]]:
    """The console on a free 127.0.0.1 port, on the harness's clock: (base URL with its prefix, login token)."""
    token = secrets.token_urlsafe(24)
    options = HttpOptions(port=0)
    settings = ConsoleSettings(
        config=h.config(),
        login_token=token,
        allowed_hosts=tuple(transport_security(options).allowed_hosts or ()),
        clock=h.clock,
        **extra,
    )
    async with running_console(create_app(settings), options) as root:
        yield root + settings.prefix, token


@asynccontextmanager
async def logged_in(
    h: Harness, width: int = 1280, **extra: Any
) -> AsyncGenerator[tuple[str, Page, BrowserContext]]:
    async with console(h, **extra) as (base, token), chromium(width) as browser:
        page = await browser.new_page()
        await log_in(page, base, token)
        yield base, page, browser


async def log_in(page: Page, base: str, token: str) -> None:
    """Open the printed one-time URL and press its Log in button, as a person does."""
    await page.goto(f"{base}/login?token={token}")
    async with page.expect_navigation(url=f"{base}/"):
        await page.click("#log-in")
    assert await page.title() == "Operations · pollwarden console"


async def start(h: Harness, job: str, **extra: Any) -> dict[str, Any]:
    async with h.client() as client:
        return view(
            await client.call_tool(
                "start_operation",
                {"provider": "acme", "operation_id": f"op-{job}", "provider_job_id": job, **extra},
            )
        )


async def one_waiting(tmp_path: Path, fake: FakeProvider, job: str) -> Harness:
    """A harness with one operation waiting on a queued job."""
    h = harness(tmp_path, fake)
    fake.script(job, [pending("queued")])
    await start(h, job)
    return h


async def run_to_stop(h: Harness, job: str, checks: int = 20) -> dict[str, Any]:
    """check_status (waiting on the fake clock) until the operation stops waiting."""
    async with h.client() as client:
        for _ in range(checks):
            now = view(
                await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 30})
            )
            if now["status"] != "waiting":
                return now
            if now["outcome"] == "not_yet":  # longer than one call may wait: let the fake time pass
                h.clock.advance(now["retry_after_seconds"])
    raise AssertionError(f"still waiting after {checks} checks")


async def escalate_and_ask(h: Harness, job: str, *, reason: str = "big", extra_seconds: float = 60) -> str:
    """Exhaust a budget of 1, then ask for more from a client that cannot prompt: a pending approval."""
    await escalate(h, job)
    return await ask(h, job, reason=reason, extra_seconds=extra_seconds)


async def escalate(h: Harness, job: str) -> None:
    """An operation that stops, escalated, after its one allowed status request."""
    h.fake.script(job, [pending("running")])
    await start(h, job, max_status_requests=1)
    assert (await run_to_stop(h, job))["stop_reason"] == "request_budget_exhausted"


async def ask(h: Harness, job: str, *, reason: str, extra_seconds: float) -> str:
    async with h.client() as client:
        asked = view(
            await client.call_tool(
                "request_extension",
                {
                    "operation_id": f"op-{job}",
                    "extra_seconds": extra_seconds,
                    "extra_status_requests": 2,
                    "reason": reason,
                },
            )
        )
    assert asked["decision"] == "pending_approval"
    return str(asked["approval_id"])


async def next_check(h: Harness, job: str) -> dict[str, Any]:
    async with h.client() as client:
        return view(await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 30}))


def audit_kinds(h: Harness, job: str) -> list[str]:
    return [row.kind for row in read_rows(h.db_path, f"op-{job}")]


def audit_of(h: Harness, job: str, kind: str) -> list[dict[str, Any]]:
    return [row.payload_obj for row in read_rows(h.db_path, f"op-{job}") if row.kind == kind]


# -- starting and logging in ----------------------------------------------------------------


async def test_a_console_started_at_a_terminal_logs_in_once_with_its_printed_url_and_not_without_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = await one_waiting(tmp_path, fake, "seen")
    async with console_at_terminal(h.db_path) as (_, shown), chromium() as browser:
        found = re.search(r"(http://127\.0\.0\.1:\d+/c/[\w-]+)/login\?token=(\S+)", shown)
        assert found is not None, shown
        base, token = found.group(1), found.group(2)
        assert "decisions are recorded as 'operator (console)', authenticated by console" in shown

        page = await browser.new_page()
        refused = await page.goto(base + "/")
        assert refused is not None
        assert refused.status == 401
        assert "Open the login URL" in await page.inner_text("#login-needed")
        assert "op-seen" not in await page.content()
        await page.goto(f"{base}/login?token={token[:-2]}xx")
        assert page.url == f"{base}/login"  # the script took the token out of the address bar at once
        async with page.expect_response(f"{base}/login") as wrong:
            await page.click("#log-in")
        assert (await wrong.value).status == 401
        assert "wrong or already used" in await page.inner_text("#login-problem")

        await log_in(page, base, token)
        assert page.url == base + "/"
        assert await page.locator("#operations tr[data-operation='op-seen']").count() == 1
        # Opening the URL does not log in (a link preview or prefetch spends nothing); the POST does, and no
        # entry of the history holds the token.
        history = await (await browser.new_cdp_session(page)).send("Page.getNavigationHistory")
        assert history["entries"]
        assert not [e["url"] for e in history["entries"] if token in e["url"]]
        [cookie] = await browser.cookies()
        assert str(cookie.get("name")).startswith("pollwarden_console_")
        assert (cookie.get("httpOnly"), cookie.get("sameSite")) == (True, "Strict")
        assert cookie.get("path") == base.removeprefix(base.split("/c/")[0]) + "/"
        assert token not in await page.content()

        await browser.clear_cookies()
        again = await page.goto(f"{base}/login?token={token}")
        assert again is not None
        assert again.status == 401
        assert "has been used" in await page.content()


async def test_a_browser_logged_in_to_one_console_is_not_logged_in_to_another_on_the_same_host(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = await one_waiting(tmp_path, fake, "private")
    async with console(h) as (mine, token), console(h) as (other, _), chromium() as browser:
        page = await browser.new_page()
        await log_in(page, mine, token)
        assert await page.locator("#operations tr[data-operation='op-private']").count() == 1
        assert [c.get("name") for c in await browser.cookies(other + "/")] == []  # not sent there
        refused = await page.goto(other + "/")
        assert refused is not None
        assert refused.status == 401
        assert "op-private" not in await page.content()
        again = await page.goto(mine + "/")  # still logged in to the first
        assert again is not None
        assert again.status == 200


# -- deciding --------------------------------------------------------------------------------


async def test_approving_in_the_browser_is_applied_by_the_agents_next_check_status(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    approval_id = await escalate_and_ask(h, "ok", reason="the export is large")
    started_deadline = audit_of(h, "ok", "tracking")[0]["deadline_at"]
    async with logged_in(h) as (base, page, _):
        await page.click("nav >> text=Approvals")
        card = page.locator(f"article[data-approval='{approval_id}']")
        assert "Approve more waiting for op-ok?" in await card.locator(".question").inner_text()
        assert await card.locator(".reason").inner_text() == '"the export is large"'
        await card.locator("button.approve").click()
        flash = await page.inner_text(".flash.ok")
        assert f'{approval_id} approved for op-ok by "operator (console)" (console)' in flash
        assert "the agent's next check_status applies it" in flash
        assert await page.locator("#no-pending").count() == 1

        applied = await next_check(h, "ok")
        assert applied["outcome"] == "polled"
        assert (applied["max_status_requests"], applied["status_requests_used"]) == (3, 2)
        await page.goto(f"{base}/operation?id=op-ok")
        events = page.locator("#timeline g.event")
        kinds = [await events.nth(i).get_attribute("data-kind") for i in range(await events.count())]
        assert kinds == ["approval_pending", "approval_granted", "extension_approved"]
        sources = await page.locator("#timeline g.marker").evaluate_all("ms => ms.map(m => m.dataset.source)")
        assert sources[-1] == "manual_extension"  # the request the extension allowed
        earlier = page.locator("#timeline g.vline.deadline-earlier")
        assert await earlier.get_attribute("data-at") == started_deadline
    granted = audit_of(h, "ok", "approval_granted")
    assert [(g["note"], g["authenticated_by"]) for g in granted] == [
        (f"{approval_id} by operator (console)", "console")
    ]
    extension = audit_of(h, "ok", "extension_approved")
    assert extension[0]["approved_by"] == "operator (console)"
    assert extension[0]["authenticated_by"] == "console"


async def test_denying_in_the_browser_changes_nothing_and_the_agent_sees_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    approval_id = await escalate_and_ask(h, "no")
    async with logged_in(h) as (base, page, _):
        await page.goto(base + "/approvals")
        await page.click(f"article[data-approval='{approval_id}'] button.deny")
        assert f"{approval_id} denied for op-no" in await page.inner_text(".flash.ok")
        assert "denied" in await page.inner_text("#decided")
    after = await next_check(h, "no")
    assert (after["outcome"], after["max_status_requests"]) == ("stopped", 1)
    assert "extension_approved" not in audit_kinds(h, "no")
    assert [p["authenticated_by"] for p in audit_of(h, "no", "extension_denied")] == ["console"]


async def test_a_post_without_the_csrf_token_is_refused_and_decides_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    approval_id = await escalate_and_ask(h, "csrf")
    async with logged_in(h) as (base, page, _):
        for form in (
            {"approval_id": approval_id, "decision": "approve"},
            {
                "approval_id": approval_id,
                "decision": "approve",
                "csrf": "guessed",
            },
        ):
            refused = await page.request.post(base + "/approvals/decide", form=form)
            assert refused.status == 403
            assert "CSRF" in await refused.text()
        await page.goto(base + "/approvals")
        assert await page.locator(f"article[data-approval='{approval_id}']").count() == 1
    # Without the session cookie (another site's form cannot send a SameSite=Strict cookie): not logged in.
    async with console(h) as (base, _), httpx2.AsyncClient() as client:
        anonymous = await client.post(
            base + "/approvals/decide", data={"approval_id": approval_id, "decision": "approve"}
        )
        assert anonymous.status_code == 401
    assert "approval_granted" not in audit_kinds(h, "csrf")


async def test_a_double_submit_decides_once(tmp_path: Path, fake: FakeProvider) -> None:
    h = harness(tmp_path, fake)
    approval_id = await escalate_and_ask(h, "twice")
    async with logged_in(h) as (base, page, _):
        await page.goto(base + "/approvals")
        csrf = await page.get_attribute("input[name=csrf]", "value")
        form = {"csrf": csrf or "", "approval_id": approval_id, "decision": "approve"}
        # Two submits at once (a double click), then the same form again (a reload that re-posts).
        await asyncio.gather(
            page.request.post(base + "/approvals/decide", form=form),
            page.request.post(base + "/approvals/decide", form=form),
        )
        await page.request.post(base + "/approvals/decide", form={**form, "decision": "deny"})
        await page.goto(base + "/approvals")
        assert await page.locator("#decided tbody tr").count() == 1
    assert len(audit_of(h, "twice", "approval_granted")) == 1
    assert "extension_denied" not in audit_kinds(h, "twice")
    applied = await next_check(h, "twice")
    assert applied["max_status_requests"] == 3


async def test_an_approval_bound_to_a_changed_operation_version_is_refused_with_the_reason(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    first = await escalate_and_ask(h, "moved", extra_seconds=60)
    # The operation changes by another way after the question (one question waits per operation, so not
    # by a second one): more requests granted through the store.
    async with open_store(h.database) as store:
        record = await store.get("op-moved")
        assert record is not None
        changed = await store.apply_extension(
            "op-moved",
            bound_version=record.version,
            changes={"max_status_requests": record.max_status_requests + 1},
            at=h.clock.now(),
            approval_id=None,
            payload_extra={},
        )
        assert changed is not None
    async with logged_in(h) as (base, page, _):
        await page.goto(base + "/approvals")
        card = page.locator(f"article[data-approval='{first}']")
        assert "The operation changed after this was asked" in await card.inner_text()
        await card.locator("button.approve").click()
        refused = await page.inner_text(".flash.refused")
        assert f"{first} is void: operation op-moved changed" in refused
        assert "the agent must ask again" in refused
    assert (
        len(audit_of(h, "moved", "extension_approved")) == 1
    )  # the change above; the void approval added none


# -- seeing ----------------------------------------------------------------------------------


async def test_the_timeline_shows_each_request_its_delay_source_and_the_deadline(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    fake.script(
        "story",
        [
            pending("queued"),
            http(503, headers={"Retry-After": "30"}, body={"error": "busy"}),
            pending("running"),
            succeeded(),
        ],
    )
    started = await start(h, "story")
    async with logged_in(h) as (base, page, _):
        first = await next_check(h, "story")
        await page.goto(f"{base}/operation?id=op-story")
        planned = page.locator("#timeline g.vline.next-check")
        assert await planned.get_attribute("data-at") == first["next_check_at"]

        done = await run_to_stop(h, "story")
        assert done["status"] == "succeeded"
        await page.goto(f"{base}/operation?id=op-story")
        markers = page.locator("#timeline g.marker")
        seen = [
            (
                await markers.nth(i).get_attribute("data-state"),
                await markers.nth(i).get_attribute("data-http"),
                await markers.nth(i).get_attribute("data-source"),
            )
            for i in range(await markers.count())
        ]
        assert seen == [
            ("queued", "200", "local_backoff"),
            ("", "503", "local_backoff"),
            ("running", "200", "provider_retry_after"),
            ("succeeded", "200", "local_backoff"),
        ]
        assert "Retry-After 30 s" in (await markers.nth(1).locator("title").text_content() or "")
        deadline = page.locator("#timeline g.vline.deadline")
        assert await deadline.get_attribute("data-at") == started["deadline_at"]
        assert await page.locator("#timeline g.vline.next-check").count() == 0  # nothing planned any more
        assert "Status requests: 4 of 12" in await page.inner_text("#budget")
        assert "received 503, Retry-After 30" in await page.inner_text("#story")


async def test_hostile_provider_text_and_agent_reasons_render_as_text_and_execute_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    fake.script("evil", [failed(error=HOSTILE)])
    await start(h, "evil")
    assert (await run_to_stop(h, "evil"))["status"] == "failed"
    approval_id = await escalate_and_ask(h, "asks", reason=HOSTILE)
    async with logged_in(h) as (base, page, _):
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: dialogs.append(dialog.message))
        for path, where in (("/operation?id=op-evil", "#provider-error"), ("/approvals", ".reason")):
            response = await page.goto(base + path)
            assert response is not None
            raw = await response.text()
            assert "<img src=x" not in raw
            assert "<script>window" not in raw
            shown = await page.inner_text(where)
            assert "<img src=x onerror=" in shown
            assert "</script><script>" in shown
            assert await page.locator("main img, main script").count() == 0
            assert await page.evaluate("() => window.__pwned === undefined")
            assert await page.locator(f"{where} .untrusted").count() == 1
            csp = response.headers["content-security-policy"]
            assert "script-src 'self';" in csp  # the console's own file only: no inline script, no eval
            assert "unsafe" not in csp
            assert "default-src 'none'" in csp
            assert "frame-ancestors 'none'" in csp
            assert response.headers["x-content-type-options"] == "nosniff"
        question = await page.inner_text(f"article[data-approval='{approval_id}'] .question")
        assert "Agent's reason (untrusted):" in question
        assert "<img src=x" in question
        assert dialogs == []


# -- the on-call person's first screen ------------------------------------------------------


async def names_of(page: Page, selector: str) -> list[str]:
    """The accessible names of the buttons `selector` finds (their text, hidden parts included)."""
    return await page.locator(selector).evaluate_all(
        "bs => bs.map(b => b.textContent.replace(/\\s+/g, ' ').trim())"
    )


async def test_what_needs_a_person_comes_first_and_only_what_can_still_be_decided_is_counted(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    late = await escalate_and_ask(h, "late")
    h.clock.advance(901)  # the first question expires unanswered (15 min)
    await escalate(h, "soon")
    h.clock.advance(1)
    await escalate(h, "quiet")  # stopped, and nobody asked anything
    soon = await ask(h, "soon", reason="still running", extra_seconds=60)
    async with logged_in(h) as (base, page, _):
        assert await page.inner_text("#pending-banner") == "1 approval waiting for a person"
        needs = page.locator("#needs li")
        assert [await needs.nth(i).get_attribute("data-operation") for i in range(await needs.count())] == [
            "op-soon"
        ]
        assert "extension waiting for your decision, expires in 15 min" in await needs.first.inner_text()
        flagged = page.locator("#operations tr.needs-you")
        assert [
            await flagged.nth(i).get_attribute("data-operation") for i in range(await flagged.count())
        ] == ["op-soon"]

        await page.goto(base + "/approvals")
        assert [await a.get_attribute("data-approval") for a in await page.locator("main article").all()] == [
            soon
        ]
        card = page.locator(f"article[data-approval='{soon}']")
        assert await card.locator(".expires").inner_text() == "expires in 15 min"
        assert await names_of(page, f"article[data-approval='{soon}'] button") == [
            "Approve extension for op-soon",
            "Deny extension for op-soon",
        ]
        assert await card.get_by_role("button", name="Approve extension for op-soon").count() == 1
        expired = page.locator(f"#expired li[data-approval='{late}']")
        assert re.search(r"expired \d+ s ago: deciding is refused", await expired.inner_text())
        assert await expired.locator("button").count() == 0  # no buttons for what cannot be decided

        # Decided on the operation's own page, which says in a sentence where things stand.
        await page.goto(f"{base}/operation?id=op-soon")
        summary = await page.inner_text("#summary")
        assert re.search(
            r"Escalated \d+ s ago \(request budget exhausted\) after 1 of 1 status requests used", summary
        )
        assert "Needs you: extension waiting for your decision, expires in 15 min." in summary
        await page.get_by_role("button", name="Approve extension for op-soon").click()
        assert page.url == f"{base}/operation?id=op-soon"
        assert f"{soon} approved for op-soon" in await page.inner_text(".flash.ok")
        assert await page.locator("main article.approval").count() == 0
    assert [g["authenticated_by"] for g in audit_of(h, "soon", "approval_granted")] == ["console"]


async def test_a_cancel_card_says_what_each_button_does_to_the_job(
    tmp_path: Path, fake: FakeProvider
) -> None:
    cancel = {"cancel": {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"}}
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()), table=cancel)
    write_table(h.tables_dir, h.table)
    await escalate(h, "stop")
    async with h.client() as client:
        asked = view(await client.call_tool("cancel_operation", {"operation_id": "op-stop"}))
    assert asked["decision"] == "pending_approval", asked
    async with logged_in(h) as (base, page, _):
        await page.goto(base + "/approvals")
        assert await names_of(page, "main article button") == [
            "Cancel job at provider for op-stop",
            "Keep job for op-stop",
        ]


async def test_times_read_as_people_say_them_and_a_missed_check_and_a_passed_deadline_are_called_out(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    fake.script("slow", [pending("queued"), pending("running")])
    started = await start(h, "slow", deadline_seconds=600)
    polled = await next_check(h, "slow")
    wait = polled["next_check_at"]
    async with logged_in(h) as (base, page, _):
        row = page.locator("#operations tr[data-operation='op-slow']")
        assert re.fullmatch(r"next check in \d+ s", await row.locator("td.next").inner_text())
        assert re.fullmatch(r"in (9|10) min", await row.locator("td.deadline").inner_text())
        await page.goto(f"{base}/operation?id=op-slow")
        assert await page.locator("#timeline g.vline.now").count() == 1  # the "now" line
        clock = page.locator("#next-check time.clock")
        assert (await clock.get_attribute("title") or "").endswith(" UTC")  # UTC on hover ...
        assert not (await clock.inner_text()).endswith("UTC")  # ... local time on the page
        assert await clock.get_attribute("datetime") == wait

        h.clock.advance(200)  # the agent did not come back
        await page.goto(base + "/")
        assert re.fullmatch(
            r"due \d+ min ago — the agent has not checked", await row.locator("td.next").inner_text()
        )
        h.clock.advance(500)  # past the polling deadline, and still shown as waiting
        await page.goto(base + "/")
        assert re.fullmatch(r"deadline passed \d+ s ago", await row.locator("td.deadline.late").inner_text())
        await page.goto(f"{base}/operation?id=op-slow")
        assert "the agent's next check stops it" in await page.inner_text("#deadline-passed")
        assert "Its polling deadline has passed" in await page.inner_text("#summary")
    assert started["status"] == "waiting"


async def test_pages_update_in_place_but_never_while_a_filter_is_being_edited_and_can_be_paused(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = await one_waiting(tmp_path, fake, "first")
    async with logged_in(h, refresh_seconds=1) as (base, page, _):
        assert await page.locator("meta[http-equiv]").count() == 0
        fake.script("second", [pending("queued")])
        await start(h, "second")
        await page.wait_for_selector("#operations tr[data-operation='op-second']", timeout=15_000)
        assert re.fullmatch(r"updated (just now|\d+ s ago)", await page.inner_text("#live-status"))

        # A filter chosen and not yet submitted: the page holds still.
        await page.select_option("select[name=status]", "escalated")
        fake.script("third", [pending("queued")])
        await start(h, "third")
        await page.wait_for_function("() => Number(document.body.dataset.held || 0) >= 2", timeout=15_000)
        assert await page.locator("#operations tr[data-operation='op-third']").count() == 0
        assert await page.input_value("select[name=status]") == "escalated"
        assert "held while you edit" in await page.inner_text("#live-status")

        # Paused, the Approvals page stays as it is; resumed, it shows the new question.
        await page.goto(base + "/approvals")
        await page.click("#live-pause")
        assert await page.get_attribute("#live-pause", "aria-pressed") == "true"
        updates = int(await page.evaluate("() => Number(document.body.dataset.updates || 0)"))
        asked = await escalate_and_ask(h, "asks")
        await page.click("#live-pause")  # resume
        await page.wait_for_selector(f"article[data-approval='{asked}']", timeout=15_000)
        assert int(await page.evaluate("() => Number(document.body.dataset.updates)")) > updates

        # A stopped operation's page refreshes too (its approvals and story can still change).
        await page.goto(f"{base}/operation?id=op-asks")
        await page.wait_for_selector("article.approval", timeout=15_000)
        await page.click("nav >> text=Approvals")  # the person's own request: the session is alive
        assert await page.title() == "Approvals · pollwarden console"


async def test_a_long_run_of_polls_collapses_labels_never_overlap_and_the_budget_bar_is_to_scale(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    answers = [
        pending("queued"),
        *[pending("running")] * 55,
        http(503, headers={"Retry-After": "30"}, body={"error": "busy"}),
        pending("running"),
        pending("running"),
    ]
    fake.script("long", answers)
    await start(h, "long", max_status_requests=len(answers), deadline_seconds=86400)
    assert (await run_to_stop(h, "long", checks=200))["stop_reason"] == "request_budget_exhausted"
    async with logged_in(h) as (base, page, _):
        await page.goto(f"{base}/operation?id=op-long")
        markers = page.locator("#timeline g.marker")
        runs = await markers.evaluate_all(
            "ms => ms.map(m => [m.dataset.state, m.dataset.http, Number(m.dataset.count)])"
        )
        assert runs == [["queued", "200", 1], ["running", "200", 55], ["", "503", 1], ["running", "200", 2]]
        assert "running ×55" in (await page.locator("#timeline").text_content() or "")
        boxes = await page.locator("#timeline text.label").evaluate_all(
            "ts => ts.map(t => { const b = t.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; })"
        )
        assert len(boxes) >= 4
        overlapping = [
            (a, b)
            for i, a in enumerate(boxes)
            for b in boxes[i + 1 :]
            if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
        ]
        assert overlapping == []
        # The reason is told by shape as well as colour: a Retry-After request is not drawn like a backoff one.
        shapes = await markers.evaluate_all(
            "ms => ms.map(m => [m.dataset.source, m.querySelector('path.shape').getAttribute('d').replace(/[-\\d.,]+/g, '#')])"
        )
        assert len({shape for source, shape in shapes if source == "local_backoff"}) == 1
        assert {shape for source, shape in shapes if source == "provider_retry_after"}.isdisjoint(
            {shape for source, shape in shapes if source == "local_backoff"}
        )
        used = await page.locator(".budget-used").bounding_box()
        whole = await page.locator(".budget-all").bounding_box()
        assert used is not None
        assert whole is not None
        assert used["width"] == pytest.approx(whole["width"], abs=0.5)  # spent: the whole bar


async def test_logging_out_and_an_idle_session_end_the_session(tmp_path: Path, fake: FakeProvider) -> None:
    h = await one_waiting(tmp_path, fake, "idle")
    async with logged_in(h, idle_timeout_seconds=600) as (base, page, _):
        await page.get_by_role("button", name="Log out").click()
        assert "session has ended" in await page.inner_text("#logged-out")
        again = await page.goto(base + "/")
        assert again is not None
        assert again.status == 401
        assert "op-idle" not in await page.content()
    async with logged_in(h, idle_timeout_seconds=600) as (base, page, _):
        h.clock.advance(599)
        assert (await page.goto(base + "/approvals") or pytest.fail("no answer")).status == 200
        h.clock.advance(599)  # each request of the person's restarts the wait
        assert (await page.goto(base + "/") or pytest.fail("no answer")).status == 200
        h.clock.advance(601)
        ended = await page.goto(base + "/")
        assert ended is not None
        assert ended.status == 401
        assert "Your session ended after 10 min without activity" in await page.inner_text("#idle-ended")


# -- any width, any reader ------------------------------------------------------------------


async def every_page(h: Harness) -> tuple[str, str]:
    """Operations in every state the pages draw: (a waiting operation's id, an asked approval's id)."""
    fake = h.fake
    fake.script("wait-" + "x" * 40, [pending("queued")])
    await start(h, "wait-" + "x" * 40)
    fake.script("done", [pending("queued"), http(503, headers={"Retry-After": "5"}), succeeded()])
    await start(h, "done")
    await run_to_stop(h, "done")
    asked = await escalate_and_ask(h, "asks", reason="a long export " * 8)
    return "op-wait-" + "x" * 40, asked


PAGES = (
    "/",
    "/?status=waiting",
    "/operation?id=op-done",
    "/operation?id=op-asks",
    "/approvals",
    "/providers",
    "/audit",
    "/operation?id=nothing",
)


async def test_every_page_has_no_serious_or_critical_accessibility_violation_and_a_skip_link(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    waiting_id, _ = await every_page(h)
    async with logged_in(h, refresh_seconds=3600) as (base, page, _):
        found: dict[str, list[str]] = {}
        for path in (*PAGES, f"/operation?id={waiting_id}"):
            await page.goto(base + path)
            found[path] = await serious_violations(page)
        assert found == {path: [] for path in found}
        await page.goto(base + "/")
        await page.keyboard.press("Tab")
        skip = page.locator("a.skip")
        assert await skip.evaluate("a => a === document.activeElement")
        assert await skip.inner_text() == "Skip to content"
        outline = await skip.evaluate(
            "a => getComputedStyle(a).outlineStyle + ' ' + getComputedStyle(a).outlineWidth"
        )
        assert outline == "solid 3px"  # a visible focus
        await page.keyboard.press("Enter")
        assert await page.evaluate("() => document.activeElement.id") == "main"
        await page.get_by_role("button", name="Log out").click()
        assert await serious_violations(page) == []
    async with console(h) as (base, token), chromium() as browser:
        page = await browser.new_page()
        await page.goto(f"{base}/login?token={token}")
        assert await serious_violations(page) == []
        await page.goto(f"{base}/login")
        assert await serious_violations(page) == []


@pytest.mark.parametrize("width", [390, 1440])
async def test_no_page_scrolls_sideways_on_a_phone_or_a_laptop_and_tables_become_cards_on_a_phone(
    tmp_path: Path, fake: FakeProvider, width: int
) -> None:
    h = harness(tmp_path, fake)
    await every_page(h)
    async with logged_in(h, width, refresh_seconds=3600) as (base, page, _):
        wide: dict[str, int] = {}
        for path in PAGES:
            await page.goto(base + path)
            wide[path] = int(await page.evaluate("() => document.documentElement.scrollWidth"))
        assert {p: w for p, w in wide.items() if w > width} == {}
        await page.goto(base + "/")
        display = await page.locator("#operations tbody tr").first.evaluate(
            "r => getComputedStyle(r).display"
        )
        assert display == ("block" if width < 700 else "table-row")
        if width < 700:
            await page.goto(base + "/approvals")
            assert await serious_violations(page) == []
