"""The check procedure end to end: real fake provider over HTTP, the SDK client, an injected clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import error_text, make_harness, view
from tests.support.fake_provider import FakeProvider, http, pending, succeeded

pytestmark = pytest.mark.anyio

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]


async def _start(client: Any, job_id: str, **extra: Any) -> dict[str, Any]:
    args = {"provider": "acme", "operation_id": f"op-{job_id}", "provider_job_id": job_id, **extra}
    return view(await client.call_tool("start_operation", args))


async def _check(client: Any, operation_id: str, wait: float = 0) -> dict[str, Any]:
    return view(await client.call_tool("check_status", {"operation_id": operation_id, "wait_seconds": wait}))


@pytest.mark.parametrize("era", ERAS)
async def test_a_job_that_queues_runs_and_succeeds_is_polled_once_per_allowed_slot(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("j1", [pending("queued"), pending("running"), succeeded()])
    h = make_harness(tmp_path, fake)
    async with h.client(**era) as client:
        started = await _start(client, "j1")
        assert started["status"] == "waiting"
        assert started["status_requests_used"] == 0
        # Too early: the first request is allowed after the attempt-0 delay.
        early = await _check(client, "op-j1")
        assert early["outcome"] == "not_yet"
        assert early["retry_after_seconds"] > 0
        assert fake.status_requests("j1") == []

        first = await _check(client, "op-j1", wait=30)
        assert first["outcome"] == "polled"
        assert first["state"] == "queued"
        assert first["delay_source"] == "local_backoff"
        again = await _check(client, "op-j1")
        assert again["outcome"] == "not_yet"

        second = await _check(client, "op-j1", wait=30)
        third = await _check(client, "op-j1", wait=30)
        assert (second["state"], third["state"]) == ("running", "succeeded")
        assert third["outcome"] == "polled"
        assert third["status"] == "succeeded"
        assert third["stop_reason"] == "succeeded"
        assert third["result"] == {"result_url": "https://files.example/j1.csv"}
        assert third["allowed_actions"] == ["fetch_result"]

        after = await _check(client, "op-j1", wait=30)
        assert after["outcome"] == "stopped"
    assert len(fake.status_requests("j1")) == 3


async def test_a_running_job_stops_at_once_on_the_last_budgeted_request(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j2", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await _start(client, "j2", max_status_requests=3)
        results = [await _check(client, "op-j2", wait=30) for _ in range(3)]
        assert [r["outcome"] for r in results] == ["polled", "polled", "polled"]
        last = results[-1]
        assert last["status"] == "escalated"
        assert last["stop_reason"] == "request_budget_exhausted"
        assert last["status_requests_used"] == 3
        assert last["escalation"]["reason"] == "request_budget_exhausted"
        assert "Status requests: 3 of 3" in last["escalation"]["message"]
        assert "request_extension" in last["allowed_actions"]
        for _ in range(5):
            assert (await _check(client, "op-j2", wait=30))["outcome"] == "stopped"
    assert len(fake.status_requests("j2")) == 3


async def test_retry_after_on_a_503_is_a_minimum_for_the_next_request(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j3", [http(503, headers={"Retry-After": "120"}), pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await _start(client, "j3")
        answer = await _check(client, "op-j3", wait=30)
        assert answer["last_http_status"] == 503
        assert answer["delay_source"] == "provider_retry_after"
        assert answer["retry_after_seconds"] == pytest.approx(120, abs=0.01)
        assert answer["transport_failures_used"] == 1
        h.clock.advance(119)
        assert (await _check(client, "op-j3"))["outcome"] == "not_yet"
        h.clock.advance(1)
        assert (await _check(client, "op-j3"))["outcome"] == "polled"


async def test_an_unknown_provider_is_refused_with_the_known_ones(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        result = await client.call_tool("start_operation", {"provider": "nope", "provider_job_id": "x"})
        text = error_text(result)
        assert "unknown provider 'nope'" in text
        assert "acme" in text
