"""Provider truth: typed results, partial results and counts, a person who must act, expiry grace, rate limits.

The pure checks are tests/unit/test_provider_truth.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from mcp.client import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult

from harness import (
    Harness,
    SteppedRandom,
    acme_refusal,
    acme_table,
    base_table,
    check,
    make_harness,
    merge,
    track,
    view,
)
from pollwarden.core.clock import FakeClock
from pollwarden_providers import ProviderTable, TableError, load_table, shipped_tables_dir
from tests.support.fake_provider import FakeProvider, Step, http, pending, succeeded

# SQLite only: the subject is reading a provider's answers (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


T0 = 1_796_032_800.0  # 2026-11-30T10:00:00Z


def table_from(tmp_path: Path, overrides: dict[str, Any]) -> ProviderTable:
    return acme_table(tmp_path, overrides)


def refusal(tmp_path: Path, overrides: dict[str, Any]) -> TableError:
    return acme_refusal(tmp_path, overrides)


def test_a_result_field_without_a_declared_type_is_refused_naming_it(tmp_path: Path) -> None:
    error = refusal(tmp_path, {"fields": {"result_url": None}})

    assert error.key == "success.required_fields"
    assert "'result_url' has no declared type" in error.problem
    assert "[fields]" in error.fix


def test_a_declared_field_that_nothing_hands_over_is_refused_as_a_likely_typo(tmp_path: Path) -> None:
    error = refusal(tmp_path, {"fields": {"result_ur1": {"type": "url"}}})

    assert error.key == "fields.result_ur1"


async def test_a_success_whose_field_does_not_validate_is_an_integration_failure_naming_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    fake.script("j-bad", [succeeded(result_url="javascript:alert(document.cookie)")])
    async with h.client() as client:
        await track(client, "j-bad")
        done = await check(client, "j-bad", wait=30)

    assert done["stop_reason"] == "integration_failure"
    assert "result_url" in done["stop_detail"]
    assert "scheme http or https" in done["stop_detail"]
    assert done["result"] is None
    assert done["allowed_actions"] == []


def test_every_shipped_result_field_has_a_type_more_precise_than_any_unless_documented_free() -> None:
    for path in sorted(shipped_tables_dir().glob("*.toml")):
        table = load_table(path)
        loose = [name for name, spec in table.fields.items() if spec.type == "any"]
        # Replicate's output is the model's own shape: the only documented "any".
        assert loose == (["output"] if table.name == "replicate-predictions" else []), table.name


BATCH_LIKE: dict[str, Any] = {
    "states": {
        "pending": ["validating", "in_progress"],
        "succeeded": ["completed"],
        "failed": ["failed"],
        "cancelled": ["cancelled"],
        "expired": ["expired"],
    },
    "response": {"state_field": "status", "expires_at_field": None},
    "success": {"required_fields": ["output_file_id"], "failure_fields": ["error_file_id"]},
    "fields": {
        "result_url": None,
        "output_file_id": {"type": "string", "pattern": "file-[A-Za-z0-9]+"},
        "error_file_id": {"type": "string", "pattern": "file-[A-Za-z0-9]+"},
    },
    "results": {"expired": ["output_file_id", "error_file_id"], "cancelled": ["output_file_id"]},
    "counts": {
        "succeeded": "request_counts.completed",
        "errored": "request_counts.failed",
        "total": "request_counts.total",
    },
}


def batch(status: str, completed: int, failed: int, total: int, **files: Any) -> Step:
    counts = {"total": total, "completed": completed, "failed": failed}
    return Step(body={"status": status, "request_counts": counts, **files})


async def test_an_expired_batch_hands_over_its_finished_part_and_says_how_many_requests_finished(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=BATCH_LIKE)
    fake.script(
        "b1", [batch("in_progress", 10, 0, 100), batch("expired", 60, 2, 100, output_file_id="file-out1")]
    )
    async with h.client() as client:
        await track(client, "b1")
        first = await check(client, "b1", wait=30)
        done = await check(client, "b1", wait=30)
        fetched = view(await client.call_tool("fetch_result", {"operation_id": "op-b1"}))

    assert first["request_counts"] == {"succeeded": 10, "errored": 0, "total": 100}
    assert done["stop_reason"] == "expired"
    assert done["result"] is None
    assert done["partial_result"] == {"output_file_id": "file-out1"}
    assert done["request_counts"] == {"succeeded": 60, "errored": 2, "total": 100}
    assert done["allowed_actions"] == ["fetch_result"]
    assert "fetch_result" in done["message"]
    assert fetched["decision"] == "done"
    assert fetched["partial"] is True
    assert fetched["result"] == {"output_file_id": "file-out1"}
    assert fetched["message"].startswith("Not a success: the job ended expired.")


async def test_a_batch_in_which_every_request_failed_is_a_failure_with_its_error_file(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=merge(BATCH_LIKE, {"counts": None}))
    fake.script("b2", [batch("completed", 0, 100, 100, output_file_id=None, error_file_id="file-err2")])
    async with h.client() as client:
        await track(client, "b2")
        done = await check(client, "b2", wait=30)
        fetched = view(await client.call_tool("fetch_result", {"operation_id": "op-b2"}))

    assert done["stop_reason"] == "provider_failure"
    assert done["status"] == "failed"
    assert "every request failed" in done["stop_detail"]
    assert done["partial_result"] == {"error_file_id": "file-err2"}
    assert fetched["result"] == {"error_file_id": "file-err2"}
    assert fetched["partial"] is True


async def test_a_success_state_with_no_request_succeeded_is_decided_by_the_counts(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("b3", [batch("completed", 0, 0, 100, output_file_id="file-out3", cancelled=100)])
    table = merge(BATCH_LIKE, {"counts": {"cancelled": "cancelled"}})
    h = make_harness(tmp_path, fake, table=table)
    async with h.client() as client:
        await track(client, "b3")
        done = await check(client, "b3", wait=30)

    assert done["stop_reason"] == "cancelled"
    assert done["status"] == "cancelled"
    assert done["result"] is None
    assert done["partial_result"] == {"output_file_id": "file-out3"}
    assert done["request_counts"]["cancelled"] == 100


async def test_fetch_result_is_refused_after_an_end_state_that_kept_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=BATCH_LIKE)
    fake.script("b4", [batch("failed", 0, 0, 0)])
    async with h.client() as client:
        await track(client, "b4")
        done = await check(client, "b4", wait=30)
        fetched = view(await client.call_tool("fetch_result", {"operation_id": "op-b4"}))

    assert done["stop_reason"] == "provider_failure"
    assert done["allowed_actions"] == []
    assert fetched["decision"] == "refused"


class Person:
    """An elicitation callback that answers as told."""

    def __init__(self, action: str, content: dict[str, Any]) -> None:
        self.action = action
        self.content = content

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action=self.action, content=self.content)  # type: ignore[arg-type]


REVIEWED: dict[str, Any] = {
    "states": {"pending": ["queued", "running"], "awaiting_review": ["needs_approval"]},
    "awaiting_review": {"where": "https://console.acme.example/jobs/{job_id} (Approve)"},
    "cancel": {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"},
}


async def test_a_state_that_waits_for_a_person_stops_and_says_where_they_act(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=REVIEWED)
    fake.script("r1", [pending("running"), pending("needs_approval"), pending("running"), succeeded()])
    person = Person("accept", {"decision": "approve"})
    async with h.client(elicitation_callback=person) as client:
        await track(client, "r1", max_status_requests=4)
        await check(client, "r1", wait=30)
        stopped = await check(client, "r1", wait=30)
        again = await check(client, "r1")
        sent_while_stopped = len(fake.requests_for("r1"))
        extended = view(
            await client.call_tool(
                "request_extension",
                {
                    "operation_id": "op-r1",
                    "extra_seconds": 600,
                    "extra_status_requests": 2,
                    "reason": "the reviewer approved it",
                },
            )
        )
        resumed = await check(client, "r1", wait=30)

    assert stopped["stop_reason"] == "awaiting_review"
    assert stopped["status"] == "escalated"
    assert stopped["person_must_act_at"] == "https://console.acme.example/jobs/r1 (Approve)"
    assert stopped["allowed_actions"] == ["request_extension", "cancel_operation"]
    assert "A person must act at the provider: https://console.acme.example/jobs/r1" in stopped["message"]
    assert "Do not poll again" in stopped["message"]
    assert stopped["escalation"]["reason"] == "awaiting_review"
    assert "a person must act at the provider" in stopped["escalation"]["message"]
    assert [o["action"] for o in stopped["escalation"]["options"]][:2] == [
        "request_extension",
        "cancel_operation",
    ]
    assert again["outcome"] == "stopped"
    assert sent_while_stopped == 2  # nothing sent while a person had to act
    assert extended["decision"] == "approved"
    assert extended["operation"]["status_requests_used"] == 2  # the same job, the same counters
    assert resumed["status"] == "waiting"
    assert resumed["state"] == "running"


def test_a_person_state_without_where_they_act_is_refused(tmp_path: Path) -> None:
    error = refusal(tmp_path, merge(REVIEWED, {"awaiting_review": None}))

    assert error.key == "awaiting_review"
    assert "does not say where" in error.problem


def test_where_a_person_acts_may_name_only_job_id_parts(tmp_path: Path) -> None:
    error = refusal(tmp_path, {**REVIEWED, "awaiting_review": {"where": "https://x.example/{token}"}})

    assert "{token}" in error.problem


EXPIRING: dict[str, Any] = {"expiry": {"grace_seconds": 600, "states_after_expiry": ["queued"]}}


def test_states_after_expiry_must_be_pending_states(tmp_path: Path) -> None:
    error = refusal(tmp_path, {"expiry": {"states_after_expiry": ["succeeded"]}})

    assert error.key == "expiry.states_after_expiry"


def test_the_default_deadline_must_cover_the_documented_window_and_grace(tmp_path: Path) -> None:
    error = refusal(tmp_path, {"expiry": {"window_seconds": 2400, "grace_seconds": 600}})

    assert error.key == "expiry.window_seconds"
    assert "at least 3000" in error.fix


async def test_a_job_seen_just_past_its_expiry_is_waited_on_until_the_grace_ends(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=EXPIRING, clock=FakeClock(T0))
    past = "2026-11-30T09:59:00Z"  # a minute before the operation starts
    fake.script(
        "e1",
        [pending("running", expires_at=past)] * 5 + [pending("queued", expires_at="2026-11-30T09:00:00Z")],
    )
    async with h.client() as client:
        await track(client, "e1")
        within = await check(client, "e1", wait=30)
        h.clock.advance(700)
        beyond = await check(client, "e1", wait=30)
    (tmp_path / "b").mkdir()
    h2 = make_harness(tmp_path / "b", fake, table=EXPIRING, clock=FakeClock(T0))
    fake.script("e2", [pending("queued", expires_at="2026-11-30T08:00:00Z")])
    async with h2.client() as client:
        await track(client, "e2")
        documented = await check(client, "e2", wait=30)

    assert within["status"] == "waiting"
    assert beyond["stop_reason"] == "integration_failure"
    assert "600 s grace" in beyond["stop_detail"]
    assert documented["status"] == "waiting"


SECONDARY: dict[str, Any] = {
    "rate_limit": {
        "remaining_header": "x-ratelimit-remaining",
        "reset_header": "x-ratelimit-reset",
        "body_field": "message",
        "body_contains": ["secondary rate limit"],
        "min_wait_seconds": 60,
    }
}


async def test_a_403_whose_message_names_a_secondary_limit_waits_at_least_a_minute(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=SECONDARY, clock=FakeClock(T0))
    message = {"message": "You have exceeded a secondary rate limit. Please wait a few minutes."}
    reset = str(int(T0) + 3000)
    fake.script(
        "s1",
        [
            http(403, {"x-ratelimit-remaining": "4000", "x-ratelimit-reset": reset}, message),
            http(
                403, {"x-ratelimit-remaining": "4000"}, {"message": "Resource not accessible by integration"}
            ),
        ],
    )
    async with h.client() as client:
        await track(client, "s1")
        limited = await check(client, "s1", wait=30)
        h.clock.advance(limited["retry_after_seconds"])
        refused = await check(client, "s1")

    assert limited["status"] == "waiting"
    assert limited["rate_limited_used"] == 1
    assert limited["retry_after_seconds"] == pytest.approx(60)
    assert limited["delay_source"] == "provider_retry_after"
    assert refused["stop_reason"] == "authorization_denied"


def test_body_phrases_need_the_field_they_are_read_from(tmp_path: Path) -> None:
    error = refusal(tmp_path, {"rate_limit": {"body_contains": ["secondary rate limit"]}})

    assert error.key == "rate_limit.body_field"


async def test_replicate_is_not_escalated_within_a_minute_of_429s_without_retry_after(
    tmp_path: Path, fake: FakeProvider
) -> None:
    shipped = tomllib.loads((shipped_tables_dir() / "replicate-predictions.toml").read_text())
    table = merge(
        base_table(fake.base_url),
        {
            "rate_limit": shipped["rate_limit"],
            "limits": shipped["limits"],
            "schedule": shipped["schedule"],
        },
    )
    h = Harness(tmp=tmp_path, fake=fake, clock=FakeClock(T0), rng=SteppedRandom(0.0), table=table)
    throttled = http(429, {}, {"detail": "Request was throttled. Your rate limit resets in ~30s."})
    fake.script("p1", [throttled])
    async with h.client() as client:
        started = await track(client, "p1")
        last: dict[str, Any] = started
        while last["status"] == "waiting":
            h.clock.advance(last["retry_after_seconds"] or 0)
            last = await check(client, "p1")

    assert last["stop_reason"] == "rate_limited"
    assert h.clock.now() - T0 >= 120
    assert len(fake.requests_for("p1")) == shipped["limits"]["max_rate_limited"]


def test_the_github_pace_stays_under_what_a_github_token_may_spend_in_an_hour() -> None:
    table = load_table(shipped_tables_dir() / "github-actions-runs.toml")
    fleet = table.fleet
    assert fleet is not None

    assert fleet.max_requests_per_second * 3600 + fleet.burst <= 1000
    assert table.limits.default_deadline_seconds > 6 * 3600  # a run is not one 6-hour job
    assert table.limits.max_deadline_seconds == 35 * 86400  # the documented run limit
