"""Signed provider webhooks bring the next status check forward; the status request stays the truth.

Every webhook here is a real signed HTTP POST to a receiver on 127.0.0.1 (the
same app `pollwarden webhooks` serves), on the harness's fake clock; the
waiting agent in another process runs a real `pollwarden serve` child.
"""

from __future__ import annotations

import itertools
import json
import socket
import sys
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn

from harness import Harness, check, db_rows, make_harness, merge, track, view
from pollwarden.audit.chain import read_rows
from pollwarden.audit.story import render_story
from pollwarden.core.clock import Clock, SystemClock
from pollwarden.core.timefmt import parse_iso
from pollwarden.provider_io.webhooks import (
    TOLERANCE_SECONDS,
    WebhookReceiver,
    github_signature,
    receiver_app,
    sample_event,
    standard_signature_headers,
)
from pollwarden.store import open_store
from pollwarden.surface.http_serve import HttpOptions, transport_security
from pollwarden_providers import load_table, load_tables, shipped_samples_dir, shipped_tables_dir
from pollwarden_providers.webhook import read_event
from tests.support.fake_provider import FakeProvider, pending, succeeded
from tests.support.live import call, stdio_server, write_table

# SQLite only: the subject is verifying webhooks; tests marked both_engines are the wake-up's (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

SECRET = "whsec_" + "dGVzdC1zZWNyZXQtZm9yLXBvbGx3YXJkZW4td2ViaG9va3M="  # base64 of a test secret
OTHER_SECRET = "whsec_" + "YW5vdGhlci1zZWNyZXQtbm90LXRoZS1yaWdodC1vbmUh"
GITHUB_SECRET = "github-test-secret"
STANDARD = {
    "webhook": {
        "scheme": "standard",
        "secret_env": "ACME_WEBHOOK_SECRET",
        "job_id_fields": ["data.id"],
        "events": ["job.completed", "job.failed"],
        "max_body_bytes": 4096,
    }
}
GITHUB = {
    "webhook": {
        "scheme": "github",
        "secret_env": "ACME_WEBHOOK_SECRET",
        "job_id_fields": ["workflow_run.id"],
        "event_type_header": "X-GitHub-Event",
        "event_type_field": "action",
        "events": ["workflow_run.completed"],
    }
}


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@asynccontextmanager
async def receiving(
    h: Harness, *, secret: str = SECRET, clock: Clock | None = None
) -> AsyncGenerator[tuple[httpx2.AsyncClient, WebhookReceiver]]:
    """The webhook receiver on 127.0.0.1 for the harness's tables and database, and a client posting to it."""
    write_table(h.tables_dir, h.table)
    tables = load_tables([h.tables_dir])
    receiver = WebhookReceiver(tables=tables, clock=clock or h.clock, environ={"ACME_WEBHOOK_SECRET": secret})
    app = receiver_app(receiver, transport_security(HttpOptions()), lambda: open_store(h.database))
    sock = _socket()
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(app, log_level="warning", http="h11", loop="asyncio", lifespan="on")
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for this
                await anyio.sleep(0.01)
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            try:
                yield client, receiver
            finally:
                server.should_exit = True


def standard_post(
    job_id: str, *, event_id: str, at: float, event_type: str = "job.completed", secret: str = SECRET
) -> tuple[bytes, dict[str, str]]:
    body = sample_event({"id": event_id, "type": event_type, "data": {"id": job_id}})
    headers = standard_signature_headers(secret, event_id, int(at), body)
    return body, {**headers, "Content-Type": "application/json"}


async def post(client: httpx2.AsyncClient, body: bytes, headers: dict[str, str]) -> httpx2.Response:
    return await client.post("/webhooks/acme", content=body, headers=headers)


def version_of(h: Harness, operation_id: str) -> tuple[int, float]:
    [row] = db_rows(
        h.db_path, "SELECT version, next_check_at FROM operations WHERE operation_id = ?", operation_id
    )
    return int(row["version"]), float(row["next_check_at"])


def remembered_events(h: Harness) -> int:
    [row] = db_rows(h.db_path, "SELECT count(*) AS n FROM webhook_events")
    return int(row["n"])


