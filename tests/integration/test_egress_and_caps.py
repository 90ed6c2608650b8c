"""One origin, no redirects, capped answers: nothing a provider or an agent sends can move a request
elsewhere or exhaust the server.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from harness import base_table, error_text, make_harness, view, write_table
from pollwarden.audit.chain import read_rows
from pollwarden.provider_io.provider_http import HttpLimits, ProviderHTTP
from pollwarden.rules.status_answer import UnusableAnswer
from pollwarden_providers.interpret import MAX_JSON_DEPTH
from pollwarden_providers.loader import load_table
from tests.support.fake_provider import FakeProvider, Step, http, pending, running_fake_provider

# SQLite only: the subject is where requests go and how big answers may be (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

TOKEN = "t0ken-for-redirect-tests"
WITH_AUTH: dict[str, Any] = {"auth": {"env": "ACME_TOKEN", "header": "Authorization", "prefix": "Bearer "}}
MIB = 1024 * 1024


async def track(client: Any, job_id: str, **extra: Any) -> dict[str, Any]:
    args = {"provider": "acme", "operation_id": "op-1", "provider_job_id": job_id, **extra}
    return view(await client.call_tool("start_operation", args))


async def check(client: Any, wait: float = 30) -> dict[str, Any]:
    return view(await client.call_tool("check_status", {"operation_id": "op-1", "wait_seconds": wait}))


def polled_notes(db: Path) -> list[object]:
    return [row.payload_obj.get("note") for row in read_rows(db, "op-1") if row.kind == "polled"]


@pytest.mark.parametrize(
    "job_id", ["../admin", "a/b", "x?y=1", "%2e%2e", "..%2F..%2Fadmin", "a#frag", "sp ace", "ünï"]
)
async def test_a_hostile_job_id_stays_one_percent_encoded_path_segment(
    tmp_path: Path, fake: FakeProvider, job_id: str
) -> None:
    fake.script(job_id, [pending()])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, job_id)
        answer = await check(client)
    assert answer["state"] == "running"
    [sent] = fake.log()
    assert sent["route"] == "status"
    assert sent["raw_path"] == "/v1/jobs/" + quote(job_id, safe="")
    assert sent["query"] == ""
    assert sent["job_id"] == job_id


@pytest.mark.parametrize("job_id", [".", ".."])
async def test_a_job_id_that_url_normalisation_would_resolve_is_refused_before_anything_is_sent(
    tmp_path: Path, fake: FakeProvider, job_id: str
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        result = await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-1", "provider_job_id": job_id}
        )
    assert "relative path" in error_text(result)
    assert fake.log() == []


@pytest.mark.parametrize("code", [302, 307])
async def test_a_redirect_to_another_port_is_never_followed_and_nothing_reaches_that_port(
    tmp_path: Path, fake: FakeProvider, code: int
) -> None:
    with running_fake_provider() as other:
        other.script("j", [pending()])
        port = other.base_url.rsplit(":", 1)[1]
        location = f"http://admin:hunter2@127.0.0.1:{port}/v1/jobs/j?token=abc"
        fake.script("redir", [http(code, headers={"Location": location})])
        h = make_harness(tmp_path, fake, table=WITH_AUTH, environ={"ACME_TOKEN": TOKEN})
        async with h.client() as client:
            await track(client, "redir")
            answer = await check(client)
            again = await check(client)
        assert other.log() == []
    assert (answer["status"], answer["stop_reason"]) == ("escalated", "integration_failure")
    assert answer["last_http_status"] == code
    assert answer["allowed_actions"] == []
    assert f"HTTP {code} redirect, not followed" in answer["stop_detail"]
    assert f"127.0.0.1:{port}/v1/jobs/j" in answer["stop_detail"]
    assert "hunter2" not in answer["stop_detail"]
    assert "token=abc" not in answer["stop_detail"]
    assert again["outcome"] == "stopped"
    [sent] = fake.log()
    assert sent["headers"]["authorization"] == f"Bearer {TOKEN}"
    [note] = polled_notes(h.db_path)
    assert f"127.0.0.1:{port}/v1/jobs/j" in str(note)


async def test_a_gzip_bomb_stops_the_operation_as_an_integration_failure_and_is_recorded(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("bomb", [Step(gzip_bomb_bytes=64 * MIB)])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "bomb")
        answer = await check(client)
    assert answer["stop_reason"] == "integration_failure"
    assert f"larger than {MIB} bytes after decompression" in answer["stop_detail"]
    [payload] = [row.payload_obj for row in read_rows(h.db_path, "op-1") if row.kind == "polled"]
    assert "after decompression" in str(payload["stop_detail"])


async def test_a_gzip_bomb_is_stopped_just_past_the_cap_without_ever_being_inflated(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("bomb", [Step(gzip_bomb_bytes=64 * MIB)])
    table = load_table(write_table(tmp_path / "tables", base_table(fake.base_url)))
    provider_http = ProviderHTTP(environ={}, now=time.time)
    try:
        await provider_http.get_status(table, "bomb")  # the fake builds and caches its compressed body
        tracemalloc.start()
        try:
            answer = await provider_http.get_status(table, "bomb")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        await provider_http.aclose()
    assert isinstance(answer, UnusableAnswer)
    assert peak < 8 * MIB  # 64 MiB would be the bomb inflated


async def test_a_large_plain_body_is_refused_at_the_cap(tmp_path: Path, fake: FakeProvider) -> None:
    big = '{"state": "running", "pad": "' + "x" * (2 * MIB) + '"}'
    fake.script("big", [Step(raw_body_text=big)])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "big")
        answer = await check(client)
    assert answer["stop_reason"] == "integration_failure"
    assert f"larger than {MIB} bytes" in answer["stop_detail"]


@pytest.mark.parametrize(
    "unreadable",
    [
        pytest.param(
            {"headers": {"Content-Encoding": "br"}, "raw_body_text": "oops"}, id="unrequested-encoding"
        ),
        pytest.param({"raw_body_text": "x" * (2 * MIB)}, id="too-large"),
    ],
)
async def test_a_server_error_whose_body_cannot_be_read_is_still_a_counted_failure_that_keeps_its_retry_after(
    tmp_path: Path, fake: FakeProvider, unreadable: dict[str, Any]
) -> None:
    # A 5xx is decided by its status and headers; its body is never read, so it cannot make it unusable.
    headers = {"Retry-After": "60", **unreadable.pop("headers", {})}
    fake.script("down", [Step(status=503, headers=headers, **unreadable)])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "down")
        answer = await check(client)
    assert (answer["status"], answer["stop_reason"]) == ("waiting", None)
    assert (answer["transport_failures_used"], answer["retry_after_seconds"]) == (1, 60.0)


async def test_a_trickling_body_is_cut_off_by_the_total_time_and_counted_as_a_transport_failure(
    tmp_path: Path, fake: FakeProvider
) -> None:
    drip = Step(body={"state": "running"}, trickle_bytes_per_second=40, trickle_total_bytes=400)
    fake.script("drip", [drip, pending()])
    h = make_harness(tmp_path, fake, http_limits=HttpLimits(total_timeout_seconds=0.5))
    started = time.monotonic()
    async with h.client() as client:
        await track(client, "drip")
        cut = await check(client)
        elapsed = time.monotonic() - started
        assert (cut["outcome"], cut["status"]) == ("polled", "waiting")
        assert cut["transport_failures_used"] == 1
        assert cut["last_http_status"] is None
        after = await check(client)
    assert elapsed < 5  # the whole body would take 10 s
    assert (after["state"], after["transport_failures_used"]) == ("running", 1)
    assert polled_notes(h.db_path)[0] == "no complete answer within 0.5 s"


async def test_a_provider_silent_longer_than_the_read_timeout_is_a_transport_failure(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("mute", [pending().replace(delay_seconds=0.5), pending()])
    h = make_harness(tmp_path, fake, http_limits=HttpLimits(read_timeout_seconds=0.2))
    async with h.client() as client:
        await track(client, "mute")
        answer = await check(client)
    assert (answer["status"], answer["transport_failures_used"]) == ("waiting", 1)
    assert polled_notes(h.db_path) == ["timed out waiting for the provider"]


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 10_000])
async def test_json_nested_too_deep_is_an_integration_failure(
    tmp_path: Path, fake: FakeProvider, depth: int
) -> None:
    deep = '{"state": "running", "x": ' + "[" * depth + "]" * depth + "}"
    fake.script("deep", [Step(raw_body_text=deep)])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "deep")
        answer = await check(client)
    assert answer["stop_reason"] == "integration_failure"
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in answer["stop_detail"]


async def test_json_exactly_at_the_depth_limit_is_read(tmp_path: Path, fake: FakeProvider) -> None:
    inner = MAX_JSON_DEPTH - 1  # the outer object is one level
    fine = '{"state": "running", "x": ' + "[" * inner + "]" * inner + "}"
    fake.script("ok", [Step(raw_body_text=fine)])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "ok")
        assert (await check(client))["state"] == "running"
