"""Refused calls in the audit story: by their true kind, in time order, bounded, and never left out.

A call answered `not_yet` (too early) or `stopped` (already finished or
escalated) sends nothing. Such calls are counted and told as one summary row
per run (at most `REFUSALS_PER_SUMMARY` calls each), of one kind, written before
the next decision about the operation, and at the latest when someone reads
the story (the resource, `pollwarden audit show`, `export`) or the server stops.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import check, full_delays, make_harness, track
from pollwarden.audit.chain import read_rows
from pollwarden.audit.story import render_story
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import audit_verify, pollwarden_cli

pytestmark = pytest.mark.anyio


async def _stopped_after_one_poll(client: Any, job_id: str) -> None:
    """Track `job_id` with a budget of one request and spend it: the operation escalates at 10:20:05."""
    await track(client, job_id, max_status_requests=1)
    escalated = await check(client, job_id, wait=30)
    assert (escalated["status"], escalated["stop_reason"]) == ("escalated", "request_budget_exhausted")


async def test_a_looping_agent_on_a_stopped_operation_shows_up_in_the_story_read_through_the_resource(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("done", [pending("running")])
    h = make_harness(tmp_path, fake, rng=full_delays())  # clock at 10:20:00; first check allowed at 10:20:05
    async with h.client() as client:
        await _stopped_after_one_poll(client, "done")
        h.clock.advance(55)  # 10:21:00
        for _ in range(3):
            assert (await check(client, "done"))["outcome"] == "stopped"
            h.clock.advance(10)
        resource = await client.read_resource("pollwarden://operations/op-done/audit")

    story = resource.contents[0].text.splitlines()  # type: ignore[union-attr]
    assert story[-2:] == [
        "10:20:05 polled, state running, request budget exhausted, escalated",
        "10:21:00–10:21:20 refused 3 checks after it stopped (stopped)",
    ]
    [summary] = [row for row in read_rows(h.db_path, "op-done") if row.kind == "stopped_summary"]
    assert (summary.payload_obj["outcome"], summary.payload_obj["count"]) == ("stopped", 3)
    assert summary.payload_obj["stop_reason"] == "request_budget_exhausted"


async def test_early_and_stopped_refusals_are_told_apart_in_time_order_by_audit_show(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("late", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "late", deadline_seconds=60)  # deadline 10:21:00
        for _ in range(2):
            h.clock.advance(1)  # 10:20:01, 10:20:02: before the first allowed check
            assert (await check(client, "late"))["outcome"] == "not_yet"
        h.clock.advance(88)  # 10:21:30, past the deadline
        assert (await check(client, "late"))["stop_reason"] == "deadline_exceeded"
        for _ in range(2):
            h.clock.advance(10)  # 10:21:40, 10:21:50
            assert (await check(client, "late"))["outcome"] == "stopped"
        # The operator reads the story while the server still runs.
        shown = pollwarden_cli("audit", "show", "op-late", "--db", str(h.db_path))

    assert shown.code == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "10:20:00 tracking job late, deadline 10:21:00, budget 12",
        "10:20:01–10:20:02 refused 2 early checks (not yet)",
        "10:21:30 deadline exceeded before polling, escalated",
        "10:21:40–10:21:50 refused 2 checks after it stopped (stopped)",
    ]
    assert audit_verify(h.db_path).code == 0


async def test_a_long_loop_on_a_stopped_operation_is_bounded_and_export_includes_the_last_run(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("loop", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await _stopped_after_one_poll(client, "loop")
        for _ in range(250):
            assert (await check(client, "loop"))["outcome"] == "stopped"
        out = tmp_path / "audit.jsonl"
        exported = pollwarden_cli(
            "audit", "export", "--operation", "op-loop", "--db", str(h.db_path), "--out", str(out)
        )

    assert exported.code == 0, exported.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    summaries = [row["payload"]["count"] for row in rows if row["kind"] == "stopped_summary"]
    assert summaries == [100, 100, 50]
    assert [row["kind"] for row in rows] == ["tracking", "polled", *["stopped_summary"] * 3]
    assert len(fake.status_requests("loop")) == 1


async def test_refusals_nobody_read_are_written_when_the_server_stops(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("quiet", [pending("running")])
    h = make_harness(tmp_path, fake, rng=full_delays())  # the poll at 10:20:05 exactly
    async with h.client() as client:
        await _stopped_after_one_poll(client, "quiet")
        for _ in range(4):
            await check(client, "quiet")
    # The server has stopped: the rows are in the file, for anyone who reads it later.
    story = render_story(read_rows(h.db_path, "op-quiet"))
    assert story[-1] == "10:20:05 refused 4 checks after it stopped (stopped)"


async def test_refusals_are_written_before_the_extension_that_follows_them(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("ext", [pending("running")])
    h = make_harness(tmp_path, fake)
    h.approval_mode = "tool-confirmation"  # the client's own confirmation stands for the person here
    async with h.client() as client:
        await _stopped_after_one_poll(client, "ext")
        for _ in range(2):
            await check(client, "ext")
        extended = await client.call_tool(
            "request_extension",
            {
                "operation_id": "op-ext",
                "extra_seconds": 60,
                "extra_status_requests": 1,
                "reason": "still running",
            },
        )
        assert not extended.is_error
    kinds = [row.kind for row in read_rows(h.db_path, "op-ext")]
    assert kinds == ["tracking", "polled", "stopped_summary", "extension_approved"]
