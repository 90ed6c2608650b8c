"""README "How a check decides" and "Submitting a job": what one answer means, table by table.

Both pure decision functions — `interpret_status_answer` (a status answer) and
`interpret_submit_answer` (a submit answer), with `submission_verdict` — over
every status class, every hint and every budget edge, built on the one shared
record and table factory (`harness.operation_record`, `harness.provider_table`).
Each row names the case, the record's state, the answer and what must follow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness import SteppedRandom, operation_record, polling_record, provider_table
from pollwarden.core.records import OperationRecord
from pollwarden.core.vocabulary import DelaySource, Status, StopReason
from pollwarden.rules.status_answer import (
    NoAnswer,
    ProviderAnswer,
    StatusClass,
    UnusableAnswer,
    interpret_status_answer,
    sort_status,
)
from pollwarden.rules.submit_answer import (
    SendSubmission,
    SubmitOutcome,
    interpret_submit_answer,
    submission_verdict,
)

NOW = 1500.0  # the answer's arrival; the record started at 1000.0 and its deadline is 3400.0
RATE_LIMIT_TABLE = {"rate_limit": {"remaining_header": "x-ratelimit-remaining"}}


def _polling(**changes: Any) -> OperationRecord:
    """A waiting record as `interpret_status_answer` sees it: reloaded under the lease, this request counted."""
    return polling_record(NOW, **changes)


def _submitting(**changes: Any) -> OperationRecord:
    """A submission as `interpret_submit_answer` sees it: claimed under its lease, no job id yet."""
    base: dict[str, Any] = {
        "status": Status.SUBMITTING,
        "provider_job_id": None,
        "stop_reason": None,
        "stopped_at": None,
        "status_requests_used": 0,
        "polls_completed": 0,
        "idempotency_key": "pw-key",
        "submit_payload_json": "{}",
        "lease_owner": "me",
        "lease_expires_at": NOW + 60,
    }
    return operation_record(**{**base, **changes})


def _answer(code: int, body: object = None, **headers: str) -> ProviderAnswer:
    raw = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    return ProviderAnswer(code, {k.replace("_", "-"): v for k, v in headers.items()}, raw, NOW)


RUNNING = {"state": "running"}
DONE = {"state": "succeeded", "result_url": "https://files.example/r.csv"}


@dataclass(frozen=True)
class Case:
    """One row: the record's changes, the answer, and what must follow."""

    name: str
    answer: ProviderAnswer | NoAnswer | UnusableAnswer
    status: Status
    reason: StopReason | None = None
    record: dict[str, Any] = field(default_factory=dict[str, Any])
    table: dict[str, Any] = field(default_factory=dict[str, Any])
    detail: str = ""  # a phrase the stop detail (or the retry note) must contain
    delay_source: DelaySource | None = None  # while waiting: why the next check is when it is
    rejected: str = ""  # a phrase one rejected hint's reason must contain ("": no hint is rejected)


