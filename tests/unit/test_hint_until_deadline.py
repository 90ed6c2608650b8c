"""A provider's poll hint ending after the deadline is honoured up to the deadline (DESIGN §1.7).

The hint is a suggestion: the controller never polls sooner than the provider
asked, and never after the deadline, so the next check is planned at the
deadline (where waiting stops unless a webhook wakes the operation first).
Absurd hints (longer than the table's max_deadline_seconds) are still rejected.
"""

from __future__ import annotations

import json

from harness import SteppedRandom, polling_record, provider_table
from pollwarden.core.records import OperationRecord
from pollwarden.core.vocabulary import DelaySource, Status, StopReason
from pollwarden.rules.schedule import plan_next_check
from pollwarden.rules.status_answer import ProviderAnswer, interpret_status_answer
from pollwarden.surface.views import operation_view

NOW = 1100.0  # the record's deadline (3400.0) is 2,300 s away


def _polling(**changes: object) -> OperationRecord:
    return polling_record(NOW, **changes)


def _running(**body: object) -> ProviderAnswer:
    return ProviderAnswer(200, {}, json.dumps({"state": "running", **body}).encode(), NOW)


def test_a_hint_past_the_deadline_plans_the_next_check_at_the_deadline() -> None:
    plan = plan_next_check(
        now=NOW, attempt=3, base=5, maximum=120, rng=SteppedRandom(0.5), poll_hint=3000, deadline=3400.0
    )
    assert (plan.at, plan.delay_source, plan.mandatory, plan.until_deadline) == (
        3400.0,
        DelaySource.PROVIDER_POLL_HINT,
        False,
        True,
    )


def test_a_hint_inside_the_deadline_is_used_as_it_is() -> None:
    plan = plan_next_check(
        now=NOW, attempt=3, base=5, maximum=120, rng=SteppedRandom(0.5), poll_hint=2000, deadline=3400.0
    )
    assert (plan.at, plan.until_deadline) == (NOW + 2000, False)


def test_a_retry_after_past_the_deadline_is_still_a_minimum_that_no_check_fits() -> None:
    plan = plan_next_check(
        now=NOW,
        attempt=3,
        base=5,
        maximum=120,
        rng=SteppedRandom(0.5),
        retry_after=3000,
        poll_hint=3000,
        deadline=3400.0,
    )
    assert (plan.at, plan.mandatory, plan.until_deadline) == (NOW + 3000, True, False)


def test_a_running_answer_with_poll_after_3000_waits_until_the_deadline_not_the_local_backoff() -> None:
    record = _polling()
    decided = interpret_status_answer(
        record, provider_table(), _running(poll_after_seconds=3000), rng=SteppedRandom(0.5)
    )
    assert (decided.status, decided.stop_reason) == (Status.WAITING, None)
    assert (decided.next_check_at, decided.delay_source) == (3400.0, DelaySource.PROVIDER_POLL_HINT)
    assert decided.rejected_hints == ()


def test_a_hint_past_the_business_deadline_waits_until_the_business_deadline() -> None:
    record = _polling(business_deadline_at=2000.0)
    decided = interpret_status_answer(
        record, provider_table(), _running(poll_after_seconds=1500), rng=SteppedRandom(0.5)
    )
    assert (decided.status, decided.next_check_at) == (Status.WAITING, 2000.0)


def test_an_absurd_hint_longer_than_the_tables_maximum_deadline_is_still_rejected() -> None:
    record = _polling()
    decided = interpret_status_answer(
        record, provider_table(), _running(poll_after_seconds=86401), rng=SteppedRandom(0.5)
    )
    assert decided.delay_source == DelaySource.LOCAL_BACKOFF
    assert decided.next_check_at is not None
    assert decided.next_check_at < NOW + 120
    assert [h.source for h in decided.rejected_hints] == ["poll_after"]


def test_a_retry_after_past_the_deadline_still_stops_at_once() -> None:
    record = _polling()
    answer = ProviderAnswer(200, {"retry-after": "3000"}, json.dumps({"state": "running"}).encode(), NOW)
    decided = interpret_status_answer(record, provider_table(), answer, rng=SteppedRandom(0.5))
    assert decided.stop_reason == StopReason.DEADLINE_EXCEEDED


def test_the_agent_is_told_waiting_ends_at_the_deadline_unless_a_webhook_wakes_it() -> None:
    record = _polling(next_check_at=3400.0, delay_source=DelaySource.PROVIDER_POLL_HINT, lease_owner=None)
    shown = operation_view(record, provider_table(), now=NOW)
    assert shown.retry_after_seconds == 2300.0
    assert "only after the polling deadline" in shown.message
    assert "unless a webhook brings the check forward" in shown.message


def test_a_retry_after_past_the_deadline_stops_at_once_even_beside_a_longer_hint() -> None:
    record = _polling()
    answer = ProviderAnswer(
        200,
        {"retry-after": "3000"},
        json.dumps({"state": "running", "poll_after_seconds": 3500}).encode(),
        NOW,
    )
    decided = interpret_status_answer(record, provider_table(), answer, rng=SteppedRandom(0.5))
    assert (decided.status, decided.stop_reason) == (Status.ESCALATED, StopReason.DEADLINE_EXCEEDED)
    assert decided.stop_detail is not None
    assert "Retry-After" in decided.stop_detail


def test_a_running_answer_that_comes_after_the_deadline_stops_even_with_a_poll_hint() -> None:
    # Reserved a second before the deadline (3400), answered five seconds after it: running is no
    # longer an acceptable answer, whatever the provider suggests for the next one.
    record = polling_record(3399.0)
    for body in ({}, {"poll_after_seconds": 10}):
        late = ProviderAnswer(200, {}, json.dumps({"state": "running", **body}).encode(), 3405.0)
        decided = interpret_status_answer(
            record, provider_table(), late, rng=SteppedRandom(1.0), sent_at=3399.0
        )
        assert (decided.status, decided.stop_reason) == (Status.ESCALATED, StopReason.DEADLINE_EXCEEDED), body
