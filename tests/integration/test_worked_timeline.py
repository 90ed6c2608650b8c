"""The source document's worked example, end to end through the controller on the fake clock, line for line.

Submitted 10:20:00 with a deadline of 11:00:00 and a budget of 12; polled
10:20:05, 10:20:14 and 10:20:31 (a 503 with Retry-After: 120), 10:22:31,
10:23:48 … until the twelfth request at 10:58:00 uses the budget and the
operation escalates with the source document's block. The jitter draws are
chosen so that the delays are the document's: 5, 9, 17 s, then the provider's
120 s, then 77 s and on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import SteppedRandom, make_harness, view
from pollwarden.audit.chain import read_rows
from pollwarden.audit.story import render_story
from tests.support.fake_provider import FakeProvider, http, pending

# SQLite only: the subject is the worked example's times (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

OPERATION = "report-export-2025-04-18-01"
# uniform(0.5·raw, raw) = raw·(0.5 + 0.5·draw): the first check (raw 5; drawn when the operation is
# recorded and again when the provider accepted it), then after each poll.
DRAWS = (1.0, 1.0, 0.8, 0.7, 0.5, 0.925, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.64)
TABLE = {
    "schedule": {"base_delay_seconds": 5, "max_delay_seconds": 600},
    "cancel": {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"},
}
# When each status request goes out (seconds after 10:20:00): 5, +9, +17, +120 (Retry-After), +77, +120, +240,
# +300 four times, +492.
POLL_TIMES = (5, 14, 31, 151, 228, 348, 588, 888, 1188, 1488, 1788, 2280)


async def test_the_source_documents_timeline_is_reproduced_line_for_line(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_submit([http(202, body={"id": "exp_71c"})])
    fake.script(
        "exp_71c",
        [
            pending("queued"),
            pending("running"),
            http(503, headers={"Retry-After": "120"}),
            pending("running"),
        ],
    )
    h = make_harness(tmp_path, fake, table=TABLE, rng=SteppedRandom(*DRAWS))
    t0 = h.clock.now()  # 2025-04-18T10:20:00Z
    told: list[dict[str, Any]] = []
    async with h.client() as client:
        started = view(
            await client.call_tool(
                "start_operation",
                {"provider": "acme", "operation_id": OPERATION, "submit": {"report": "daily-export"}},
            )
        )
        assert (started["provider_job_id"], started["deadline_at"]) == ("exp_71c", "2025-04-18T11:00:00.000Z")
        assert (started["max_status_requests"], started["next_check_at"]) == (12, "2025-04-18T10:20:05.000Z")
        for at in POLL_TIMES:
            # The agent comes back a second early and lets the server wait for the allowed time.
            h.clock.t = t0 + at - 1
            v = view(await client.call_tool("check_status", {"operation_id": OPERATION, "wait_seconds": 30}))
            assert v["outcome"] == "polled"
            assert h.clock.now() == pytest.approx(t0 + at)
            told.append(v)
        after = view(await client.call_tool("check_status", {"operation_id": OPERATION, "wait_seconds": 30}))
    sent = [e for e in fake.log() if e["route"] == "status"]
    assert len(sent) == 12

    story = render_story(read_rows(h.db_path, OPERATION))
    assert story == [
        "10:20:00 recorded the submission before sending it, deadline 11:00:00, budget 12",
        "10:20:00 sending the submission (with the recorded idempotency key)",
        "10:20:00 submitted job exp_71c, deadline 11:00:00, budget 12",
        "10:20:05 polled, state queued, next poll 10:20:14 from local backoff",
        "10:20:14 polled, state running, next poll 10:20:31 from local backoff",
        "10:20:31 received 503, Retry-After 120, next poll 10:22:31 from provider guidance",
        "10:22:31 polled, state running, next poll 10:23:48 from local backoff",
        "10:23:48 polled, state running, next poll 10:25:48 from local backoff",
        "10:25:48 polled, state running, next poll 10:29:48 from local backoff",
        "10:29:48 polled, state running, next poll 10:34:48 from local backoff",
        "10:34:48 polled, state running, next poll 10:39:48 from local backoff",
        "10:39:48 polled, state running, next poll 10:44:48 from local backoff",
        "10:44:48 polled, state running, next poll 10:49:48 from local backoff",
        "10:49:48 polled, state running, next poll 10:58:00 from local backoff",
        "10:58:00 polled, state running, request budget exhausted, escalated",
        "10:58:00 refused 1 check after it stopped (stopped)",
    ]

    # After every poll but the last the agent is told when it may ask again, and why then.
    for v, polled_at, next_at in zip(told[:-1], POLL_TIMES[:-1], POLL_TIMES[1:], strict=True):
        assert v["status"] == "waiting"
        assert v["retry_after_seconds"] == pytest.approx(next_at - polled_at)
        assert v["message"].startswith("One status request was sent; the job is not finished.")
    assert [v["delay_source"] for v in told[:-1]] == ["local_backoff"] * 2 + ["provider_retry_after"] + [
        "local_backoff"
    ] * 8
    stop = told[-1]
    assert (stop["status"], stop["stop_reason"]) == ("escalated", "request_budget_exhausted")
    assert stop["status_requests_used"] == stop["max_status_requests"] == 12
    assert stop["message"] == (
        "Waiting stopped: request_budget_exhausted. Do not poll again; a person decides. "
        "See escalation.options for what may be done."
    )
    assert stop["allowed_actions"] == ["request_extension", "cancel_operation"]
    assert stop["escalation"]["message"].splitlines() == [
        "External job needs a decision",
        f"Operation: {OPERATION}",
        "Provider job: exp_71c",
        "Last state: running",
        "Elapsed time: 38 minutes",  # the document says 40: 10:20:00 to 10:58:00 is 38
        "Status requests: 12 of 12",
        "Last HTTP result: 200 at 10:58 UTC",
        "Stopped because: request_budget_exhausted",
        "Detail: all 12 status requests are used and the job is not finished",
        "Safe options: extend waiting once (15 more minutes with 4 more checks), cancel at provider, "
        "inspect provider console",
    ]
    assert [(o["action"], o["arguments"]) for o in stop["escalation"]["options"]] == [
        (
            "request_extension",
            {"operation_id": OPERATION, "extra_seconds": 900.0, "extra_status_requests": 4},
        ),
        ("cancel_operation", {"operation_id": OPERATION}),
        ("inspect_provider_console", {}),
    ]
    # Asking again is refused without a request: still the same decision, the same options.
    assert (after["outcome"], after["message"]) == ("stopped", stop["message"])
    assert after["escalation"] == stop["escalation"]
