"""The console's pages over plain HTTP: the Host check, filters and paging, the fleet's pace, the audit.

The same in-process console as the browser tests (tests/integration/test_console_browser.py), read with an HTTP
client: these need no browser.

The pure checks are tests/unit/test_console_pages.py.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import subprocess
import sys
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from harness import Harness, db_write, make_harness, make_operator, merge, view
from pollwarden.access.operator_keys import PUBKEYS_ENV, REQUIRE_ENV
from pollwarden.audit.chain import read_rows, write_anchor
from pollwarden.console.anchors import MAX_ANCHOR_BYTES
from pollwarden.console.app import ConsoleSettings, create_app
from pollwarden.console.cli import running_console
from pollwarden.core.clock import FakeClock
from pollwarden.surface.http_serve import HttpOptions, transport_security
from tests.support.console import clean_env, console_at_terminal
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import write_table

pytestmark = pytest.mark.anyio  # every test on the fake provider runs on SQLite and on PostgreSQL


def harness(tmp_path: Path, fake: FakeProvider, table: dict[str, Any] | None = None) -> Harness:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    if table:
        h.table = merge(h.table, table)
    write_table(h.tables_dir, h.table)
    return h


def settings_for(h: Harness, **extra: Any) -> ConsoleSettings:
    """A console on the harness's database and clock, on a free 127.0.0.1 port, with a fresh login token."""
    return ConsoleSettings(
        config=h.config(),
        login_token=secrets.token_urlsafe(24),
        allowed_hosts=tuple(transport_security(HttpOptions(port=0)).allowed_hosts or ()),
        clock=h.clock,
        **extra,
    )


@asynccontextmanager
async def serving(settings: ConsoleSettings) -> AsyncGenerator[tuple[str, str]]:
    """The console running: (its server's root URL, its own base URL under the random prefix)."""
    async with running_console(create_app(settings), HttpOptions(port=0)) as root:
        yield root, root + settings.prefix


@asynccontextmanager
async def session(h: Harness, **extra: Any) -> AsyncGenerator[tuple[httpx2.AsyncClient, str]]:
    """A logged-in HTTP client on the console, and the console's base URL (under its prefix)."""
    settings = settings_for(h, **extra)
    async with serving(settings) as (_, base), httpx2.AsyncClient() as client:
        login = await client.post(f"{base}/login", data={"token": settings.login_token})
        assert login.status_code == 303
        yield client, base


async def stop_after_one(h: Harness, job: str) -> None:
    """An operation that escalates after its one allowed status request."""
    h.fake.script(job, [pending("running")])
    async with h.client() as client:
        view(
            await client.call_tool(
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
            await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 30})
        )
    assert stopped["stop_reason"] == "request_budget_exhausted"


async def waiting(h: Harness, job: str) -> None:
    h.fake.script(job, [pending("queued")])
    async with h.client() as client:
        view(
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": f"op-{job}", "provider_job_id": job}
            )
        )