AFTER_RESPONSE = [
    # 2xx: the body decides
    Case(
        "200 pending keeps waiting",
        _answer(200, RUNNING),
        Status.WAITING,
        delay_source=DelaySource.LOCAL_BACKOFF,
    ),
    Case("200 succeeded with its fields", _answer(200, DONE), Status.SUCCEEDED, StopReason.SUCCEEDED),
    Case(
        "200 succeeded without a required field",
        _answer(200, {"state": "succeeded"}),
        Status.ESCALATED,
        StopReason.INTEGRATION_FAILURE,
        detail="without the required field(s) result_url",
    ),
    Case("200 failed", _answer(200, {"state": "failed"}), Status.FAILED, StopReason.PROVIDER_FAILURE),
    Case("200 cancelled", _answer(200, {"state": "cancelled"}), Status.CANCELLED, StopReason.CANCELLED),
    Case("200 expired", _answer(200, {"state": "expired"}), Status.EXPIRED, StopReason.EXPIRED),
    Case("200 unknown state", _answer(200, {"state": "paused"}), Status.ESCALATED, StopReason.UNKNOWN_STATE),
    Case(
        "200 awaiting review",
        _answer(200, {"state": "needs_review"}),
        Status.ESCALATED,
        StopReason.AWAITING_REVIEW,
        table={
            "states": {"awaiting_review": ["needs_review"]},
            "awaiting_review": {"where": "the review page's Approve button"},
        },
        detail="a person must act at the provider",
    ),
    Case("200 without a state", _answer(200, {}), Status.ESCALATED, StopReason.INTEGRATION_FAILURE),
    Case(
        "204 without a body",
        _answer(204),
        Status.ESCALATED,
        StopReason.INTEGRATION_FAILURE,
        detail="unreadable",
    ),
    # 3xx, 4xx, 5xx, no HTTP status
    Case(
        "301 is never followed",
        _answer(301, location="https://elsewhere.example/x"),
        Status.ESCALATED,
        StopReason.INTEGRATION_FAILURE,
        detail="redirect, not followed",
    ),
    Case("401 refuses the credentials", _answer(401), Status.ESCALATED, StopReason.AUTHORIZATION_DENIED),
    Case("403 refuses the credentials", _answer(403), Status.ESCALATED, StopReason.AUTHORIZATION_DENIED),
    Case(
        "403 with the table's rate-limit signal is a rate limit",
        _answer(403, x_ratelimit_remaining="0"),
        Status.WAITING,
        table=RATE_LIMIT_TABLE,
        delay_source=DelaySource.LOCAL_BACKOFF,
    ),
    Case("404 inside the grace window waits", _answer(404), Status.WAITING, record={"started_at": NOW - 10}),
    # Submitted long after start (a 503 with Retry-After first): the grace counts from the submission.
    Case(
        "404 right after a late submission waits",
        _answer(404),
        Status.WAITING,
        record={"started_at": NOW - 600, "submit_sent_at": NOW - 10},
    ),
    Case(
        "404 long after a submission stops",
        _answer(404),
        Status.ESCALATED,
        StopReason.INTEGRATION_FAILURE,
        record={"started_at": NOW - 600, "submit_sent_at": NOW - 100},
        detail="100 s after its submission was sent, outside the 30 s grace window",
    ),
    Case(
        "404 after the grace window",
        _answer(404),
        Status.ESCALATED,
        StopReason.INTEGRATION_FAILURE,
        detail="grace window",
    ),
    Case(
        "404 after the retention period",
        _answer(404),
        Status.EXPIRED,
        StopReason.EXPIRED,
        table={"not_found": {"retention_seconds": 100}},
    ),
    Case(
        "409 is unexpected",
        _answer(409),
        Status.ESCALATED,
        StopReason.INTEGRATION_FAILURE,
        detail="unexpected HTTP status 409",
    ),
    Case("429 waits, counted", _answer(429), Status.WAITING),
    Case(
        "the last 429 allowed",
        _answer(429),
        Status.ESCALATED,
        StopReason.RATE_LIMITED,
        record={"rate_limited_used": 2},
        detail="rate limited 3 times",
    ),
    Case("503 waits, counted", _answer(503), Status.WAITING),
    Case(
        "the last 5xx allowed",
        _answer(503),
        Status.ESCALATED,
        StopReason.DELIVERY_AMBIGUOUS,
        record={"transport_failures_used": 2},
        detail="server error (5xx) for status requests (last: HTTP 503); transport failures 3 of 3",
    ),
    Case("600 is no HTTP status", _answer(600), Status.ESCALATED, StopReason.INTEGRATION_FAILURE),
    Case("no answer waits, counted", NoAnswer("timeout", "timed out", NOW), Status.WAITING),
    Case(
        "the last no-answer allowed",
        NoAnswer("timeout", "timed out", NOW),
        Status.ESCALATED,
        StopReason.DELIVERY_AMBIGUOUS,
        record={"transport_failures_used": 2},
        detail="no complete answer for status requests (last: timed out)",
    ),
    Case(
        "an unusable answer",
        UnusableAnswer(200, "too large", NOW),
        Status.ESCALATED,
        StopReason.INTEGRATION_FAILURE,
        detail="too large",
    ),
    # hints
    Case(
        "a valid Retry-After is a minimum",
        _answer(200, RUNNING, retry_after="300"),
        Status.WAITING,
        delay_source=DelaySource.PROVIDER_RETRY_AFTER,
    ),
    Case(
        "a Retry-After on a 503",
        _answer(503, retry_after="300"),
        Status.WAITING,
        delay_source=DelaySource.PROVIDER_RETRY_AFTER,
    ),
    Case(
        "an unreadable Retry-After is ignored and recorded",
        _answer(200, RUNNING, retry_after="soon"),
        Status.WAITING,
        delay_source=DelaySource.LOCAL_BACKOFF,
        rejected="not delta-seconds or an HTTP-date",
    ),
    Case(
        "a Retry-After past the deadline stops",
        _answer(200, RUNNING, retry_after="2000"),
        Status.ESCALATED,
        StopReason.DEADLINE_EXCEEDED,
        detail="the provider's Retry-After ends 2000 s from now",
    ),
    Case(
        "a poll hint replaces the backoff",
        _answer(200, {**RUNNING, "poll_after_seconds": 60}),
        Status.WAITING,
        delay_source=DelaySource.PROVIDER_POLL_HINT,
    ),
    # budget and deadline edges
    Case(
        "one status request left keeps waiting",
        _answer(200, RUNNING),
        Status.WAITING,
        record={"status_requests_used": 11},
    ),
    Case(
        "the last status request used",
        _answer(200, RUNNING),
        Status.ESCALATED,
        StopReason.REQUEST_BUDGET_EXHAUSTED,
        record={"status_requests_used": 12},
        detail="and the job is not finished",
    ),
    Case(
        "the last request may still succeed",
        _answer(200, DONE),
        Status.SUCCEEDED,
        StopReason.SUCCEEDED,
        record={"status_requests_used": 12},
    ),
    Case(
        "the next check lands after the deadline",
        _answer(200, RUNNING),
        Status.ESCALATED,
        StopReason.DEADLINE_EXCEEDED,
        record={"deadline_at": NOW + 1},
        detail="the next allowed check ends",
    ),
    Case(
        "the business deadline comes first",
        _answer(200, RUNNING),
        Status.ESCALATED,
        StopReason.DEADLINE_EXCEEDED,
        record={"business_deadline_at": NOW + 1},
        detail="after the business deadline",
    ),
    Case(
        "two transport failures of three keep waiting",
        NoAnswer("timeout", "timed out", NOW),
        Status.WAITING,
        record={"transport_failures_used": 1},
    ),
]


