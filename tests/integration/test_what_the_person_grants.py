"""After the business deadline there is a way forward, and a person is told what they grant (issue 30, 5 and 6).

Once the business deadline has passed, more waiting alone cannot meet it: the
escalation offers exactly what works — a person sets a new business deadline
through the same approval flow — and the call made as offered is accepted.
The question shows the true resulting deadline and every limit an approval
changes, and the audit row keeps the same lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.client import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult

from harness import check, make_harness, track, view
from pollwarden.audit.chain import read_rows
from pollwarden.core.timefmt import iso, parse_iso
from tests.support.fake_provider import FakeProvider, http, pending

# SQLite only: the subject is what a person is told (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


class Person:
    """An elicitation callback that approves and remembers each question."""

    def __init__(self) -> None:
        self.questions: list[str] = []

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        self.questions.append(params.message)
        return ElicitResult(action="accept", content={"decision": "approve"})


def approved_payloads(db: Any) -> list[dict[str, Any]]:
    """The payloads of the audit rows that recorded an approved extension."""
    return [row.payload_obj for row in read_rows(db) if row.kind == "extension_approved"]


async def stopped_after_the_business_deadline(client: Any, h: Any, job: str) -> dict[str, Any]:
    """Track `job` with a business deadline 20 s away and check until waiting stops."""
    await track(client, job, business_deadline_at=iso(h.clock.now() + 20))
    last: dict[str, Any] = {}
    for _ in range(4):
        last = await check(client, job, wait=30)
        if last["status"] != "waiting":
            break
    return last


def extension_option(v: dict[str, Any]) -> dict[str, Any]:
    [option] = [o for o in v["escalation"]["options"] if o["action"] == "request_extension"]
    return option


async def test_after_the_business_deadline_the_offered_new_business_deadline_is_accepted_and_waiting_resumes(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("late", [pending("running")])
    h = make_harness(tmp_path, fake)
    person = Person()
    async with h.client(elicitation_callback=person) as client:
        stopped = await stopped_after_the_business_deadline(client, h, "late")
        assert (stopped["stop_reason"], stopped["status"]) == ("deadline_exceeded", "escalated")
        assert "request_extension" in stopped["allowed_actions"]
        option = extension_option(stopped)
        assert "set a new business deadline" in option["label"]
        new_business = option["arguments"]["new_business_deadline_at"]
        assert parse_iso(new_business) > h.clock.now()
        extended = view(
            await client.call_tool("request_extension", {**option["arguments"], "reason": "still worth it"})
        )
        assert extended["decision"] == "approved", extended["message"]
        assert extended["operation"]["business_deadline_at"] == new_business
        resumed = await check(client, "late", wait=30)
    assert resumed["outcome"] == "polled"
    [question] = person.questions
    assert f"Resulting business deadline: {new_business} (was " in question
    [payload] = approved_payloads(h.db_path)
    assert payload["new_business_deadline_at"] == pytest.approx(parse_iso(new_business))
    assert any(line.startswith("Resulting business deadline:") for line in payload["grants"])


async def test_more_waiting_alone_after_the_business_deadline_is_refused_naming_the_way_forward(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("late2", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=Person()) as client:
        await stopped_after_the_business_deadline(client, h, "late2")
        refused = view(
            await client.call_tool(
                "request_extension",
                {
                    "operation_id": "op-late2",
                    "extra_seconds": 900,
                    "extra_status_requests": 4,
                    "reason": "more",
                },
            )
        )
    assert refused["decision"] == "refused"
    assert "new_business_deadline_at" in refused["message"]


async def test_the_question_shows_the_true_resulting_deadline_when_the_budget_ran_out_before_the_deadline(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("early", [pending("running")])
    h = make_harness(tmp_path, fake)
    person = Person()
    async with h.client(elicitation_callback=person) as client:
        started = await track(client, "early", max_status_requests=1, deadline_seconds=1800)
        stopped = await check(client, "early", wait=30)
        assert stopped["stop_reason"] == "request_budget_exhausted"
        extended = view(
            await client.call_tool(
                "request_extension",
                {"operation_id": "op-early", "extra_seconds": 900, "extra_status_requests": 4, "reason": "x"},
            )
        )
    deadline = parse_iso(started["deadline_at"])
    assert parse_iso(extended["operation"]["deadline_at"]) == pytest.approx(deadline + 900)
    [question] = person.questions
    # Asked ~30 minutes before the deadline: the result is 45 minutes after approval, not "15 minutes after".
    hhmm = iso(deadline + 900)[11:16]
    assert f"Resulting deadline: {hhmm} UTC (15 minutes after the current deadline" in question
    assert "Resulting deadline: 15 minutes after approval" not in question


@pytest.mark.parametrize(
    ("script", "reason", "line"),
    [
        (
            [http(503)] * 3,
            "delivery_ambiguous",
            "Resulting transport failures allowed: 6 (3 of 3 used; 3 more)",
        ),
        (
            [http(429, headers={"Retry-After": "1"})] * 3,
            "rate_limited",
            "Resulting rate-limited answers allowed: 6 (3 of 3 used; 3 more)",
        ),
    ],
)
async def test_the_question_and_the_audit_name_the_failure_allowance_an_approval_adds(
    tmp_path: Path, fake: FakeProvider, script: list[Any], reason: str, line: str
) -> None:
    fake.script("allow", script)
    h = make_harness(tmp_path, fake)
    person = Person()
    async with h.client(elicitation_callback=person) as client:
        await track(client, "allow")
        stopped: dict[str, Any] = {}
        for _ in range(3):
            stopped = await check(client, "allow", wait=30)
        assert stopped["stop_reason"] == reason
        approved = view(
            await client.call_tool(
                "request_extension",
                {"operation_id": "op-allow", "extra_seconds": 900, "extra_status_requests": 4, "reason": "x"},
            )
        )
    assert approved["decision"] == "approved"
    [question] = person.questions
    assert line in question
    [payload] = approved_payloads(h.db_path)
    assert any(g.startswith(line) for g in payload["grants"])
