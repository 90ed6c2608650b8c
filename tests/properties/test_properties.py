"""Property tests: hostile provider answers never crash the controller or loosen a limit.

Pure level: `interpret_status_answer` and the schedule, fed arbitrary status
codes, headers (Retry-After garbage, HTTP-dates, huge numbers) and bodies
(unknown states, huge numbers, wrong types, NaN, invalid dates, deep nesting,
bytes that are not JSON). End to end: the same kind of answers served by the
fake provider over HTTP, through the controller and a real SQLite store.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness import base_table, merge, operation_record
from pollwarden.audit.chain import read_rows
from pollwarden.audit.verify import verify_chain
from pollwarden.config import ServerConfig
from pollwarden.core.clock import FakeClock
from pollwarden.core.records import OperationRecord
from pollwarden.flows.controller import Controller, transition_changes
from pollwarden.provider_io.provider_http import ProviderHTTP
from pollwarden.rules.schedule import (
    RATE_LIMIT_EXTRA_DOUBLINGS,
    first_check_at,
    local_backoff,
    plan_next_check,
    raw_delay,
)
from pollwarden.rules.status_answer import (
    NoAnswer,
    ProviderAnswer,
    Transition,
    UnusableAnswer,
    interpret_status_answer,
)
from pollwarden.store import DatabaseLocation, open_store
from pollwarden_providers.interpret import parse_retry_after
from pollwarden_providers.table import ProviderTable
from tests.support.fake_provider import FakeProvider, Step
from tests.support.live import STATUSES, STOP_REASONS, record_problems

T0 = 1_744_971_600.0  # 2025-04-18T10:20:00Z, the fake clock's start
DELAY_SOURCES = ("local_backoff", "provider_retry_after", "provider_poll_hint")
KNOWN_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "expired")
# Values a provider might send that are not in the table: they must stop the operation.
UNKNOWN_STATES = (
    "paused",
    "awaiting_review",
    "needs_payment",
    "RUNNING",
    "Running",
    " running",
    "running ",
    "",
)
# Fields the provider's answer must never be able to change.
AUTHORIZATIONS = (
    "max_status_requests",
    "max_transport_failures",
    "max_rate_limited",
    "deadline_at",
    "business_deadline_at",
    "status_requests_used",
)
EPSILON = 1e-6

# POLLWARDEN_PROPERTY_EXAMPLES raises the example counts for a deep run (see RELIABILITY.md).
DEEP = int(os.environ.get("POLLWARDEN_PROPERTY_EXAMPLES", "0") or 0)
PURE = settings(
    max_examples=DEEP or 300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# -- strategies: numbers, dates and text a provider might send ---------------------------------

huge_numbers = st.one_of(
    st.integers(min_value=10**15, max_value=10**40),
    st.integers(max_value=-1, min_value=-(10**40)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, 0.0, -0.0, 2**53 + 1]),
)
any_datetime = st.datetimes(
    min_value=datetime(1900, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
)
near_datetime = st.integers(min_value=-3 * 86_400, max_value=3 * 86_400).map(
    lambda s: datetime.fromtimestamp(T0, UTC) + timedelta(seconds=s)
)
http_dates = st.one_of(any_datetime, near_datetime).map(lambda d: format_datetime(d, usegmt=True))
rfc3339 = st.one_of(any_datetime, near_datetime).map(lambda d: d.isoformat())
bad_dates = st.sampled_from(
    [
        "Wed, 31 Feb 2025 10:00:00 GMT",
        "Fri, 18 Apr 2025 25:61:61 GMT",
        "2025-02-30T10:00:00Z",
        "2025-04-18T10:20:00",  # no offset
        "9999-99-99",
        "yesterday",
        "0000-00-00T00:00:00+00:00",
        "Fri, 18 Apr 99999 10:20:00 GMT",
        "-1",
        "NaN",
    ]
)
retry_after_values = st.one_of(
    st.integers(min_value=0, max_value=200_000).map(str),
    st.integers(min_value=10**6, max_value=10**400).map(str),
    st.integers(max_value=-1, min_value=-(10**6)).map(str),
    huge_numbers.map(str),
    http_dates,
    bad_dates,
    st.sampled_from(["", " ", "  120  ", "1e3", "0x10", "120, 60", "+5", "5s", "∞", "\u0661\u0662"]),
    st.text(max_size=40),
)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), huge_numbers, st.text(max_size=30))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
state_values = st.one_of(
    st.sampled_from(KNOWN_STATES),
    st.sampled_from(KNOWN_STATES),  # weight: plenty of pending answers reach the scheduling code
    st.sampled_from(UNKNOWN_STATES),
    json_values,
)
status_bodies = st.fixed_dictionaries(
    {},
    optional={
        "state": state_values,
        "poll_after_seconds": st.one_of(st.floats(min_value=0, max_value=4000), huge_numbers, json_values),
        "next_check_at": st.one_of(rfc3339, bad_dates, json_values),
        "expires_at": st.one_of(rfc3339, bad_dates, json_values),
        "result_url": st.one_of(st.just("https://files.example/r.csv"), json_values),
        "error": json_values,
    },
)


def _deep(depth: int) -> bytes:
    return b'{"state":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"


body_bytes = st.one_of(
    status_bodies.map(lambda b: json.dumps(b, allow_nan=True).encode()),
    status_bodies.map(lambda b: json.dumps(b, allow_nan=True).encode()),
    json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    st.integers(min_value=1, max_value=200).map(_deep),
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[]",
            b'"running"',
            b'{"state": NaN}',
            b'{"state": "running"',
            b"\xff\xfe{}",
            b"{}" * 3,
        ]
    ),
)
status_codes = st.one_of(
    st.sampled_from(
        [200, 201, 202, 204, 301, 302, 304, 400, 401, 403, 404, 409, 410, 429, 500, 502, 503, 504]
    ),
    st.integers(min_value=0, max_value=999),
)
header_names = st.sampled_from(["retry-after", "x-request-id", "location", "content-type", "date"])


@st.composite
def tables(draw: st.DrawFn) -> ProviderTable:
    """The test table with a drawn schedule, not-found window and caps."""
    base = draw(st.floats(min_value=0.01, max_value=60))
    maximum = draw(st.floats(min_value=base, max_value=3600))
    max_deadline = draw(st.floats(min_value=3600, max_value=7 * 86_400))
    grace = draw(st.floats(min_value=0, max_value=120))
    retention = draw(st.one_of(st.none(), st.floats(min_value=max(grace, 1), max_value=10 * 86_400)))
    data = merge(
        base_table("http://127.0.0.1:9"),
        {
            "schedule": {"base_delay_seconds": base, "max_delay_seconds": maximum},
            "not_found": {"grace_seconds": grace, "retention_seconds": retention},
            "limits": {"max_deadline_seconds": max_deadline, "default_deadline_seconds": 2400},
        },
    )
    return ProviderTable.model_validate(data)


def make_record(**values: Any) -> OperationRecord:
    """A waiting record with this request already counted (as decide sees it under the lease)."""
    under_lease: dict[str, Any] = {
        "operation_id": "op-prop",
        "provider_job_id": "job-prop",
        "request_fingerprint": "0" * 64,
        "stop_reason": None,
        "state": None,
        "category": None,
        "started_at": T0,
        "deadline_at": T0 + 2400,
        "status_requests_used": 1,
        "polls_completed": 0,
        "next_check_at": T0 + 5,
        "last_http_status": None,
        "last_http_at": None,
        "lease_owner": "me",
        "lease_expires_at": T0 + 60,
        "stopped_at": None,
        "created_at": T0,
        "updated_at": T0,
        "version": 2,
    }
    return operation_record(**{**under_lease, **values})


@st.composite
def records(draw: st.DrawFn) -> tuple[OperationRecord, float]:
    """A waiting record under the lease, and the time its answer arrives (before the deadline)."""
    now = T0 + draw(st.floats(min_value=0, max_value=10 * 86_400))
    started = now - draw(st.floats(min_value=0, max_value=10 * 86_400))
    deadline = now + draw(st.floats(min_value=0.001, max_value=10 * 86_400))
    business = draw(
        st.one_of(st.none(), st.floats(min_value=0.001, max_value=10 * 86_400).map(lambda s: now + s))
    )
    budget = draw(st.integers(min_value=1, max_value=200))
    used = draw(st.integers(min_value=1, max_value=budget))
    max_tf = draw(st.integers(min_value=1, max_value=5))
    max_rl = draw(st.integers(min_value=1, max_value=5))
    record = make_record(
        started_at=started,
        deadline_at=deadline,
        business_deadline_at=business,
        max_status_requests=budget,
        status_requests_used=used,
        polls_completed=draw(st.integers(min_value=0, max_value=used - 1)),
        max_transport_failures=max_tf,
        transport_failures_used=draw(st.integers(min_value=0, max_value=max_tf - 1)),
        max_rate_limited=max_rl,
        rate_limited_used=draw(st.integers(min_value=0, max_value=max_rl - 1)),
    )
    return record, now


@st.composite
def provider_answers(draw: st.DrawFn, now: float) -> ProviderAnswer:
    headers = draw(st.dictionaries(header_names, st.text(max_size=60), max_size=3))
    if draw(st.booleans()):
        headers["retry-after"] = draw(retry_after_values)
    return ProviderAnswer(draw(status_codes), headers, draw(body_bytes), now)


@st.composite
def any_answers(draw: st.DrawFn, now: float) -> ProviderAnswer | NoAnswer | UnusableAnswer:
    kind = draw(st.sampled_from(["answer", "answer", "answer", "none", "unusable"]))
    if kind == "none":
        return NoAnswer(
            draw(st.sampled_from(["timeout", "connection_error"])), "drawn", now, draw(st.booleans())
        )
    if kind == "unusable":
        return UnusableAnswer(draw(status_codes), "drawn", now)
    return draw(provider_answers(now))


def _decide(
    table: ProviderTable,
    record: OperationRecord,
    answer: ProviderAnswer | NoAnswer | UnusableAnswer,
    seed: int,
) -> Transition:
    return interpret_status_answer(record, table, answer, rng=random.Random(seed))


def _retry_after_seconds(answer: object, table: ProviderTable) -> float | None:
    if not isinstance(answer, ProviderAnswer):
        return None
    check = parse_retry_after(
        answer.headers.get("retry-after"),
        now=answer.received_at,
        max_seconds=table.limits.max_deadline_seconds,
    )
    return check.seconds


# -- pure: interpret_status_answer -----------------------------------------------------------------


@PURE
@given(table=tables(), drawn=records(), data=st.data(), seed=st.integers(min_value=0, max_value=2**32))
def test_any_answer_leads_to_waiting_before_the_deadline_or_to_a_stop_with_a_known_reason(
    table: ProviderTable, drawn: tuple[OperationRecord, float], data: st.DataObject, seed: int
) -> None:
    record, now = drawn
    answer = data.draw(any_answers(now))
    t = _decide(table, record, answer, seed)

    assert t.status in STATUSES
    assert t.status != "submitting"  # a decision never goes back to submitting
    if t.status == "waiting":
        assert t.stop_reason is None
        assert t.next_check_at is not None
        assert math.isfinite(t.next_check_at)
        assert t.delay_source in DELAY_SOURCES
        if t.delay_source == "provider_poll_hint":
            # A hint past the deadline waits until the deadline itself (issue 30 item 4), never beyond it.
            assert now < t.next_check_at <= record.effective_deadline
        else:
            assert now < t.next_check_at < record.effective_deadline
    else:
        assert t.stop_reason in STOP_REASONS
        assert t.stop_detail
    # The record it leads to is recorded whole: a consistent row, no authorization touched.
    changes = transition_changes(record, t, answer)
    assert not set(changes) & set(AUTHORIZATIONS)
    after = dataclasses.replace(record, **changes, lease_owner=None, lease_expires_at=None)  # type: ignore[arg-type]
    assert record_problems(dataclasses.asdict(after)) == []


@PURE
@given(
    table=tables(),
    drawn=records(),
    state=st.one_of(st.sampled_from(UNKNOWN_STATES), json_values.filter(lambda v: v not in KNOWN_STATES)),
    extra=status_bodies,
    code=st.integers(min_value=200, max_value=299),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_an_unknown_state_is_never_treated_as_pending(
    table: ProviderTable,
    drawn: tuple[OperationRecord, float],
    state: object,
    extra: dict[str, Any],
    code: int,
    seed: int,
) -> None:
    assume(state is not None)
    record, now = drawn
    body = json.dumps({**extra, "state": state}, allow_nan=True).encode()
    t = _decide(table, record, ProviderAnswer(code, {}, body, now), seed)

    assert t.status == "escalated"
    assert t.stop_reason in ("unknown_state", "integration_failure")
    assert t.category != "pending"


@PURE
@given(table=tables(), drawn=records(), data=st.data(), seed=st.integers(min_value=0, max_value=2**32))
def test_a_waiting_answer_always_names_a_state_from_the_pending_list_or_no_state(
    table: ProviderTable, drawn: tuple[OperationRecord, float], data: st.DataObject, seed: int
) -> None:
    record, now = drawn
    t = _decide(table, record, data.draw(provider_answers(now)), seed)
    if t.status == "waiting" and t.state is not None:
        assert t.category == "pending"
        assert t.state in table.states.pending


@PURE
@given(
    table=tables(),
    drawn=records(),
    code=st.sampled_from([200, 202, 404, 429, 500, 502, 503, 504]),
    retry_after=retry_after_values,
    body=body_bytes,
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_a_valid_retry_after_is_never_undercut(
    table: ProviderTable,
    drawn: tuple[OperationRecord, float],
    code: int,
    retry_after: str,
    body: bytes,
    seed: int,
) -> None:
    record, now = drawn
    answer = ProviderAnswer(code, {"retry-after": retry_after}, body, now)
    t = _decide(table, record, answer, seed)
    seconds = _retry_after_seconds(answer, table)
    if seconds is not None and t.status == "waiting":
        assert t.next_check_at is not None
        assert t.next_check_at >= now + seconds
    if seconds is not None and now + seconds >= record.effective_deadline:
        # The provider's minimum wait ends after the deadline: stop now rather than send early.
        assert t.status != "waiting"


@st.composite
def ordinary_answers(draw: st.DrawFn, now: float) -> ProviderAnswer | NoAnswer:
    """Answers that keep an operation waiting on the local backoff: pending, 5xx, 429, no answer.

    Any Retry-After here is garbage or short, so the local backoff usually decides.
    """
    kind = draw(st.sampled_from(["pending", "server_error", "rate_limited", "no_answer"]))
    if kind == "no_answer":
        return NoAnswer("timeout", "drawn", now)
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers["retry-after"] = draw(
            st.one_of(
                bad_dates,
                st.integers(min_value=-1000, max_value=-1).map(str),
                st.just("0"),
                st.text(max_size=8),
            )
        )
    if kind == "pending":
        body = {"state": draw(st.sampled_from(["queued", "running"]))}
        if draw(st.booleans()):
            body["poll_after_seconds"] = draw(st.one_of(huge_numbers, st.text(max_size=5)))
        return ProviderAnswer(200, headers, json.dumps(body, allow_nan=True).encode(), now)
    code = 429 if kind == "rate_limited" else draw(st.integers(min_value=500, max_value=599))
    return ProviderAnswer(code, headers, draw(body_bytes), now)


@PURE
@given(
    table=tables(),
    drawn=records(),
    data=st.data(),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_every_local_delay_lies_between_half_the_raw_delay_and_the_raw_delay(
    table: ProviderTable, drawn: tuple[OperationRecord, float], data: st.DataObject, seed: int
) -> None:
    drawn_record, now = drawn
    # Room left in every budget and the deadline, so the answer leads to a scheduled check.
    record = dataclasses.replace(
        drawn_record,
        deadline_at=now + 10**7,
        business_deadline_at=None,
        max_status_requests=drawn_record.status_requests_used + 1,
        transport_failures_used=0,
        max_transport_failures=2,
        rate_limited_used=0,
        max_rate_limited=2,
    )
    answer = data.draw(ordinary_answers(now))
    t = _decide(table, record, answer, seed)
    assume(t.delay_source == "local_backoff")  # a "0" Retry-After or a valid hint may still decide
    assert t.status == "waiting"
    assert t.next_check_at is not None
    extra = 0
    if (
        isinstance(answer, ProviderAnswer)
        and answer.status_code == 429
        and _retry_after_seconds(answer, table) is None
    ):
        extra = RATE_LIMIT_EXTRA_DOUBLINGS
    base, maximum = table.schedule.base_delay_seconds, table.schedule.max_delay_seconds
    raw = raw_delay(record.polls_completed + 1 + extra, base, maximum * 2**extra)
    delay = t.next_check_at - now
    assert 0.5 * raw * (1 - EPSILON) <= delay <= raw * (1 + EPSILON)


@PURE
@given(table=tables(), drawn=records(), data=st.data(), seed=st.integers(min_value=0, max_value=2**32))
def test_no_answer_exceeds_a_budget(
    table: ProviderTable, drawn: tuple[OperationRecord, float], data: st.DataObject, seed: int
) -> None:
    record, now = drawn
    answer = data.draw(any_answers(now))
    t = _decide(table, record, answer, seed)
    if isinstance(answer, ProviderAnswer) and not 100 <= answer.status_code <= 599:
        # No HTTP status at all: an integration failure, never a transport failure.
        assert (t.transport_failure, t.stop_reason) == (False, "integration_failure")
    transport_failures = record.transport_failures_used + (1 if t.transport_failure else 0)
    rate_limited = record.rate_limited_used + (1 if t.rate_limited else 0)
    assert transport_failures <= record.max_transport_failures
    assert rate_limited <= record.max_rate_limited
    if t.status == "waiting":
        # The last budgeted request, the last transport failure or the last 429 stops at once.
        assert record.status_requests_used < record.max_status_requests
        assert transport_failures < record.max_transport_failures
        assert rate_limited < record.max_rate_limited


@PURE
@given(
    raw=retry_after_values,
    now=st.floats(min_value=0, max_value=4e9),
    cap=st.floats(min_value=1, max_value=1e7),
)
def test_retry_after_parsing_never_raises_and_accepts_only_a_wait_within_the_cap(
    raw: str, now: float, cap: float
) -> None:
    check = parse_retry_after(raw, now=now, max_seconds=cap)
    assert (check.seconds is None) or (check.rejected is None)
    if check.seconds is not None:
        assert math.isfinite(check.seconds)
        assert 0 <= check.seconds <= cap


# -- pure: the schedule ----------------------------------------------------------------------------


@PURE
@given(
    attempt=st.integers(min_value=0, max_value=10**9),
    base=st.floats(min_value=1e-3, max_value=1e4),
    spread=st.floats(min_value=1, max_value=1e4),
    rng=st.randoms(use_true_random=False),
)
def test_the_local_backoff_lies_in_its_jitter_range_for_any_attempt_base_and_maximum(
    attempt: int, base: float, spread: float, rng: random.Random
) -> None:
    maximum = base * spread
    raw = maximum if attempt >= 1024 else min(maximum, base * 2.0**attempt)
    delay = local_backoff(attempt, base, maximum, rng)
    assert raw_delay(attempt, base, maximum) == pytest.approx(raw)
    assert 0.5 * raw * (1 - EPSILON) <= delay <= raw * (1 + EPSILON)


@PURE
@given(
    attempt=st.integers(min_value=0, max_value=10**6),
    base=st.floats(min_value=1e-3, max_value=100),
    spread=st.floats(min_value=1, max_value=1000),
    retry_after=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
    poll_hint=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
    rate_limited=st.booleans(),
    rng=st.randoms(use_true_random=False),
)
def test_a_planned_check_is_never_earlier_than_a_retry_after_and_never_now(
    attempt: int,
    base: float,
    spread: float,
    retry_after: float | None,
    poll_hint: float | None,
    rate_limited: bool,
    rng: random.Random,
) -> None:
    plan = plan_next_check(
        now=T0,
        attempt=attempt,
        base=base,
        maximum=base * spread,
        rng=rng,
        retry_after=retry_after,
        poll_hint=poll_hint,
        rate_limited_without_guidance=rate_limited,
    )
    assert plan.at > T0
    assert plan.delay_source in DELAY_SOURCES
    if retry_after is not None:
        assert plan.at >= T0 + retry_after


@PURE
@given(
    base=st.floats(min_value=1e-3, max_value=1e4),
    spread=st.floats(min_value=1, max_value=1e3),
    rng=st.randoms(use_true_random=False),
)
def test_the_first_check_waits_the_attempt_0_delay_from_the_start(
    base: float, spread: float, rng: random.Random
) -> None:
    at = first_check_at(T0, base, base * spread, rng)
    assert T0 + 0.5 * base * (1 - EPSILON) <= at <= T0 + base * (1 + EPSILON)


# -- end to end: the fake provider over HTTP, the controller, a real SQLite file -------------------

_HEADER_VALUE = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40
)
http_retry_after = st.one_of(
    st.integers(min_value=0, max_value=4000).map(str),
    st.integers(min_value=10**6, max_value=10**60).map(str),
    st.integers(max_value=-1, min_value=-1000).map(str),
    http_dates,
    st.sampled_from(["nan", "inf", "1e3", "0x10", "5s", "Wed, 31 Feb 2025 10:00:00 GMT"]),
    _HEADER_VALUE,
)


@st.composite
def http_steps(draw: st.DrawFn) -> Step:
    """One scripted answer: any status the fake can send, drawn headers, any body bytes."""
    status = draw(
        st.one_of(
            st.sampled_from([200, 200, 200, 202, 204, 302, 401, 404, 429, 500, 503]),
            st.integers(min_value=200, max_value=999),
        )
    )
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers["Retry-After"] = draw(http_retry_after)
    if draw(st.booleans()):
        headers["X-Request-Id"] = draw(_HEADER_VALUE)
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        headers["Content-Encoding"] = draw(
            st.sampled_from(["gzip", "deflate", "br", "identity", "x-unknown"])
        )
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        headers["Location"] = draw(st.sampled_from(["/v1/jobs/other", "https://evil.example/x", "::"]))
    body = b"" if status in (204, 304) else draw(body_bytes)
    return Step(status=status, headers=headers, raw_body=body)


E2E = settings(
    max_examples=max(25, DEEP // 10),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@E2E
@given(
    steps=st.lists(http_steps(), min_size=1, max_size=6),
    budget=st.integers(min_value=1, max_value=6),
    deadline_seconds=st.floats(min_value=10, max_value=3600),
    lateness=st.lists(st.floats(min_value=0, max_value=600), min_size=8, max_size=8),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_any_sequence_of_provider_answers_leaves_the_operation_recorded_and_consistent(
    fake_provider_server: FakeProvider,
    steps: list[Step],
    budget: int,
    deadline_seconds: float,
    lateness: list[float],
    seed: int,
) -> None:
    fake = fake_provider_server
    job_id = f"prop-{uuid.uuid4().hex[:12]}"
    fake.script(job_id, steps)
    with tempfile.TemporaryDirectory(prefix="pollwarden-prop-") as tmp:
        anyio.run(_drive, fake, job_id, Path(tmp) / "pollwarden.db", budget, deadline_seconds, lateness, seed)


async def _drive(
    fake: FakeProvider,
    job_id: str,
    db: Path,
    budget: int,
    deadline_seconds: float,
    lateness: list[float],
    seed: int,
) -> None:
    table = ProviderTable.model_validate(merge(base_table(fake.base_url, name="prop"), {}))
    clock = FakeClock()
    http = ProviderHTTP(environ={}, now=clock.now)
    operation_id = f"op-{job_id}"
    try:
        async with open_store(db) as store:
            controller = Controller(
                store=store,
                tables={"prop": table},
                http=http,
                clock=clock,
                rng=random.Random(seed),
                config=ServerConfig(database=DatabaseLocation.sqlite(db)),
            )
            await controller.start_operation(
                provider="prop",
                operation_id=operation_id,
                provider_job_id=job_id,
                deadline_seconds=deadline_seconds,
                max_status_requests=budget,
            )
            for late in lateness:
                record = await store.get(operation_id)
                assert record is not None
                if record.status != "waiting":
                    break
                # Wake at the allowed time, or late (then the deadline is checked first).
                clock.t = max(clock.t, record.next_check_at) + late
                view = await controller.check_status(operation_id)
                record = await store.get(operation_id)
                assert record is not None
                requests = len(fake.status_requests(job_id))

                assert view.status == record.status
                assert view.outcome in ("polled", "stopped", "not_yet")
                assert record_problems(dataclasses.asdict(record)) == []
                assert record.lease_owner is None
                assert record.status_requests_used == requests <= budget
                polled_rows = [r for r in read_rows(db, operation_id) if r.kind == "polled"]
                assert len(polled_rows) == requests
                if record.status == "waiting":
                    assert record.next_check_at < record.effective_deadline
            final = await store.get(operation_id)
            assert final is not None
            assert final.status != "waiting"  # every wake-up polled or stopped, and the budget is small
    finally:
        await http.aclose()
    assert verify_chain(db, None).ok