@pytest.mark.parametrize("case", AFTER_RESPONSE, ids=lambda c: c.name)
def test_each_status_answer_leads_to_the_documented_next_step(case: Case) -> None:
    record = _polling(**case.record)
    decided = interpret_status_answer(record, provider_table(case.table), case.answer, rng=SteppedRandom(0.5))
    assert (decided.status, decided.stop_reason) == (case.status, case.reason)
    assert case.detail in (decided.stop_detail or "")
    if case.status == Status.WAITING:
        assert decided.next_check_at is not None
        assert NOW < decided.next_check_at < record.effective_deadline
        if case.delay_source is not None:
            assert decided.delay_source == case.delay_source
    if case.rejected:
        assert any(case.rejected in h.reason for h in decided.rejected_hints)
    else:
        assert decided.rejected_hints == ()
    # Nothing an answer says moves a budget or a deadline: only the counters of what it was.
    is_transport = isinstance(case.answer, NoAnswer) or 500 <= getattr(case.answer, "status_code", 0) <= 599
    assert decided.transport_failure == is_transport
    assert decided.rate_limited == (case.name.startswith(("429", "the last 429", "403 with")))


def test_a_retry_after_keeps_its_wait_even_when_the_budget_stops_the_operation() -> None:
    record = _polling(status_requests_used=12)
    decided = interpret_status_answer(
        record, provider_table(), _answer(200, RUNNING, retry_after="90"), rng=SteppedRandom(0.5)
    )
    assert decided.stop_reason == StopReason.REQUEST_BUDGET_EXHAUSTED
    assert decided.retry_after_seconds == 90