def test_an_agents_shell_cannot_start_a_console_no_terminal_and_no_key(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    db.touch(mode=0o600)
    started = subprocess.run(
        [sys.executable, "-m", "pollwarden", "console", "--db", str(db), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        env=clean_env(),
    )
    assert started.returncode == 2
    assert "pollwarden console needs a person" in started.stderr
    assert "Nothing was started" in started.stderr
    assert "token=" not in started.stdout + started.stderr


async def test_a_console_needs_the_operator_key_when_the_operator_requires_one(tmp_path: Path) -> None:
    operator = make_operator(tmp_path / "keys")
    db = tmp_path / "p.db"
    db.touch(mode=0o600)
    env = {PUBKEYS_ENV: str(operator.pubkeys_file), REQUIRE_ENV: "1"}
    async with console_at_terminal(db, env=env) as (proc, shown):
        assert proc.wait(timeout=30) == 2
        assert "requires an operator key" in shown
        assert "token=" not in shown
    async with console_at_terminal(db, "--operator-key", str(operator.key_file), env=env) as (_, shown):
        assert "token=" in shown
        assert "authenticated by operator-key:" in shown


def listed(html: str) -> list[str]:
    return re.findall(r'data-operation="([^"]+)"', html)


async def test_a_host_that_does_not_name_the_console_is_refused_and_every_answer_carries_the_headers(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    async with session(h) as (client, base):
        rebound = await client.get(base + "/", headers={"Host": "attacker.example"})
        assert rebound.status_code == 400
        assert "DNS-rebinding" in rebound.text
        for answer in (rebound, await client.get(base + "/"), await client.get(base + "/console.css")):
            assert answer.headers["x-frame-options"] == "DENY"
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        foreign = await client.post(
            base + "/approvals/decide",
            data={"approval_id": "ap-x", "decision": "approve", "csrf": "x"},
            headers={"Origin": "https://attacker.example"},
        )
        assert foreign.status_code == 403


async def test_operations_are_filtered_by_status_provider_and_stop_reason_newest_first_and_paged(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    for job in ("a", "b", "c"):
        await stop_after_one(h, job)
        h.clock.advance(1)
    await waiting(h, "d")
    async with session(h, page_size=2) as (client, base):
        first = await client.get(base + "/")
        assert listed(first.text) == ["op-d", "op-c"]
        assert "4 operations · page 1 of 2" in first.text
        assert "http-equiv" not in first.text  # no meta refresh: the page's script refreshes it in place
        assert 'data-refresh="10"' in first.text
        second = await client.get(base + "/?page=2")
        assert listed(second.text) == ["op-b", "op-a"]
        stopped = await client.get(base + "/?stop_reason=request_budget_exhausted&provider=acme")
        assert listed(stopped.text) == ["op-c", "op-b"]
        assert "3 operations" in stopped.text
        assert listed((await client.get(base + "/?status=waiting")).text) == ["op-d"]
        assert listed((await client.get(base + "/?provider=other")).text) == []
        # A value outside the vocabulary is no filter at all, never SQL.
        assert listed((await client.get(base + "/?status=x'%20OR%201=1--")).text) == ["op-d", "op-c"]


async def test_the_providers_page_counts_the_last_hours_status_requests_against_the_fleet_pace(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake, {"fleet": {"max_requests_per_second": 2, "burst": 3}})
    for job in ("p1", "p2", "p3"):
        await stop_after_one(h, job)
    async with session(h, idle_timeout_seconds=7200) as (client, base):  # logged in an hour later
        page = await client.get(base + "/providers")
        acme = page.text[page.text.index('id="provider-acme"') :]
        assert re.search(r'data-total="3" data-pace="2.0"', acme)
        assert "Last hour: 3 status requests" in acme
        # Each operation's first check waits its own backoff on the fake clock: one request per second at most.
        assert "busiest second: 1 (burst 3)" in acme
        h.clock.advance(3601)  # an hour later the requests have left the window
        later = await client.get(base + "/providers")
        assert 'data-total="0"' in later.text[later.text.index('id="provider-acme"') :]


async def test_the_audit_page_verifies_the_chain_against_an_anchor_catches_an_edit_and_exports_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    await stop_after_one(h, "au")
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    write_anchor(h.db_path, anchors / "anchor.json")
    async with session(h, anchor_dir=anchors) as (client, base):
        checked = await client.get(base + "/audit", params={"anchor": "anchor.json"})
        assert "Audit chain OK" in checked.text
        assert "Anchor matched" in checked.text
        exported = await client.get(base + "/audit/export")
        assert exported.headers["content-disposition"].startswith("attachment")
        assert len(exported.text.splitlines()) == len(read_rows(h.db_path))
        db_write(
            h.db_path, "UPDATE audit SET payload = replace(payload, 'running', 'succeeded') WHERE seq = 2"
        )
        broken = await client.get(base + "/audit")
        assert "Audit chain BROKEN at seq 2" in broken.text


async def test_the_console_lives_under_its_random_prefix_and_its_cookie_is_scoped_to_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    await waiting(h, "scoped")
    settings = settings_for(h)
    async with serving(settings) as (root, base), httpx2.AsyncClient() as client:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/c/[A-Za-z0-9_-]{24}", base)
        # Nothing outside the prefix, not even the login (a guessed URL spends no token).
        for path in ("/", "/login?token=" + settings.login_token, "/approvals", "/console.css"):
            assert (await client.get(root + path)).status_code == 404
        assert (await client.post(root + "/login", data={"token": settings.login_token})).status_code == 404
        login = await client.post(f"{base}/login", data={"token": settings.login_token})
        assert login.status_code == 303
        assert login.headers["location"] == f"{settings.prefix}/"
        cookie = login.headers["set-cookie"]
        assert cookie.startswith(settings.cookie_name + "=")
        assert settings.cookie_name != "pollwarden_console"  # named for this console
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", f"path={settings.prefix.lower()}/"} <= attributes
        listed_page = await client.get(base + "/")
        assert 'data-operation="op-scoped"' in listed_page.text
        assert f'href="{settings.prefix}/approvals"' in listed_page.text


async def test_a_session_cookie_of_one_console_does_not_open_another_console_on_the_same_host(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    await waiting(h, "mine")
    first, second = settings_for(h), settings_for(h)
    assert first.prefix != second.prefix
    assert first.cookie_name != second.cookie_name
    async with serving(first) as (_, base_a), serving(second) as (_, base_b), httpx2.AsyncClient() as client:
        assert (await client.post(f"{base_a}/login", data={"token": first.login_token})).status_code == 303
        session_id = client.cookies[first.cookie_name]
        assert 'data-operation="op-mine"' in (await client.get(base_a + "/")).text
        # The other console's pages: the client does not send the cookie there (another path) ...
        other = await client.get(base_b + "/")
        assert other.status_code == 401
        assert "op-mine" not in other.text
        # ... and sent there by hand, under either name, it opens nothing.
        async with httpx2.AsyncClient() as forger:
            for name in (first.cookie_name, second.cookie_name):
                forged = await forger.get(base_b + "/", headers={"Cookie": f"{name}={session_id}"})
                assert forged.status_code == 401
                assert "op-mine" not in forged.text


async def test_the_audit_page_reads_anchors_only_by_name_from_its_directory_and_only_small_regular_files(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    await stop_after_one(h, "anch")
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    secret = tmp_path / "secret.json"
    write_anchor(h.db_path, secret)  # a valid anchor, outside the directory
    (anchors / "link.json").symlink_to(secret)
    os.mkfifo(anchors / "fifo.json")  # opening it blocking would hang the page
    (anchors / "big.json").write_text(" " * (MAX_ANCHOR_BYTES + 1))
    async with session(h, anchor_dir=anchors) as (client, base):
        for name, why in (
            (str(secret), "must be a file name in the anchor directory, not a path"),
            ("../secret.json", "not a path"),
            ("link.json", "symbolic links are refused"),
            ("fifo.json", "is not a regular file"),
            ("big.json", f"over the {MAX_ANCHOR_BYTES}-byte cap"),
            ("missing.json", "No such file"),
        ):
            with anyio.fail_after(10):
                refused = await client.get(base + "/audit", params={"anchor": name})
            assert refused.status_code == 200
            assert why in refused.text, name
            assert "Anchor matched" not in refused.text
    async with session(h) as (client, base):  # no --anchor-dir: no file is read at all
        refused = await client.get(base + "/audit", params={"anchor": str(secret)})
        assert "start it with --anchor-dir DIR" in refused.text
        assert "Anchor matched" not in refused.text


async def test_a_page_number_of_any_size_shows_the_last_page_and_never_fails(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    for job in ("n1", "n2", "n3"):
        await waiting(h, job)
        h.clock.advance(1)
    async with session(h, page_size=2) as (client, base):
        for number in ("99999999999999999999", "3", "-1", "1e9", "x"):
            shown = await client.get(base + "/", params={"page": number})
            assert shown.status_code == 200, number
        huge = await client.get(base + "/", params={"page": "99999999999999999999"})
        assert "page 2 of 2" in huge.text
        assert listed(huge.text) == ["op-n1"]
        assert "page 1 of 2" in (await client.get(base + "/", params={"page": "x"})).text


async def test_search_finds_an_operation_by_part_of_its_id_or_its_jobs_and_counts_each_status(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    await stop_after_one(h, "alpha")
    h.clock.advance(1)
    await waiting(h, "beta")
    h.clock.advance(1)
    await waiting(h, "Alphabet")
    async with session(h) as (client, base):
        assert listed((await client.get(base + "/", params={"q": "alpha"})).text) == ["op-alpha"]  # case kept
        assert listed((await client.get(base + "/", params={"q": "op-"})).text) == [
            "op-Alphabet",
            "op-beta",
            "op-alpha",
        ]
        assert listed((await client.get(base + "/", params={"q": "bet"})).text) == ["op-Alphabet", "op-beta"]
        assert listed((await client.get(base + "/", params={"q": "%"})).text) == []  # no wildcard
        counted = await client.get(base + "/")
        counts = dict(re.findall(r'data-status="(\w+)"[^>]*>\w+ (\d+)<', counted.text))
        assert counts == {"waiting": "2", "escalated": "1"}
        # The counts keep the other filters and ignore the status one (they are the tabs to pick from).
        narrowed = await client.get(base + "/", params={"q": "beta", "status": "escalated"})
        assert dict(re.findall(r'data-status="(\w+)"[^>]*>\w+ (\d+)<', narrowed.text)) == {"waiting": "1"}
        assert listed(narrowed.text) == []


def test_a_console_without_a_terminal_writes_its_login_url_to_an_owner_only_file_not_to_its_output(
    tmp_path: Path,
) -> None:
    operator = make_operator(tmp_path / "keys")
    db = tmp_path / "p.db"
    db.touch(mode=0o600)
    url_file = tmp_path / "private" / "login.url"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pollwarden",
            "console",
            "--db",
            str(db),
            "--port",
            "0",
            "--operator-key",
            str(operator.key_file),
            "--login-url-file",
            str(url_file),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=clean_env({PUBKEYS_ENV: str(operator.pubkeys_file)}),
    )
    assert proc.stdout is not None
    shown = ""
    try:
        deadline = time.monotonic() + 30
        while "readable by you only" not in shown and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096).decode()
                if not chunk:
                    break
                shown += chunk
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
    assert f"it is in {url_file} (readable by you only)" in shown, shown
    assert "token=" not in shown  # a log of this output logs nobody in
    assert url_file.stat().st_mode & 0o777 == 0o600
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/c/[\w-]+/login\?token=[\w-]+\n", url_file.read_text())


async def test_the_operation_page_takes_the_id_an_agent_chose_and_names_the_owners_when_several_chose_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    from functools import partial

    from pollwarden.access.ownership import stored_id
    from pollwarden.access.principals import Principal
    from pollwarden.surface.server import controller_factory

    h = harness(tmp_path, fake)
    factory = controller_factory(h.config(), clock=h.clock, rng=h.rng, environ=h.environ)
    async with factory() as controller:
        for who, name, job in (("alice", "mine", "ja"), ("bob", "mine", "jb"), ("alice", "solo", "jc")):
            fake.script(job, [pending("running")])
            principal = Principal(who, authenticated=True)
            await controller.start_operation(
                provider="acme",
                operation_id=name,
                provider_job_id=job,
                owner=who,
                stored_id=partial(stored_id, principal),
            )
    async with session(h) as (client, base):
        solo = await client.get(base + "/operation", params={"id": "solo"})
        assert solo.status_code == 200
        assert "@alice/solo" in solo.text
        owned = await client.get(base + "/operation", params={"id": "@bob/mine"})
        assert owned.status_code == 200
        both = await client.get(base + "/operation", params={"id": "mine"})
        assert both.status_code == 404
        assert "2 principals have an operation" in both.text
        assert "@alice/mine" in both.text
        assert "@bob/mine" in both.text
        none = await client.get(base + "/operation", params={"id": "nothing"})
        assert none.status_code == 404
        assert "No operation" in none.text
        # An id no operation can have (PostgreSQL refuses a NUL in text): missing, not a server error.
        for odd in ("a\x00b", "line\nbreak"):
            missing = await client.get(base + "/operation", params={"id": odd})
            assert missing.status_code == 404, odd
            assert "No operation" in missing.text


async def test_the_operation_page_offers_an_extension_only_where_the_agent_may_ask_and_shows_each_budget_of_its_limit(
    tmp_path: Path, fake: FakeProvider
) -> None:
    from tests.integration.test_approvals import Person

    h = harness(tmp_path, fake)
    await stop_after_one(h, "denied")
    async with session(h) as (client, base):
        before = (await client.get(base + "/operation", params={"id": "op-denied"})).text
        async with h.client(elicitation_callback=Person("accept", {"decision": "deny"})) as agent:
            args = {
                "operation_id": "op-denied",
                "extra_seconds": 900,
                "extra_status_requests": 4,
                "reason": "x",
            }
            assert view(await agent.call_tool("request_extension", args))["decision"] == "denied"
        after = (await client.get(base + "/operation", params={"id": "op-denied"})).text
    allowed = re.compile(r"<dt>Allowed actions</dt><dd>([^<]*)</dd>")
    assert "request_extension" in allowed.findall(before)[0]
    assert "the agent may ask for more" in before
    # A person declined: asking again now would be refused, so the page offers it nowhere (issue 30).
    assert "request_extension" not in allowed.findall(after)[0]
    assert "extend waiting once" not in after
    assert "the agent may not ask for more now" in after
    # Every budget beside its limit, from the same function as the agent's operation view.
    for page_text in (before, after):
        assert "Status requests: 1 of 1" in page_text
        assert "Transport failures: 0 of 3" in page_text
        assert "Rate limited: 0 of 3" in page_text


async def test_an_operator_sees_which_operation_holds_a_duplicates_job_though_the_other_principal_is_not_told(
    tmp_path: Path, fake: FakeProvider
) -> None:
    from functools import partial

    from pollwarden.access.ownership import stored_id
    from pollwarden.access.principals import Principal
    from pollwarden.surface.server import controller_factory

    h = harness(tmp_path, fake)
    factory = controller_factory(h.config(), clock=h.clock, rng=h.rng, environ=h.environ)
    async with factory() as controller:
        for who, name, job in (("alice", "holder", "dj-1"), ("bob", "late", "dj-2")):
            fake.script(job, [pending("running")])
            principal = Principal(who, authenticated=True)
            await controller.start_operation(
                provider="acme",
                operation_id=name,
                provider_job_id=job,
                owner=who,
                stored_id=partial(stored_id, principal),
            )
        db_write(  # what schema step 14 does where two principals tracked one job
            h.database,
            "UPDATE operations SET duplicate_of = ?, provider_job_id = ?, next_check_at = ? WHERE operation_id = ?",
            "@alice/holder",
            "dj-1",
            h.clock.now(),
            "@bob/late",
        )
        told = await controller.check_status("@bob/late", wait_seconds=30)
    assert told.stop_reason == "job_already_tracked"
    assert "@alice/holder" not in told.model_dump_json()
    async with session(h) as (client, base):
        page_text = (await client.get(base + "/operation", params={"id": "@bob/late"})).text
    assert re.search(r'<dd id="job-holder">.*?@alice/holder', page_text)
    assert "tracked on this server under another principal" in page_text