async def waiting_after_first_poll(client: Any, h: Harness, job: str) -> dict[str, Any]:
    """Start tracking `job` and make its first check (running): the next check is 10 s away."""
    await track(client, job)
    first = await check(client, job, wait=20)
    assert (first["outcome"], first["state"], first["status"]) == ("polled", "running", "waiting")
    assert first["retry_after_seconds"] > 5
    return first


# -- the wake-up ---------------------------------------------------------------------------------


@pytest.mark.both_engines
async def test_a_signed_standard_webhook_brings_the_next_check_to_now_and_one_request_confirms(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("std", [pending("running"), succeeded()])
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with h.client() as client, receiving(h) as (hooks, receiver):
        await waiting_after_first_poll(client, h, "std")
        body, headers = standard_post("std", event_id="evt_1", at=h.clock.now())
        answer = await post(hooks, body, headers)
        assert (answer.status_code, answer.json()["outcome"]) == (200, "woken")
        woken = view(await client.call_tool("get_operation", {"operation_id": "op-std"}))
        assert (woken["delay_source"], woken["retry_after_seconds"]) == ("provider_webhook", 0.0)
        assert woken["status_requests_used"] == 1  # a webhook changes no budget
        done = await check(client, "std")
    assert (done["outcome"], done["status"]) == ("polled", "succeeded")
    assert len(fake.status_requests("std")) == 2  # the first poll and one confirming request
    assert receiver.counts["woken"] == 1
    story = render_story(read_rows(h.db_path, "op-std"))
    assert any("woken by webhook job.completed (event evt_1)" in line for line in story), story
    assert any("from provider webhook" in line for line in story), story


async def test_a_signed_github_webhook_wakes_its_run_and_the_check_confirms(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("4242", [pending("running"), succeeded()])
    h = make_harness(tmp_path, fake, table=GITHUB)
    async with h.client() as client, receiving(h, secret=GITHUB_SECRET) as (hooks, _):
        await waiting_after_first_poll(client, h, "4242")
        body = sample_event({"action": "completed", "workflow_run": {"id": 4242, "status": "completed"}})
        headers = {
            "X-GitHub-Event": "workflow_run",
            "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            "X-Hub-Signature-256": github_signature(GITHUB_SECRET, body),
            "Content-Type": "application/json",
        }
        answer = await post(hooks, body, headers)
        assert (answer.status_code, answer.json()["outcome"]) == (200, "woken")
        done = await check(client, "4242")
    assert (done["outcome"], done["status"]) == ("polled", "succeeded")
    assert len(fake.status_requests("4242")) == 2


# -- what changes nothing ------------------------------------------------------------------------


def _tampered(job: str, at: float) -> tuple[bytes, dict[str, str]]:
    body, headers = standard_post(job, event_id="evt_t", at=at)
    return body.replace(b"job.completed", b"job.failed_"), headers


def _wrong_secret(job: str, at: float) -> tuple[bytes, dict[str, str]]:
    return standard_post(job, event_id="evt_w", at=at, secret=OTHER_SECRET)


def _stale(job: str, at: float) -> tuple[bytes, dict[str, str]]:
    return standard_post(job, event_id="evt_s", at=at - TOLERANCE_SECONDS - 1)


def _future(job: str, at: float) -> tuple[bytes, dict[str, str]]:
    return standard_post(job, event_id="evt_f", at=at + TOLERANCE_SECONDS + 1)


def _unsigned(job: str, at: float) -> tuple[bytes, dict[str, str]]:
    body, headers = standard_post(job, event_id="evt_u", at=at)
    return body, {k: v for k, v in headers.items() if k != "webhook-signature"}


@pytest.mark.parametrize(
    "forge",
    [_tampered, _wrong_secret, _stale, _future, _unsigned],
    ids=["tampered body", "wrong secret", "stale timestamp", "future timestamp", "no signature"],
)
async def test_a_webhook_that_fails_verification_gets_401_and_changes_nothing(
    tmp_path: Path, fake: FakeProvider, forge: Any
) -> None:
    fake.script("bad", [pending("running"), succeeded()])
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with h.client() as client, receiving(h) as (hooks, receiver):
        await waiting_after_first_poll(client, h, "bad")
        before = version_of(h, "op-bad")
        body, headers = forge("bad", h.clock.now())
        answer = await post(hooks, body, headers)
        assert answer.status_code == 401
        assert version_of(h, "op-bad") == before
        assert remembered_events(h) == 0
        early = await check(client, "bad")
    assert early["outcome"] == "not_yet"
    assert len(fake.status_requests("bad")) == 1
    assert receiver.counts["refused_401"] == 1


@pytest.mark.parametrize("wrong", ["tampered", "wrong secret", "no signature"])
async def test_a_github_webhook_with_a_wrong_signature_gets_401_and_changes_nothing(
    tmp_path: Path, fake: FakeProvider, wrong: str
) -> None:
    fake.script("77", [pending("running")])
    h = make_harness(tmp_path, fake, table=GITHUB)
    async with h.client() as client, receiving(h, secret=GITHUB_SECRET) as (hooks, _):
        await waiting_after_first_poll(client, h, "77")
        before = version_of(h, "op-77")
        body = sample_event({"action": "completed", "workflow_run": {"id": 77}})
        signature = github_signature(OTHER_SECRET if wrong == "wrong secret" else GITHUB_SECRET, body)
        if wrong == "tampered":
            body = body.replace(b"77", b"78")
        headers = {
            "X-GitHub-Event": "workflow_run",
            "X-GitHub-Delivery": "d-1",
            "Content-Type": "application/json",
        }
        if wrong != "no signature":
            headers["X-Hub-Signature-256"] = signature
        answer = await post(hooks, body, headers)
    assert answer.status_code == 401
    assert version_of(h, "op-77") == before
    assert remembered_events(h) == 0


async def test_a_timestamp_of_digits_that_are_not_ascii_gets_401_and_changes_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # "²" is a digit to str.isdigit but not to int(): it must be refused like any unusable timestamp.
    fake.script("sup", [pending("running")])
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with h.client() as client, receiving(h) as (hooks, _):
        await waiting_after_first_poll(client, h, "sup")
        before = version_of(h, "op-sup")
        body, headers = standard_post("sup", event_id="evt_sup", at=h.clock.now())
        answer = await hooks.post(
            "/webhooks/acme", content=body, headers={**headers, "webhook-timestamp": "²".encode("latin-1")}
        )
    assert answer.status_code == 401
    assert "webhook-timestamp" in answer.text
    assert version_of(h, "op-sup") == before
    assert remembered_events(h) == 0


@pytest.mark.both_engines
async def test_a_replayed_event_id_is_acknowledged_and_never_wakes_again(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("rep", [pending("running"), pending("running"), succeeded()])
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with h.client() as client, receiving(h) as (hooks, _):
        await waiting_after_first_poll(client, h, "rep")
        body, headers = standard_post("rep", event_id="evt_once", at=h.clock.now())
        assert (await post(hooks, body, headers)).json()["outcome"] == "woken"
        confirmed = await check(client, "rep")
        assert (confirmed["outcome"], confirmed["state"]) == ("polled", "running")
        before = version_of(h, "op-rep")
        replay = await post(hooks, body, headers)  # the same signed request, sent again
        assert (replay.status_code, replay.json()["outcome"]) == (200, "replayed")
        assert version_of(h, "op-rep") == before
        assert (await check(client, "rep"))["outcome"] == "not_yet"
    assert len(fake.status_requests("rep")) == 2


async def test_an_oversized_body_is_refused_with_413_before_it_is_read_or_verified(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("big", [pending("running")])
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with h.client() as client, receiving(h) as (hooks, _):
        await waiting_after_first_poll(client, h, "big")
        before = version_of(h, "op-big")
        event = {"id": "evt_big", "type": "job.completed", "data": {"id": "big"}, "pad": "x" * 5000}
        body = sample_event(event)
        headers = {**standard_signature_headers(SECRET, "evt_big", int(h.clock.now()), body)}
        answer = await post(hooks, body, {**headers, "Content-Type": "application/json"})

        async def trickle() -> AsyncGenerator[bytes]:  # no Content-Length: the cap counts the bytes
            for start in range(0, len(body), 1000):
                yield body[start : start + 1000]

        chunked = await hooks.post(
            "/webhooks/acme", content=trickle(), headers={**headers, "Content-Type": "application/json"}
        )
    assert (answer.status_code, chunked.status_code) == (413, 413)
    assert version_of(h, "op-big") == before


@pytest.mark.both_engines
async def test_an_unknown_job_or_event_type_gets_2xx_and_is_counted_not_stored(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("known", [pending("running")])
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with h.client() as client, receiving(h) as (hooks, receiver):
        await waiting_after_first_poll(client, h, "known")
        before = version_of(h, "op-known")
        stranger = await post(hooks, *standard_post("nobody-tracks-this", event_id="evt_a", at=h.clock.now()))
        other_type = await post(
            hooks, *standard_post("known", event_id="evt_b", at=h.clock.now(), event_type="job.progress")
        )
        wrong_provider = await hooks.post(
            "/webhooks/no-such-provider", content=b"{}", headers={"Content-Type": "application/json"}
        )
    assert (stranger.status_code, stranger.json()["outcome"]) == (200, "unknown_job")
    assert (other_type.status_code, other_type.json()["outcome"]) == (202, "ignored_event_type")
    assert wrong_provider.status_code == 404
    assert (receiver.counts["unknown_job"], receiver.counts["ignored_event_type"]) == (1, 1)
    assert remembered_events(h) == 0
    assert version_of(h, "op-known") == before


async def test_a_webhook_with_a_foreign_host_header_is_refused_like_the_mcp_endpoint(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with receiving(h) as (hooks, _):
        body, headers = standard_post("x", event_id="evt_h", at=h.clock.now())
        answer = await post(hooks, body, {**headers, "Host": "evil.example"})
    assert answer.status_code == 421


@pytest.mark.both_engines
async def test_a_burst_of_1000_events_for_one_job_wakes_it_once_and_costs_one_request(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("burst", [pending("running"), succeeded()])
    h = make_harness(tmp_path, fake, table=STANDARD)
    outcomes: list[str] = []
    async with h.client() as client, receiving(h) as (hooks, receiver):
        await waiting_after_first_poll(client, h, "burst")

        async def sender(first: int) -> None:
            for n in range(first, 1000, 20):
                answer = await post(hooks, *standard_post("burst", event_id=f"evt_{n}", at=h.clock.now()))
                outcomes.append(answer.json()["outcome"])

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for first in range(20):
                    tg.start_soon(sender, first)
        done = await check(client, "burst")
        again = await check(client, "burst")
    assert len(outcomes) == 1000
    assert outcomes.count("woken") == 1
    assert receiver.counts["not_woken"] == 999
    assert (done["outcome"], done["status"]) == ("polled", "succeeded")
    assert again["outcome"] == "stopped"
    assert len(fake.status_requests("burst")) == 2
    story = render_story(read_rows(h.db_path, "op-burst"))
    assert sum("woken by webhook" in line for line in story) == 1


@pytest.mark.both_engines
async def test_wakes_for_many_jobs_at_once_still_go_out_at_the_fleet_pace(
    tmp_path: Path, fake: FakeProvider
) -> None:
    jobs = [f"fl{n}" for n in range(6)]
    for job in jobs:
        fake.script(job, [pending("running"), succeeded()])
    table = merge(STANDARD, {"fleet": {"max_requests_per_second": 2, "burst": 1}})
    h = make_harness(tmp_path, fake, table=table)
    async with h.client() as client, receiving(h) as (hooks, _):
        for job in jobs:
            await track(client, job)
        h.clock.advance(2)  # the first checks are due only after 2.5-5 s, whatever the draws: not yet
        for n, job in enumerate(jobs):
            answer = await post(hooks, *standard_post(job, event_id=f"evt_fl{n}", at=h.clock.now()))
            assert answer.json()["outcome"] == "woken"
        results = [await check(client, job, wait=20) for job in jobs]
    assert all(r["outcome"] == "polled" for r in results)
    # The fleet's 2 requests per second held: the wake-ups moved the checks forward, not the pace.
    times = sorted(parse_iso(r["last_http_at"]) for r in results)
    assert all(b - a >= 0.5 - 1e-6 for a, b in itertools.pairwise(times)), times


@pytest.mark.both_engines
async def test_a_webhook_never_moves_a_check_before_a_retry_after_still_in_force(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("ra", [pending("running").replace(headers={"Retry-After": "300"}), succeeded()])
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with h.client() as client, receiving(h) as (hooks, _):
        await track(client, "ra")
        first = await check(client, "ra", wait=20)
        assert first["delay_source"] == "provider_retry_after"
        before = version_of(h, "op-ra")
        answer = await post(hooks, *standard_post("ra", event_id="evt_ra", at=h.clock.now()))
        assert answer.json()["outcome"] == "not_woken"
        assert version_of(h, "op-ra") == before
        assert (await check(client, "ra"))["outcome"] == "not_yet"
    assert len(fake.status_requests("ra")) == 1


@pytest.mark.both_engines
async def test_a_webhook_after_the_deadline_wakes_nothing_and_the_check_stops_as_before(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("late", [pending("running"), succeeded()])
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with h.client() as client, receiving(h) as (hooks, _):
        await track(client, "late", deadline_seconds=8)
        first = await check(client, "late", wait=7)
        assert first["outcome"] == "polled"
        h.clock.advance(5)  # past the deadline (8 s), before the next planned check (15 s)
        answer = await post(hooks, *standard_post("late", event_id="evt_late", at=h.clock.now()))
        assert answer.json()["outcome"] == "not_woken"
        stopped = await check(client, "late")
    assert (stopped["outcome"], stopped["stop_reason"]) == ("stopped", "deadline_exceeded")
    assert len(fake.status_requests("late")) == 1


async def test_a_forged_completed_event_for_a_running_job_costs_one_request_and_the_job_keeps_waiting(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("liar", [pending("running"), pending("running")])
    h = make_harness(tmp_path, fake, table=STANDARD)
    async with h.client() as client, receiving(h) as (hooks, _):
        await waiting_after_first_poll(client, h, "liar")
        # Signed, but the provider's status endpoint says otherwise: the status request decides.
        await post(hooks, *standard_post("liar", event_id="evt_lie", at=h.clock.now()))
        confirmed = await check(client, "liar")
    assert (confirmed["outcome"], confirmed["status"], confirmed["state"]) == ("polled", "waiting", "running")
    assert confirmed["delay_source"] == "local_backoff"
    assert confirmed["retry_after_seconds"] > 0
    assert len(fake.status_requests("liar")) == 2


# -- another process -----------------------------------------------------------------------------


@pytest.mark.both_engines
@pytest.mark.slow
async def test_an_agent_waiting_in_another_process_is_woken_within_2_s_at_one_confirming_request(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("far", [succeeded()])
    # The first check is allowed 12-24 s after the start (inside the 30 s a call may wait): only a
    # webhook can make it sooner.
    h = make_harness(tmp_path, fake, table=merge(STANDARD, {"schedule": {"base_delay_seconds": 24}}))
    write_table(h.tables_dir, h.table)
    async with stdio_server(h.db_path, h.tables_dir, errlog=tmp_path / "server.log") as agent:
        await call(agent, "start_operation", provider="acme", operation_id="op-far", provider_job_id="far")
        async with receiving(h, clock=SystemClock()) as (hooks, _), anyio.create_task_group() as tg:
            answers: list[dict[str, Any]] = []
            answered = anyio.Event()

            async def wait_for_it() -> None:
                answers.append(await call(agent, "check_status", operation_id="op-far", wait_seconds=30))
                answered.set()

            tg.start_soon(wait_for_it)
            await anyio.sleep(1.0)  # the agent is now sleeping inside check_status, in the child
            assert not answers
            assert fake.status_requests("far") == []
            sent_at = time.monotonic()
            answer = await post(hooks, *standard_post("far", event_id="evt_far", at=time.time()))
            assert answer.json()["outcome"] == "woken"
            with anyio.fail_after(10):
                await answered.wait()
            noticed = time.monotonic() - sent_at
    assert (answers[0]["outcome"], answers[0]["status"]) == ("polled", "succeeded")
    assert len(fake.status_requests("far")) == 1
    assert noticed < 2.0, f"noticed {noticed:.2f} s after the webhook"


# -- the tables ----------------------------------------------------------------------------------


def test_the_shipped_webhook_samples_name_their_job_and_event_as_the_tables_say() -> None:
    tables = load_tables([], include_shipped=True)
    cases = [
        ("openai-batch", "batch.completed.json", {}, ("batch.completed", True, "batch_abc123")),
        ("openai-batch", "response.completed.json", {}, ("response.completed", False, None)),
        (
            "replicate-predictions",
            "completed-succeeded.json",
            {},
            ("succeeded", True, "qz8m4r2hxsrmc0ckt9vb3ny7je"),
        ),
        ("replicate-predictions", "output-processing.json", {}, ("processing", False, None)),
        (
            "github-actions-runs",
            "workflow_run.completed.json",
            {"x-github-event": "workflow_run"},
            ("workflow_run.completed", True, "acme/widgets/19874563210"),
        ),
    ]
    for name, sample, headers, expected in cases:
        spec = tables[name].webhook
        assert spec is not None, name
        body = json.loads((shipped_samples_dir() / name / "webhooks" / sample).read_text())
        event = read_event(spec, body, headers)
        assert (event.event_type, event.wakes, event.job_id) == expected, (name, sample, event)


def test_a_github_event_without_its_event_header_is_not_read_as_a_wake() -> None:
    table = load_table(shipped_tables_dir() / "github-actions-runs.toml")
    assert table.webhook is not None
    body = json.loads(
        (shipped_samples_dir() / "github-actions-runs/webhooks/workflow_run.completed.json").read_text()
    )
    event = read_event(table.webhook, body, {})
    assert (event.wakes, event.problem) == (False, "no X-GitHub-Event header")


@pytest.mark.parametrize(
    ("webhook", "says"),
    [
        ({"scheme": "svix"}, "scheme"),
        ({"secret_env": "whsec_abc+/="}, "not an environment variable name"),
        ({"events": []}, "no event type is listed"),
        ({"job_id_fields": ["data..id"]}, "dotted path"),
        ({"events": ["batch.completed", "batch.completed"]}, "listed twice"),
    ],
)
def test_a_wrong_webhook_section_is_refused_at_load_naming_the_key(
    tmp_path: Path, webhook: dict[str, Any], says: str
) -> None:
    from harness import acme_refusal

    error = acme_refusal(tmp_path, {"webhook": {**STANDARD["webhook"], **webhook}})
    assert "webhook" in str(error)
    assert says in str(error)


def test_providers_check_reads_a_saved_webhook_body(tmp_path: Path) -> None:
    import subprocess

    sample = shipped_samples_dir() / "openai-batch" / "webhooks" / "batch.completed.json"
    done = subprocess.run(
        [sys.executable, "-m", "pollwarden", "providers", "check", "openai-batch", "--webhook", str(sample)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "event 'batch.completed' for job 'batch_abc123'" in done.stdout


# -- the two ways to run the receiver ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("command", ["serve --transport http", "webhooks"])
async def test_serve_over_http_and_the_standalone_receiver_both_take_signed_webhooks_on_loopback(
    tmp_path: Path, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    from tests.integration.test_restart_and_transports import child_process, free_port, wait_until_listening

    monkeypatch.setenv("ACME_WEBHOOK_SECRET", SECRET)  # the child's environment names the secret
    fake.script("proc", [pending("running")])
    h = make_harness(tmp_path, fake, table=merge(STANDARD, {"schedule": {"base_delay_seconds": 24}}))
    write_table(h.tables_dir, h.table)
    async with stdio_server(h.db_path, h.tables_dir, errlog=tmp_path / "agent.log") as agent:
        await call(agent, "start_operation", provider="acme", operation_id="op-proc", provider_job_id="proc")
    port = free_port()
    args = ["-m", "pollwarden", *command.split(), "--db", str(h.db_path), "--providers", str(h.tables_dir)]
    log = tmp_path / "receiver.log"
    with child_process([*args, "--port", str(port)], log) as proc:
        await wait_until_listening(proc, port, log)
        base = f"http://127.0.0.1:{port}"
        async with httpx2.AsyncClient(base_url=base, trust_env=False) as hooks:
            body, headers = standard_post("proc", event_id="evt_proc", at=time.time())
            tampered = await post(hooks, body.replace(b"proc", b"prod"), headers)
            foreign = await post(hooks, body, {**headers, "Host": "evil.example"})
            woken = await post(hooks, body, headers)
            replayed = await post(hooks, body, headers)
            mcp = await hooks.post("/mcp", content=b"{}", headers={"Content-Type": "application/json"})
            ready = await hooks.get("/readyz")
            scraped = await hooks.get("/metrics")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    assert 'pollwarden_webhook_events_total{result="woken"} 1.0' in scraped.text
    # The shutdown log counts results by name (it printed an enum's repr before).
    assert "webhooks received: {" in log.read_text()
    assert "'woken': 1" in log.read_text()
    assert "WakeOutcome" not in log.read_text()
    assert (tampered.status_code, foreign.status_code) == (401, 421)
    assert (woken.status_code, woken.json()["outcome"]) == (200, "woken")
    assert replayed.json()["outcome"] == "replayed"
    # `serve` still answers MCP beside the webhooks; the standalone receiver serves nothing else.
    assert (mcp.status_code != 404) == (command != "webhooks")
    assert f"Uvicorn running on http://127.0.0.1:{port}" in log.read_text()
    assert fake.status_requests("proc") == []  # a webhook alone never sends a request


def github_post(body: bytes, delivery: str) -> dict[str, str]:
    return {
        "X-GitHub-Event": "workflow_run",
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": github_signature(GITHUB_SECRET, body),
        "Content-Type": "application/json",
    }


async def test_one_github_delivery_resent_under_new_delivery_ids_wakes_once(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("555", [pending("running"), pending("running"), pending("running")])
    h = make_harness(tmp_path, fake, table=GITHUB)
    async with h.client() as client, receiving(h, secret=GITHUB_SECRET) as (hooks, receiver):
        await waiting_after_first_poll(client, h, "555")
        body = sample_event({"action": "completed", "workflow_run": {"id": 555, "status": "completed"}})
        first = await post(hooks, body, github_post(body, "delivery-1"))
        assert first.json()["outcome"] == "woken"
        await check(client, "555")  # the confirming request: the next check is in the future again
        before = version_of(h, "op-555")
        for delivery in ("delivery-2", "delivery-3", "delivery-4"):
            again = await post(hooks, body, github_post(body, delivery))  # the captured body, a new id
            assert (again.status_code, again.json()["outcome"]) == (200, "replayed")
        assert version_of(h, "op-555") == before
        assert (await check(client, "555"))["outcome"] == "not_yet"
    assert len(fake.status_requests("555")) == 2
    assert receiver.counts["replayed"] == 3


async def test_a_github_event_about_a_run_updated_longer_ago_than_the_tolerance_is_refused(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("808", [pending("running"), succeeded()])
    table = {"webhook": {**GITHUB["webhook"], "timestamp_field": "workflow_run.updated_at"}}
    h = make_harness(tmp_path, fake, table=table)

    def run_event(updated: float) -> bytes:
        stamp = datetime.fromtimestamp(updated, UTC).isoformat().replace("+00:00", "Z")
        return sample_event({"action": "completed", "workflow_run": {"id": 808, "updated_at": stamp}})

    async with h.client() as client, receiving(h, secret=GITHUB_SECRET) as (hooks, _):
        await waiting_after_first_poll(client, h, "808")
        before = version_of(h, "op-808")
        stale = run_event(h.clock.now() - TOLERANCE_SECONDS - 1)
        refused = await post(hooks, stale, github_post(stale, "d-old"))
        assert refused.status_code == 401
        assert "workflow_run.updated_at is too old" in refused.json()["error"]
        assert version_of(h, "op-808") == before
        assert remembered_events(h) == 0
        fresh = run_event(h.clock.now() - 5)
        assert (await post(hooks, fresh, github_post(fresh, "d-new"))).json()["outcome"] == "woken"


def test_the_shipped_github_table_dates_its_events_by_the_runs_last_update() -> None:
    spec = load_tables([])["github-actions-runs"].webhook
    assert spec is not None
    assert spec.timestamp_field == "workflow_run.updated_at"