@pytest.mark.parametrize(
    ("code", "rate_limit_403", "sorted_as"),
    [
        (200, False, StatusClass.SUCCESS),
        (299, False, StatusClass.SUCCESS),
        (301, False, StatusClass.REDIRECT),
        (399, False, StatusClass.REDIRECT),
        (401, False, StatusClass.REFUSED),
        (403, False, StatusClass.REFUSED),
        (403, True, StatusClass.RATE_LIMITED),
        (401, True, StatusClass.REFUSED),
        (404, False, StatusClass.NOT_FOUND),
        (429, False, StatusClass.RATE_LIMITED),
        (500, False, StatusClass.SERVER_ERROR),
        (599, False, StatusClass.SERVER_ERROR),
        (100, False, StatusClass.OTHER),
        (418, False, StatusClass.OTHER),
        (600, False, StatusClass.OTHER),
    ],
)
def test_status_and_submit_answers_sort_a_status_code_the_same_one_way(
    code: int, rate_limit_403: bool, sorted_as: StatusClass
) -> None:
    assert sort_status(code, rate_limit_403=rate_limit_403) == sorted_as


# -- interpret_submit_answer ------------------------------------------------------------------------------

NO_KEY = {"idempotency_key": None}


@dataclass(frozen=True)
class SubmitCase:
    """One row: the record's changes, the submit answer, and the outcome that must follow."""

    name: str
    answer: ProviderAnswer | NoAnswer | UnusableAnswer
    kind: str
    reason: StopReason | None = None
    record: dict[str, Any] = field(default_factory=dict[str, Any])
    detail: str = ""
    delay_source: DelaySource | None = None


