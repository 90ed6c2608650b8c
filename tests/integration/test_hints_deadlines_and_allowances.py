"""What the agent is told about time and budgets, end to end (issue 30, items 4, 8 and 9).

A provider's poll hint past the deadline is honoured up to the deadline; a
deadline that could pass before the first check may go out is refused by
name; and the operation view shows every budget beside its limit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import check, error_text, make_harness, track, view
from pollwarden.core.timefmt import iso
from tests.support.fake_provider import FakeProvider, http, pending

# SQLite only: the subject is what the agent is told about time and budgets (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


async def test_a_poll_hint_past_the_deadline_waits_until_the_deadline_and_sends_nothing_sooner(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("hint", [pending("running", poll_after_seconds=3000)])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        started = await track(client, "hint", deadline_seconds=2400)
        first = await check(client, "hint", wait=30)
        assert first["outcome"] == "polled"
        # The deadline is ~2,395 s away, the hint 3,000 s: the next check is the deadline, not a local backoff.
        assert (first["status"], first["delay_source"]) == ("waiting", "provider_poll_hint")
        assert first["next_check_at"] == started["deadline_at"]
        assert "only after the polling deadline" in first["message"]
        h.clock.advance(600)
        assert (await check(client, "hint"))["outcome"] == "not_yet"
        h.clock.advance(first["retry_after_seconds"] - 600)
        ended = await check(client, "hint")
    assert (ended["status"], ended["stop_reason"]) == ("escalated", "deadline_exceeded")
    assert len(fake.status_requests("hint")) == 1  # never polled sooner than the provider asked


async def test_a_deadline_shorter_than_the_first_checks_delay_is_refused_naming_the_minimum(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)  # base_delay_seconds 5: the first check is 2.5 to 5 s after the start
    async with h.client() as client:
        for seconds in (2, 5):
            refused = await client.call_tool(
                "start_operation",
                {
                    "provider": "acme",
                    "operation_id": "op-short",
                    "provider_job_id": "short",
                    "deadline_seconds": seconds,
                },
            )
            text = error_text(refused)
            assert f"deadline_seconds is {seconds} s from now" in text
            assert "give more than 5 s" in text
        soon = iso(h.clock.now() + 3)
        refused = await client.call_tool(
            "start_operation",
            {
                "provider": "acme",
                "operation_id": "op-short",
                "provider_job_id": "short",
                "business_deadline_at": soon,
            },
        )
        assert "business_deadline_at is 3 s from now" in error_text(refused)
        assert "give more than 5 s" in error_text(refused)
        listed = view(await client.call_tool("list_operations", {}))
        accepted = await track(client, "short", deadline_seconds=6)
    assert listed["count"] == 0  # nothing was recorded for the refused calls
    assert accepted["status"] == "waiting"
    assert fake.status_requests("short") == []


async def test_the_operation_view_shows_every_budget_beside_its_limit(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("lim", [http(429, headers={"Retry-After": "10"}), http(503), pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "lim", max_status_requests=7)
        await check(client, "lim", wait=30)
        limited = await check(client, "lim", wait=30)
        shown = view(await client.call_tool("get_operation", {"operation_id": "op-lim"}))
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert (limited["rate_limited_used"], limited["max_rate_limited"]) == (1, 3)
    assert (shown["transport_failures_used"], shown["max_transport_failures"]) == (1, 3)
    assert (shown["status_requests_used"], shown["max_status_requests"]) == (2, 7)
    assert shown["deadline_at"]
    for name in ("check_status", "get_operation", "start_operation"):
        schema = tools[name].output_schema
        assert schema is not None
        properties = schema["properties"]
        for used, limit in (
            ("status_requests_used", "max_status_requests"),
            ("transport_failures_used", "max_transport_failures"),
            ("rate_limited_used", "max_rate_limited"),
        ):
            assert {used, limit} <= set(properties), (name, used, limit)
            assert limit in schema["required"]
