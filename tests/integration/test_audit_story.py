"""The audit an operator reads: the story of a scripted scenario, bounded refusals, the CLI on real data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import error_text, full_delays, make_harness, view
from pollwarden.audit.chain import read_rows
from pollwarden.audit.story import render_story
from pollwarden.audit.verify import verify_chain
from tests.support.fake_provider import FakeProvider, http, pending, succeeded
from tests.support.live import pollwarden_cli

# SQLite only: the subject is how the audit story reads (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


async def test_the_story_of_queued_503_running_succeeded_matches_the_expected_lines(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script(
        "exp_71c",
        [
            pending("queued"),
            http(503, headers={"Retry-After": "120", "X-Request-Id": "req-2"}),
            pending("running"),
            succeeded(),
        ],
    )
    # The clock starts 2025-04-18T10:20:00Z; the draws are chosen at 1.0 (every delay its raw maximum).
    h = make_harness(tmp_path, fake, rng=full_delays())
    async with h.client() as client:
        await client.call_tool(
            "start_operation",
            {"provider": "acme", "operation_id": "report-export-2025-04-18-01", "provider_job_id": "exp_71c"},
        )
        op = {"operation_id": "report-export-2025-04-18-01", "wait_seconds": 30}
        view(await client.call_tool("check_status", op))  # queued
        view(await client.call_tool("check_status", op))  # 503, Retry-After 120
        h.clock.advance(120)
        view(await client.call_tool("check_status", {**op, "wait_seconds": 0}))  # running
        h.clock.advance(10)  # the next poll is 40 s away: more than one call waits (CALL_BUDGET_SECONDS)
        final = view(await client.call_tool("check_status", op))  # succeeded
        assert final["status"] == "succeeded"
        resource = await client.read_resource("pollwarden://operations/report-export-2025-04-18-01/audit")

    expected = [
        "10:20:00 tracking job exp_71c, deadline 11:00:00, budget 12",
        "10:20:05 polled, state queued, next poll 10:20:15 from local backoff",
        "10:20:15 received 503, Retry-After 120, next poll 10:22:15 from provider guidance",
        "10:22:15 polled, state running, next poll 10:22:55 from local backoff",
        "10:22:55 polled, state succeeded, succeeded",
    ]
    story = render_story(read_rows(h.db_path, "report-export-2025-04-18-01"))
    assert story == expected
    assert resource.contents[0].text.splitlines() == expected  # type: ignore[union-attr]

    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "pollwarden",
            "audit",
            "show",
            "report-export-2025-04-18-01",
            "--db",
            str(h.db_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == expected


async def test_every_decision_row_carries_the_fields_an_operator_needs(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j1", [http(503, headers={"Retry-After": "30", "X-Request-Id": "req-9"}), pending("running")])
    h = make_harness(tmp_path, fake, rng=full_delays())  # the first check at 10:20:05 exactly
    async with h.client() as client:
        await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-j1", "provider_job_id": "j1"}
        )
        view(await client.call_tool("check_status", {"operation_id": "op-j1", "wait_seconds": 30}))
    polled = next(r for r in read_rows(h.db_path, "op-j1") if r.kind == "polled")
    payload: dict[str, Any] = polled.payload_obj
    # The values, not just the keys: a row that recorded the wrong state, deadline or delay source fails here.
    assert {key: payload[key] for key in ("decision", "outcome", "status", "state", "category")} == {
        "decision": "polled",
        "outcome": "polled",
        "status": "waiting",
        "state": None,  # a 503 carries no job state
        "category": None,
    }
    assert payload["next_check_at"] == "2025-04-18T10:20:35.000Z"  # polled at 10:20:05, Retry-After 30
    assert payload["deadline_at"] == "2025-04-18T11:00:00.000Z"
    assert (payload["stop_reason"], payload["transport_failures_used"]) == (None, 1)
    assert payload["http_status"] == 503
    assert payload["delay_source"] == "provider_retry_after"
    assert payload["retry_after_seconds"] == 30
    assert payload["provider_request_id"] == "req-9"
    assert (payload["status_requests_used"], payload["max_status_requests"]) == (1, 12)


async def test_a_looping_agent_is_summarised_not_recorded_call_by_call(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("loop", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-loop", "provider_job_id": "loop"}
        )
        for _ in range(250):
            assert (
                view(await client.call_tool("check_status", {"operation_id": "op-loop"}))["outcome"]
                == "not_yet"
            )
        view(await client.call_tool("check_status", {"operation_id": "op-loop", "wait_seconds": 30}))
    rows = read_rows(h.db_path, "op-loop")
    summaries = [r for r in rows if r.kind == "not_yet_summary"]
    assert sum(int(r.payload_obj["count"]) for r in summaries) == 250
    assert len(rows) <= 6  # tracking, 3 summaries, polled
    story = render_story(rows)
    assert any("refused 100 early checks (not yet)" in line for line in story)
    assert any("refused 50 early checks (not yet)" in line for line in story)
    assert story[-1].endswith("from local backoff")
    assert fake.status_requests("loop")
    assert len(fake.status_requests("loop")) == 1


async def test_the_chain_verifies_and_export_writes_one_json_line_per_decision(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j2", [pending("running"), succeeded()])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-j2", "provider_job_id": "j2"}
        )
        for _ in range(2):
            view(await client.call_tool("check_status", {"operation_id": "op-j2", "wait_seconds": 30}))
    assert verify_chain(h.db_path, None).ok
    out = tmp_path / "audit.jsonl"
    exported = subprocess.run(
        [sys.executable, "-m", "pollwarden", "audit", "export", "--db", str(h.db_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["tracking", "polled", "polled"]
    verified = subprocess.run(
        [sys.executable, "-m", "pollwarden", "audit", "verify", "--db", str(h.db_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verified.returncode == 0
    assert "audit chain OK: 3 rows" in verified.stdout


async def test_a_keyed_server_never_extends_an_unkeyed_chain_until_an_operator_rekeys_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    key = "an-audit-key-the-agent-does-not-hold"
    fake.script("k1", [pending("running")])
    plain = make_harness(tmp_path, fake)
    async with plain.client() as client:
        await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-k1", "provider_job_id": "k1"}
        )
    keyed = make_harness(tmp_path, fake, environ={"POLLWARDEN_AUDIT_KEY": key}, clock=plain.clock)
    async with keyed.client() as client:
        refused = [
            error_text(await client.call_tool(tool, args))
            for tool, args in (
                ("check_status", {"operation_id": "op-k1", "wait_seconds": 30}),
                ("start_operation", {"provider": "acme", "operation_id": "op-k2", "provider_job_id": "k2"}),
            )
        ]
    for text in refused:
        assert "the audit chain is not keyed (head seq 1) but POLLWARDEN_AUDIT_KEY is set" in text
        assert "pollwarden audit rekey" in text
    assert fake.status_requests("k1") == []
    h_db = plain.db_path
    assert [row.keyed for row in read_rows(h_db)] == [False]

    rekeyed = pollwarden_cli(
        "audit", "rekey", "--db", str(h_db), "--by", "ops-alice", env={"POLLWARDEN_AUDIT_KEY": key}
    )
    assert rekeyed.code == 0, rekeyed.stderr
    async with keyed.client() as client:
        polled = view(await client.call_tool("check_status", {"operation_id": "op-k1", "wait_seconds": 30}))
    assert polled["outcome"] == "polled"
    assert [row.kind for row in read_rows(h_db)] == ["tracking", "audit_rekey", "polled"]
    assert verify_chain(h_db, key.encode(), rekeyed_at=2).ok
    assert not verify_chain(h_db, key.encode()).ok


async def test_a_submission_the_provider_refused_is_told_with_its_answer_not_as_a_stop_before_polling(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_submit([http(400, body={"error": "bad"})])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        refused = view(
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "op-sub", "submit": {"report": "x"}}
            )
        )
    assert refused["stop_reason"] == "integration_failure"
    last = render_story(read_rows(h.db_path, "op-sub"))[-1]
    assert "submission answered 400: integration failure, escalated (HTTP 400 on submission" in last
    assert "before polling" not in last