AFTER_SUBMIT = [
    SubmitCase(
        "201 with the job id in the body",
        _answer(201, {"id": "job-9"}),
        "submitted",
        delay_source=DelaySource.LOCAL_BACKOFF,
    ),
    SubmitCase(
        "202 with the job id in a same-origin Location", _answer(202, location="/v1/jobs/job-9"), "submitted"
    ),
    SubmitCase(
        "200 with a Retry-After longer than the first check",
        _answer(200, {"id": "job-9"}, retry_after="300"),
        "submitted",
        delay_source=DelaySource.PROVIDER_RETRY_AFTER,
    ),
    SubmitCase(
        "201 naming no job id",
        _answer(201, {"other": 1}),
        "stopped",
        StopReason.INTEGRATION_FAILURE,
        detail="names no job id",
    ),
    SubmitCase(
        "201 with a Location on another origin",
        _answer(201, {}, location="https://evil.example/v1/jobs/x"),
        "stopped",
        StopReason.INTEGRATION_FAILURE,
        detail="is not on",
    ),
    SubmitCase(
        "204 is not an acceptance",
        _answer(204),
        "stopped",
        StopReason.INTEGRATION_FAILURE,
        detail="not an acceptance",
    ),
    SubmitCase(
        "302 is never followed",
        _answer(302, location="/elsewhere"),
        "stopped",
        StopReason.INTEGRATION_FAILURE,
        detail="redirect on submission",
    ),
    SubmitCase(
        "401 refuses the credentials",
        _answer(401),
        "stopped",
        StopReason.AUTHORIZATION_DENIED,
        detail="on submission",
    ),
    SubmitCase("403 refuses the credentials", _answer(403), "stopped", StopReason.AUTHORIZATION_DENIED),
    SubmitCase("404 is not an acceptance", _answer(404), "stopped", StopReason.INTEGRATION_FAILURE),
    SubmitCase(
        "429 is tried again later",
        _answer(429),
        "submit_unanswered",
        detail="rate limited, 1 of 3",
        delay_source=DelaySource.LOCAL_BACKOFF,
    ),
    SubmitCase(
        "429 with a long Retry-After",
        _answer(429, retry_after="300"),
        "submit_unanswered",
        delay_source=DelaySource.PROVIDER_RETRY_AFTER,
    ),
    SubmitCase(
        "the last 429 allowed",
        _answer(429),
        "stopped",
        StopReason.RATE_LIMITED,
        record={"rate_limited_used": 2},
        detail="nothing was created",
    ),
    SubmitCase(
        "503 with an idempotency key is resent later",
        _answer(503),
        "submit_unanswered",
        detail="same idempotency key",
    ),
    SubmitCase(
        "503 without idempotency may have created the job",
        _answer(503),
        "stopped",
        StopReason.DELIVERY_AMBIGUOUS,
        record=NO_KEY,
        detail="never resubmitted",
    ),
    SubmitCase(
        "the last 503 allowed with a key",
        _answer(503),
        "stopped",
        StopReason.DELIVERY_AMBIGUOUS,
        record={"transport_failures_used": 2},
        detail="3 submission attempts",
    ),
    SubmitCase(
        "no answer, never sent, is sent again",
        NoAnswer("connection_refused", "refused", NOW, sent=False),
        "submit_unanswered",
        record=NO_KEY,
        detail="never left",
    ),
    SubmitCase(
        "no answer, never sent, the last allowed",
        NoAnswer("connection_refused", "refused", NOW, sent=False),
        "stopped",
        StopReason.INTEGRATION_FAILURE,
        record={**NO_KEY, "transport_failures_used": 2},
        detail="no job exists",
    ),
    SubmitCase(
        "no answer after sending without a key",
        NoAnswer("timeout", "timed out", NOW),
        "stopped",
        StopReason.DELIVERY_AMBIGUOUS,
        record=NO_KEY,
    ),
    SubmitCase(
        "no answer after sending with a key",
        NoAnswer("timeout", "timed out", NOW),
        "submit_unanswered",
        detail="may have reached the provider",
    ),
    SubmitCase(
        "an unusable answer",
        UnusableAnswer(201, "too large", NOW),
        "stopped",
        StopReason.INTEGRATION_FAILURE,
        detail="too large",
    ),
]


@pytest.mark.parametrize("case", AFTER_SUBMIT, ids=lambda c: c.name)
def test_each_submit_answer_leads_to_the_documented_outcome(case: SubmitCase) -> None:
    record = _submitting(**case.record)
    outcome = interpret_submit_answer(record, provider_table(), case.answer, rng=SteppedRandom(0.5))
    assert (outcome.kind, outcome.stop.reason if outcome.stop else None) == (case.kind, case.reason)
    assert case.detail in outcome.note
    assert outcome.at == NOW
    changes = outcome.changes
    if case.kind == "submitted":
        assert changes["status"] == Status.WAITING
        assert changes["provider_job_id"] == "job-9"
        assert float(changes["next_check_at"]) > NOW  # type: ignore[arg-type]
    if case.kind == "stopped":
        assert (changes["status"], changes["stopped_at"]) == (
            outcome.stop.status if outcome.stop else None,
            NOW,
        )
    if case.kind == "submit_unanswered":
        # Still submitting: a later start_operation may send it from this time, and not before.
        assert "status" not in changes
        assert float(changes["next_check_at"]) > NOW  # type: ignore[arg-type]
    if case.delay_source is not None:
        assert changes["delay_source"] == case.delay_source


def test_a_403_submit_answer_with_the_tables_rate_limit_signal_is_tried_again_later_not_a_refusal() -> None:
    table = provider_table(RATE_LIMIT_TABLE)
    limited = interpret_submit_answer(
        _submitting(), table, _answer(403, x_ratelimit_remaining="0"), rng=SteppedRandom(0.5)
    )
    assert (limited.kind, limited.stop) == ("submit_unanswered", None)
    assert "403 (rate limited, x-ratelimit-remaining: 0, 1 of 3)" in limited.note
    refused = interpret_submit_answer(
        _submitting(), table, _answer(403, x_ratelimit_remaining="12"), rng=SteppedRandom(0.5)
    )
    assert refused.stop is not None
    assert refused.stop.reason == StopReason.AUTHORIZATION_DENIED


