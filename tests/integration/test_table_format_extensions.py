"""The table format beyond one state field: refined states, multi-part job ids, fixed headers, Unix times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import acme_refusal, acme_table, check, make_harness, track, view
from pollwarden.core.timefmt import iso
from pollwarden.provider_io.table_check import preview_answer
from pollwarden.rules.status_answer import ProviderAnswer
from pollwarden_providers import ProviderTable, TableError
from pollwarden_providers.interpret import read_status_body
from pollwarden_providers.request_building import job_id_from_location, split_job_id, status_url
from tests.support.fake_provider import FakeProvider, Step, pending

# SQLite only: the subject is the table format (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

T0 = 1_796_032_800.0  # 2026-11-30T10:00:00Z

GITHUB_LIKE: dict[str, Any] = {
    "status_path": "/v1/jobs/{owner}/{repo}/{run_id}",
    "job_id_parts": ["owner", "repo", "run_id"],
    "submit": None,
    "cancel": {"path": "/v1/jobs/{owner}/{repo}/{run_id}/cancel", "method": "POST"},
    "headers": {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"},
    "response": {
        "state_field": "status",
        "expires_at_field": None,
        "poll_after_field": None,
        "next_check_at_field": None,
        "job_id_field": "id",
    },
    "states": {"pending": ["queued", "in_progress"], "succeeded": [], "failed": [], "cancelled": []},
    "refine": {
        "completed": {
            "field": "conclusion",
            "succeeded": ["success"],
            "failed": ["failure", "timed_out"],
            "cancelled": ["cancelled"],
        }
    },
    "success": {"required_fields": ["artifacts_url"]},
    "fields": {"result_url": None, "artifacts_url": {"type": "url"}},
}


def table_from(tmp_path: Path, overrides: dict[str, Any]) -> ProviderTable:
    return acme_table(tmp_path, overrides)


def refusal(tmp_path: Path, overrides: dict[str, Any]) -> TableError:
    return acme_refusal(tmp_path, overrides)


def read(table: ProviderTable, body: dict[str, Any]) -> tuple[str | None, str, str | None]:
    status = read_status_body(table, body, now=T0, max_hint_seconds=86400)
    return status.state, status.category, status.unknown_because


# Refined states


def test_a_state_refined_by_a_second_field_is_reported_as_state_slash_value(tmp_path: Path) -> None:
    table = table_from(tmp_path, GITHUB_LIKE)

    assert read(table, {"status": "completed", "conclusion": "success"})[:2] == (
        "completed/success",
        "succeeded",
    )
    assert read(table, {"status": "completed", "conclusion": "timed_out"})[:2] == (
        "completed/timed_out",
        "failed",
    )
    assert read(table, {"status": "completed", "conclusion": "cancelled"})[:2] == (
        "completed/cancelled",
        "cancelled",
    )
    assert read(table, {"status": "in_progress", "conclusion": None})[:2] == ("in_progress", "pending")


def test_a_refined_state_with_an_unlisted_or_missing_value_is_unknown_and_says_why(tmp_path: Path) -> None:
    table = table_from(tmp_path, GITHUB_LIKE)

    state, category, because = read(table, {"status": "completed", "conclusion": "rerequested"})
    assert (state, category) == ("completed/rerequested", "unknown")
    assert because == "conclusion 'rerequested' is not listed under [refine.completed]"

    state, category, because = read(table, {"status": "completed"})
    assert (state, category) == ("completed/null", "unknown")
    assert because == "'conclusion' is missing under [refine.completed]"


def test_the_refining_field_is_compared_exactly(tmp_path: Path) -> None:
    table = table_from(tmp_path, GITHUB_LIKE)

    assert read(table, {"status": "completed", "conclusion": "Success"})[1] == "unknown"
    assert read(table, {"status": "completed", "conclusion": ["success"]})[1] == "unknown"


def test_a_table_whose_only_success_is_refined_loads_and_lists_it(tmp_path: Path) -> None:
    table = table_from(tmp_path, GITHUB_LIKE)

    assert table.states_of("succeeded") == ("completed/success",)
    assert table.states_of("pending") == ("queued", "in_progress")
    assert "completed/failure" in table.documented_states()


def test_a_refined_state_also_listed_under_states_is_refused_at_its_refine_key(tmp_path: Path) -> None:
    error = refusal(tmp_path, {**GITHUB_LIKE, "states": {"pending": ["queued"], "succeeded": ["completed"]}})

    assert error.key == "refine.completed"
    assert "states.succeeded" in error.problem
    assert "remove it from states.succeeded" in error.fix


def test_a_refine_section_that_lists_nothing_is_refused(tmp_path: Path) -> None:
    error = refusal(tmp_path, {"refine": {"done": {"field": "outcome"}}})

    assert error.key.startswith("refine.done")
    assert "no value of 'outcome' is listed" in error.problem


def test_a_value_listed_under_two_categories_of_a_refinement_is_refused(tmp_path: Path) -> None:
    refine = {"done": {"field": "outcome", "succeeded": ["ok"], "failed": ["ok"]}}

    error = refusal(tmp_path, {"refine": refine})

    assert error.key == "refine.done.succeeded"


def test_a_table_with_no_success_anywhere_is_still_refused(tmp_path: Path) -> None:
    refine = {"done": {"field": "outcome", "failed": ["bad"]}}

    error = refusal(tmp_path, {"states": {"succeeded": []}, "refine": refine})

    assert error.key == "states.succeeded"


# Multi-part job ids


def test_a_multi_part_job_id_fills_each_placeholder_as_one_encoded_segment(tmp_path: Path) -> None:
    table = table_from(tmp_path, GITHUB_LIKE)

    assert status_url(table, "octo-org/hello world/42") == (
        "https://api.acme.example/v1/jobs/octo-org/hello%20world/42"
    )
    assert split_job_id(table, "octo-org/hello/42") == {"owner": "octo-org", "repo": "hello", "run_id": "42"}


@pytest.mark.parametrize(
    ("job_id", "why"),
    [
        ("hello/42", "it has 2 part(s); write it as owner/repo/run_id"),
        ("a/b/c/42", "it has 4 part(s); write it as owner/repo/run_id"),
        ("octo/../42", "its repo part is refused"),
        ("octo//42", "its repo part is refused: it is empty"),
    ],
)
def test_a_multi_part_job_id_of_the_wrong_shape_is_refused_naming_the_form(
    tmp_path: Path, job_id: str, why: str
) -> None:
    table = table_from(tmp_path, GITHUB_LIKE)

    problem = split_job_id(table, job_id)

    assert isinstance(problem, str)
    assert problem.startswith(why)


def test_a_one_part_job_id_keeps_a_slash_inside_its_one_segment(tmp_path: Path) -> None:
    table = table_from(tmp_path, {})

    assert status_url(table, "a/b") == "https://api.acme.example/v1/jobs/a%2Fb"


def test_a_status_path_missing_a_declared_part_is_refused(tmp_path: Path) -> None:
    error = refusal(tmp_path, {**GITHUB_LIKE, "status_path": "/v1/jobs/{owner}/{run_id}"})

    assert error.key == "status_path"
    assert "does not contain {repo}" in error.problem


def test_a_cancel_path_with_an_undeclared_placeholder_is_refused(tmp_path: Path) -> None:
    cancel = {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"}

    error = refusal(tmp_path, {**GITHUB_LIKE, "cancel": cancel})

    assert error.key == "cancel.path"
    assert "{job_id}" in error.problem


def test_a_multi_part_id_cannot_come_from_one_submit_reply_field(tmp_path: Path) -> None:
    submit = {"path": "/v1/jobs", "method": "POST", "job_id_field": "id"}

    error = refusal(tmp_path, {**GITHUB_LIKE, "submit": submit})

    assert error.key == "submit.job_id_field"


def test_a_location_header_yields_a_multi_part_job_id(tmp_path: Path) -> None:
    table = table_from(tmp_path, GITHUB_LIKE)
    origin = "https://api.acme.example"

    assert job_id_from_location(table, f"{origin}/v1/jobs/octo/hello%20world/42") == "octo/hello world/42"
    assert job_id_from_location(table, f"{origin}/v1/jobs/octo/a%2Fb/42") is None
    assert job_id_from_location(table, f"{origin}/v1/jobs/octo/42") is None


# Fixed headers


@pytest.mark.parametrize(
    "name", ["Host", "content-length", "Accept-Encoding", "Cookie", "Proxy-Authorization"]
)
def test_a_header_pollwarden_owns_is_refused_in_headers(tmp_path: Path, name: str) -> None:
    error = refusal(tmp_path, {"headers": {name: "x"}})

    assert error.key == "headers"
    assert name in error.problem


def test_a_fixed_header_that_would_carry_the_credential_is_refused(tmp_path: Path) -> None:
    auth = {"env": "ACME_TOKEN", "header": "x-api-key"}

    error = refusal(tmp_path, {"auth": auth, "headers": {"X-Api-Key": "pasted-secret"}})

    assert error.key == "headers.X-Api-Key"
    assert "environment variable" in error.fix
    assert "pasted-secret" not in str(error)


def test_a_credential_in_fixed_headers_is_refused_without_echoing_it(tmp_path: Path) -> None:
    error = refusal(tmp_path, {"headers": {"Authorization": "Bearer sk-live-123456"}})

    assert error.key == "headers"
    assert "[auth]" in error.fix
    assert "sk-live-123456" not in str(error)
    assert "sk-live-123456" not in repr(error.__cause__)


def test_a_fixed_header_value_with_a_line_break_is_refused(tmp_path: Path) -> None:
    error = refusal(tmp_path, {"headers": {"anthropic-version": "2023-06-01\r\nX-Evil: 1"}})

    assert error.key == "headers"
    assert "control characters" in error.problem


# Unix-second times and structured results


def test_unix_second_expiry_is_read_when_the_table_says_so(tmp_path: Path) -> None:
    table = table_from(tmp_path, {"response": {"time_format": "unix_seconds"}})

    status = read_status_body(
        table, {"state": "running", "expires_at": 1_796_119_200}, now=T0, max_hint_seconds=86400
    )

    assert status.expires_at == 1_796_119_200.0
    assert status.expires_at_rejected is None


@pytest.mark.parametrize("value", [1_796_119_200_000, "1796119200", True, -5])
def test_a_unix_expiry_that_is_not_plausible_seconds_is_ignored_and_noted(
    tmp_path: Path, value: object
) -> None:
    table = table_from(tmp_path, {"response": {"time_format": "unix_seconds"}})

    status = read_status_body(
        table, {"state": "running", "expires_at": value}, now=T0, max_hint_seconds=86400
    )

    assert status.expires_at is None
    assert status.expires_at_rejected == f"expires_at={value!s} is not Unix seconds".replace("True", "true")


def test_rfc3339_remains_the_default_time_format(tmp_path: Path) -> None:
    table = table_from(tmp_path, {})

    status = read_status_body(
        table, {"state": "running", "expires_at": 1_796_119_200}, now=T0, max_hint_seconds=86400
    )

    assert status.expires_at is None
    assert status.expires_at_rejected is not None


def test_a_required_result_that_is_a_list_keeps_its_shape(tmp_path: Path) -> None:
    table = table_from(
        tmp_path,
        {
            "success": {"required_fields": ["output"]},
            "fields": {"result_url": None, "output": {"type": "list"}},
        },
    )
    urls = ["https://files.example/a.png", "https://files.example/b.png"]

    status = read_status_body(table, {"state": "succeeded", "output": urls}, now=T0, max_hint_seconds=86400)

    assert status.result == {"output": urls}
    assert status.missing_fields == ()


def test_an_empty_or_oversized_structured_result_is_missing_or_truncated(tmp_path: Path) -> None:
    table = table_from(
        tmp_path,
        {
            "success": {"required_fields": ["output"]},
            "fields": {"result_url": None, "output": {"type": "list"}},
        },
    )

    empty = read_status_body(table, {"state": "succeeded", "output": []}, now=T0, max_hint_seconds=86400)
    huge = read_status_body(
        table, {"state": "succeeded", "output": ["x" * 5000]}, now=T0, max_hint_seconds=86400
    )

    assert empty.missing_fields == ("output",)
    assert isinstance(huge.result["output"], str)
    assert len(huge.result["output"]) == 2000


# End to end: the SDK client, the fake provider, a GitHub-shaped table


def run(status: str, conclusion: str | None = None, *, run_id: int = 42, **extra: Any) -> Step:
    return Step(body={"id": run_id, "status": status, "conclusion": conclusion, **extra})


async def test_a_github_shaped_table_drives_a_run_to_success_with_its_fixed_headers(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script(
        "octo/hello/42",
        [run("queued"), run("in_progress"), run("completed", "success", artifacts_url="https://x.example/a")],
    )
    h = make_harness(tmp_path, fake, table=GITHUB_LIKE)
    async with h.client() as client:
        started = await track(client, "octo/hello/42")
        first = await check(client, "octo/hello/42", wait=30)
        second = await check(client, "octo/hello/42", wait=30)
        third = await check(client, "octo/hello/42", wait=30)
        result = view(await client.call_tool("fetch_result", {"operation_id": "op-octo/hello/42"}))

    assert started["provider_job_id"] == "octo/hello/42"
    assert (first["state"], second["state"]) == ("queued", "in_progress")
    assert (third["state"], third["stop_reason"]) == ("completed/success", "succeeded")
    assert result["result"] == {"artifacts_url": "https://x.example/a"}
    sent = fake.requests_for("octo/hello/42")
    assert [entry["raw_path"] for entry in sent] == ["/v1/jobs/octo/hello/42"] * 3
    assert all(entry["headers"]["accept"] == "application/vnd.github+json" for entry in sent)
    assert all(entry["headers"]["x-github-api-version"] == "2022-11-28" for entry in sent)


async def test_a_run_that_completes_with_an_undocumented_conclusion_stops_as_unknown_state(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("octo/hello/43", [run("completed", "rerequested", run_id=43)])
    h = make_harness(tmp_path, fake, table=GITHUB_LIKE)
    async with h.client() as client:
        await track(client, "octo/hello/43")
        stopped = await check(client, "octo/hello/43", wait=30)

    assert stopped["stop_reason"] == "unknown_state"
    assert "conclusion 'rerequested' is not listed under [refine.completed]" in stopped["stop_detail"]
    assert stopped["allowed_actions"] == ["request_extension"]


async def test_a_job_id_of_the_wrong_shape_is_refused_at_start_and_nothing_is_sent(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=GITHUB_LIKE)
    async with h.client() as client:
        result = await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-bad", "provider_job_id": "hello/42"}
        )

    assert result.is_error
    text = " ".join(getattr(block, "text", "") for block in result.content)
    assert "write it as owner/repo/run_id" in text
    assert fake.requests_for("hello/42") == []


async def test_a_status_body_about_another_job_stops_as_an_integration_failure(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("job_mixup", [pending("running", id="job_other")])
    h = make_harness(tmp_path, fake, table={"response": {"job_id_field": "id"}})
    async with h.client() as client:
        await track(client, "job_mixup")
        stopped = await check(client, "job_mixup", wait=30)

    assert stopped["stop_reason"] == "integration_failure"
    assert "about job 'job_other' (id), not 'job_mixup'" in stopped["stop_detail"]


# Rate limits signalled with a 403 (GitHub)

RATE_LIMIT: dict[str, Any] = {
    "rate_limit": {
        "remaining_header": "x-ratelimit-remaining",
        "reset_header": "x-ratelimit-reset",
        "forbidden_with_retry_after": True,
    }
}


def forbidden(**headers: str) -> Step:
    return Step(status=403, headers=headers, body={"message": "API rate limit exceeded"})


async def test_a_403_with_no_requests_remaining_waits_until_the_reset_instead_of_stopping(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=RATE_LIMIT)
    reset = int(h.clock.now()) + 600
    fake.script("job_rl", [forbidden(**{"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)})])
    async with h.client() as client:
        await track(client, "job_rl")
        answered = await check(client, "job_rl", wait=30)

    assert answered["status"] == "waiting"
    assert answered["delay_source"] == "provider_retry_after"
    assert answered["next_check_at"] == iso(reset)
    assert answered["rate_limited_used"] == 1


async def test_a_403_with_retry_after_is_a_secondary_rate_limit_and_the_last_one_stops_as_rate_limited(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("job_rl2", [forbidden(**{"Retry-After": "1", "x-ratelimit-remaining": "4000"})])
    h = make_harness(tmp_path, fake, table={**RATE_LIMIT, "limits": {"max_rate_limited": 2}})
    async with h.client() as client:
        await track(client, "job_rl2")
        first = await check(client, "job_rl2", wait=30)
        second = await check(client, "job_rl2", wait=30)

    assert first["status"] == "waiting"
    assert second["stop_reason"] == "rate_limited"
    assert second["stop_detail"] == "rate limited 2 times, the last with HTTP 403 (limit 2)"


async def test_a_plain_403_is_still_a_refusal_with_or_without_rate_limit_headers(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("job_denied", [forbidden(**{"x-ratelimit-remaining": "4990"})])
    fake.script("job_denied_plain", [forbidden(**{"x-ratelimit-remaining": "0"})])
    h = make_harness(tmp_path, fake, table=RATE_LIMIT)
    plain = make_harness(tmp_path / "plain", fake)
    async with h.client() as client:
        await track(client, "job_denied")
        denied = await check(client, "job_denied", wait=30)
    async with plain.client() as client:
        await track(client, "job_denied_plain")
        denied_without_section = await check(client, "job_denied_plain", wait=30)

    assert denied["stop_reason"] == "authorization_denied"
    # Without [rate_limit] the table documents no such signal: a 403 is a refusal.
    assert denied_without_section["stop_reason"] == "authorization_denied"


def test_a_reset_header_that_is_not_unix_seconds_is_ignored_and_noted(tmp_path: Path) -> None:
    table = table_from(tmp_path, RATE_LIMIT)
    answer = ProviderAnswer(
        status_code=403,
        headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": "soon"},
        body=b"{}",
        received_at=T0,
    )

    preview = preview_answer(table, answer, started_at=T0 - 60)

    assert preview.outcome == "waiting"
    assert preview.delay_source == "local_backoff"
    assert "rate_limit_reset 'soon': not Unix seconds" in preview.ignored
