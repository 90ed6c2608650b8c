"""An approved extension, in exact numbers: a new authorization that never undercuts the provider's pace.

New deadline = max(old deadline, approval time) + extra; budget = old + extra;
counters kept; the next request no earlier than a Retry-After still in force,
nor earlier than the table's base delay after the last request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.client import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult

from harness import base_table, full_delays, make_harness, merge, operation_record, view
from pollwarden.config import ExtensionCaps
from pollwarden.core.timefmt import iso
from pollwarden.rules.extensions import extension_changes, plan_extension
from pollwarden_providers.table import ProviderTable
from tests.support.fake_provider import FakeProvider, http, pending

# SQLite only: the subject is the extension's arithmetic (tests/conftest.py).
pytestmark = pytest.mark.one_engine

TABLE = ProviderTable.model_validate(merge(base_table("http://127.0.0.1:9"), {}))  # base delay 5 s


def _approved(record: Any, *, now: float, seconds: float = 900, requests: int = 4) -> dict[str, object]:
    plan = plan_extension(
        record, TABLE, ExtensionCaps(), extra_seconds=seconds, extra_status_requests=requests, reason="r"
    )
    assert plan.allowed, plan.refusal
    return extension_changes(record, TABLE, plan, now=now)


def test_an_extension_approved_before_the_deadline_adds_to_the_old_deadline_and_budget() -> None:
    record = operation_record(
        status="escalated", stop_reason="request_budget_exhausted", last_http_at=1500.0, stopped_at=1500.0
    )
    changes = _approved(record, now=1600.0)
    assert changes["deadline_at"] == 3400.0 + 900
    assert changes["max_status_requests"] == 12 + 4
    assert changes["next_check_at"] == 1600.0  # the base delay after the last request (1505) has passed
    assert changes["delay_source"] == "manual_extension"
    for counter in (
        "status_requests_used",
        "transport_failures_used",
        "rate_limited_used",
        "polls_completed",
    ):
        assert counter not in changes


def test_an_extension_approved_after_the_deadline_counts_from_the_approval() -> None:
    record = operation_record(
        status="escalated", stop_reason="deadline_exceeded", status_requests_used=7, stopped_at=3400.0
    )
    changes = _approved(record, now=3500.0, seconds=600, requests=2)
    assert changes["deadline_at"] == 3500.0 + 600
    assert changes["max_status_requests"] == 14


def test_an_extension_approved_right_after_the_last_answer_waits_the_tables_base_delay() -> None:
    record = operation_record(status="escalated", stop_reason="request_budget_exhausted", last_http_at=1500.0)
    changes = _approved(record, now=1501.0)
    assert changes["next_check_at"] == 1505.0
    assert changes["delay_source"] == "manual_extension"


def test_an_extension_never_undercuts_a_retry_after_still_in_force() -> None:
    record = operation_record(
        status="escalated",
        stop_reason="delivery_ambiguous",
        last_http_status=503,
        last_http_at=1500.0,
        retry_after_seconds=60.0,
        not_before_at=1560.0,  # the earliest allowed request the 503's answer recorded
        transport_failures_used=3,
    )
    changes = _approved(record, now=1510.0)
    assert changes["next_check_at"] == 1560.0
    assert changes["delay_source"] == "provider_retry_after"
    assert changes["max_transport_failures"] == 3 + 3
    # Once the Retry-After has run out, the approval time decides again.
    later = _approved(record, now=1600.0)
    assert (later["next_check_at"], later["delay_source"]) == (1600.0, "manual_extension")


def test_an_unknown_state_pause_is_never_shorter_than_a_retry_after() -> None:
    record = operation_record(
        status="escalated",
        stop_reason="unknown_state",
        last_http_at=1500.0,
        retry_after_seconds=300.0,
        not_before_at=1800.0,
    )
    changes = _approved(record, now=1500.0, seconds=60, requests=1)
    assert changes["next_check_at"] == 1800.0
    assert changes["delay_source"] == "provider_retry_after"


class Approver:
    """A person who approves every question."""

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="accept", content={"decision": "approve"})


@pytest.mark.anyio
@pytest.mark.parametrize(
    "era", [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]
)
async def test_after_a_503_with_retry_after_6_an_approved_extension_sends_the_next_request_6_s_after_the_answer(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    h = make_harness(tmp_path, fake, rng=full_delays())  # the polls at t0+5 and t0+15 exactly
    t0 = h.clock.now()
    fake.script("ra6", [pending("running"), http(503, {"Retry-After": "6"}), pending("running")])
    async with h.client(elicitation_callback=Approver(), **era) as client:
        args = {
            "provider": "acme",
            "operation_id": "op-ra6",
            "provider_job_id": "ra6",
            "max_status_requests": 2,
        }
        view(await client.call_tool("start_operation", args))
        view(await client.call_tool("check_status", {"operation_id": "op-ra6", "wait_seconds": 30}))  # t0+5
        stopped = view(await client.call_tool("check_status", {"operation_id": "op-ra6", "wait_seconds": 30}))
        assert (stopped["stop_reason"], stopped["last_http_status"]) == ("request_budget_exhausted", 503)
        assert h.clock.now() == t0 + 15  # 5 s, then 10 s (the draws chosen at their maximum)
        h.clock.advance(0.06)
        extension = {
            "operation_id": "op-ra6",
            "extra_seconds": 900,
            "extra_status_requests": 4,
            "reason": "r",
        }
        approved = view(await client.call_tool("request_extension", extension))
        op = approved["operation"]
        assert approved["decision"] == "approved"
        assert op["deadline_at"] == iso(t0 + 2400 + 900)
        assert (op["max_status_requests"], op["status_requests_used"], op["transport_failures_used"]) == (
            6,
            2,
            1,
        )
        assert op["next_check_at"] == iso(t0 + 15 + 6)
        assert op["delay_source"] == "provider_retry_after"
        early = view(await client.call_tool("check_status", {"operation_id": "op-ra6"}))
        assert early["outcome"] == "not_yet"
        assert early["retry_after_seconds"] == pytest.approx(5.94)
        assert len(fake.status_requests("ra6")) == 2
        polled = view(await client.call_tool("check_status", {"operation_id": "op-ra6", "wait_seconds": 30}))
        assert polled["outcome"] == "polled"
        assert h.clock.now() == t0 + 21
    assert len(fake.status_requests("ra6")) == 3