@pytest.mark.parametrize(
    ("table", "headers", "wait"),
    [
        ({"rate_limit": {"min_wait_seconds": 30}}, {}, 30.0),  # the table's documented minimum
        ({"response": {"retry_after_ms_header": "retry-after-ms"}}, {"retry_after_ms": "45000"}, 45.0),
        ({}, {"retry_after": "50"}, 50.0),
    ],
)
def test_a_rate_limited_submission_waits_as_long_as_a_rate_limited_status_request_would(
    table: dict[str, Any], headers: dict[str, str], wait: float
) -> None:
    provider = provider_table(table)
    submit = interpret_submit_answer(_submitting(), provider, _answer(429, **headers), rng=SteppedRandom(0.5))
    status = interpret_status_answer(_polling(), provider, _answer(429, **headers), rng=SteppedRandom(0.5))
    assert submit.changes["next_check_at"] == status.next_check_at == NOW + wait
    assert submit.changes["delay_source"] == DelaySource.PROVIDER_RETRY_AFTER


def test_a_submission_rate_limited_without_guidance_backs_off_markedly_longer_than_after_a_503() -> None:
    table = provider_table()
    limited = interpret_submit_answer(_submitting(), table, _answer(429), rng=SteppedRandom(1.0))
    failed = interpret_submit_answer(_submitting(), table, _answer(503), rng=SteppedRandom(1.0))
    limited_wait = float(limited.changes["next_check_at"]) - NOW  # type: ignore[arg-type]
    failed_wait = float(failed.changes["next_check_at"]) - NOW  # type: ignore[arg-type]
    assert limited_wait >= 4 * failed_wait


def test_a_submission_told_to_retry_after_the_deadline_stops_instead() -> None:
    record = _submitting(deadline_at=NOW + 100)
    outcome = interpret_submit_answer(
        record, provider_table(), _answer(503, retry_after="1200"), rng=SteppedRandom(0.5)
    )
    assert outcome.stop is not None
    assert outcome.stop.reason == StopReason.DEADLINE_EXCEEDED
    assert "Retry-After ends 1200 s from now" in outcome.stop.detail


@pytest.mark.parametrize(
    ("name", "changes", "expected"),
    [
        ("another call holds a live lease", {"lease_expires_at": NOW + 1}, None),
        ("the deadline passed", {"lease_owner": None, "deadline_at": NOW}, StopReason.DEADLINE_EXCEEDED),
        (
            "an interrupted call without a key",
            {**NO_KEY, "lease_expires_at": NOW},
            StopReason.DELIVERY_AMBIGUOUS,
        ),
        ("an interrupted call with a key resends", {"lease_expires_at": NOW}, "send"),
        (
            "a retry not yet due",
            {"lease_owner": None, "transport_failures_used": 1, "next_check_at": NOW + 1},
            None,
        ),
        (
            "a retry now due",
            {"lease_owner": None, "transport_failures_used": 1, "next_check_at": NOW},
            "send",
        ),
        ("a first send", {"lease_owner": None}, "send"),
    ],
)
def test_before_sending_a_submission_is_left_stopped_or_sent(
    name: str, changes: dict[str, Any], expected: object
) -> None:
    start = submission_verdict(_submitting(**changes), provider_table(), now=NOW)
    if expected is None:
        assert start is None
    elif expected == "send":
        assert isinstance(start, SendSubmission)
        assert start.allow_stale == (changes.get("idempotency_key", "pw-key") is not None)
    else:
        assert isinstance(start, SubmitOutcome)
        assert start.stop is not None
        assert start.stop.reason == expected
