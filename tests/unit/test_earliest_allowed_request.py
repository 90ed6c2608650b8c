"""The earliest allowed request is a fact no path goes before (issue 30, items 1 and 11): the pure rules.

The end-to-end checks (a signed webhook after a 503, a slow provider): tests/integration/test_earliest_allowed_request.py.
"""

from __future__ import annotations

from harness import SteppedRandom, operation_record, provider_table
from pollwarden.core.records import OperationRecord
from pollwarden.core.vocabulary import DelaySource, Status, StopReason
from pollwarden.rules.extensions import ExtensionPlan, extension_changes
from pollwarden.rules.gate import Verdict, gate_verdict, may_reserve
from pollwarden.rules.job_identity import reopen_next_check_at
from pollwarden.rules.schedule import after_timeout, earliest_allowed, not_before, plan_next_check
from pollwarden.rules.status_answer import NoAnswer, ProviderAnswer, interpret_status_answer

TABLE = provider_table({"schedule": {"base_delay_seconds": 8, "max_delay_seconds": 120}})


def _waiting(**changes: object) -> OperationRecord:
    return operation_record(status_requests_used=1, polls_completed=1, **changes)


def test_a_retry_after_shorter_than_the_local_backoff_is_still_kept_as_the_earliest_allowed_request() -> None:
    record = operation_record(status_requests_used=0, polls_completed=0, last_http_at=None)
    answer = ProviderAnswer(503, {"retry-after": "3"}, b"", received_at=2000.0)
    decided = interpret_status_answer(record, TABLE, answer, rng=SteppedRandom(0.5))
    # The local backoff (8–16 s) decides the schedule, and the provider's 3 s stays a fact of its own.
    assert decided.delay_source == DelaySource.LOCAL_BACKOFF
    assert decided.next_check_at is not None
    assert decided.next_check_at >= 2008.0
    assert decided.not_before_at == 2003.0


def test_the_earliest_allowed_request_never_moves_earlier() -> None:
    assert earliest_allowed(None, received_at=100.0) is None
    assert earliest_allowed(None, received_at=100.0, retry_after=3) == 103.0
    assert earliest_allowed(200.0, received_at=100.0, retry_after=3) == 200.0
    assert earliest_allowed(50.0, received_at=100.0, timed_out_after=10) == 110.0
    assert not_before(90.0, 103.0) == 103.0
    assert not_before(120.0, 103.0) == 120.0
    assert not_before(90.0, None) == 90.0


def test_the_gate_waits_for_the_earliest_allowed_request_whatever_moved_the_next_check() -> None:
    # A webhook, an approval or a reopen set next_check_at to now; the provider said 3 s.
    record = _waiting(next_check_at=2001.0, not_before_at=2003.0)
    early = gate_verdict(record, now=2001.0, wait_until=2001.0, has_table=True, approvals_due=False)
    assert (early.kind, early.allowed_at) == (Verdict.NOT_YET, 2003.0)
    waited = gate_verdict(record, now=2001.0, wait_until=2010.0, has_table=True, approvals_due=False)
    assert (waited.kind, waited.allowed_at) == (Verdict.WAIT, 2003.0)
    assert not may_reserve(record, 2002.9)  # so no fleet slot is booked before it either
    assert may_reserve(record, 2003.0)
    assert gate_verdict(record, now=2003.0, wait_until=2003.0, has_table=True, approvals_due=False).kind == (
        Verdict.RESERVE
    )


def test_an_operator_approval_of_one_request_still_waits_for_the_earliest_allowed_request() -> None:
    record = _waiting(next_check_at=2001.0, not_before_at=2003.0)
    # may_send=True is what an approved request gives the gate: it still may not go early.
    # A caller with wait left holds on (issue 30 item 2), but nothing is reserved before 2003.
    waiting = gate_verdict(record, now=2001.0, wait_until=2002.0, has_table=True, approvals_due=False)
    assert (waiting.kind, waiting.allowed_at) == (Verdict.WAIT, 2003.0)
    decided = gate_verdict(record, now=2002.0, wait_until=2002.0, has_table=True, approvals_due=False)
    assert (decided.kind, decided.allowed_at) == (Verdict.NOT_YET, 2003.0)


def test_an_approved_extension_and_a_reopen_never_schedule_before_the_earliest_allowed_request() -> None:
    exhausted = operation_record(
        status=Status.ESCALATED,
        stop_reason=StopReason.REQUEST_BUDGET_EXHAUSTED,
        last_http_at=2000.0,
        retry_after_seconds=None,  # the last answer's own header said nothing: the fact still holds
        not_before_at=2100.0,
    )
    plan = ExtensionPlan(operation_id="op", allowed=True, extra_seconds=600, extra_status_requests=3)
    changes = extension_changes(exhausted, TABLE, plan, now=2010.0)
    assert (changes["next_check_at"], changes["delay_source"]) == (2100.0, "provider_retry_after")
    refused = operation_record(
        status=Status.ESCALATED, stop_reason=StopReason.AUTHORIZATION_DENIED, not_before_at=2100.0
    )
    assert reopen_next_check_at(refused, 2010.0) == 2100.0


def test_after_a_timeout_the_next_request_waits_the_timeouts_length_again_on_top_of_the_local_backoff() -> (
    None
):
    assert after_timeout(None) == 0.0
    assert after_timeout(10.0) == 10.0
    plain = plan_next_check(now=1000.0, attempt=1, base=5, maximum=120, rng=SteppedRandom(1.0))
    held = plan_next_check(
        now=1000.0, attempt=1, base=5, maximum=120, rng=SteppedRandom(1.0), timed_out_after=10.0
    )
    assert (plain.at, held.at) == (1010.0, 1020.0)
    assert held.delay_source == DelaySource.LOCAL_BACKOFF


def test_a_timed_out_status_request_holds_the_next_one_back_by_its_length_and_records_it() -> None:
    record = operation_record(status_requests_used=1, polls_completed=0, last_http_at=None)
    timed_out = NoAnswer(
        "timeout", "timed out waiting for the provider", 2010.0, sent=True, waited_seconds=10.0
    )
    decided = interpret_status_answer(record, TABLE, timed_out, rng=SteppedRandom(1.0), sent_at=2000.0)
    assert decided.transport_failure
    assert decided.next_check_at == 2010.0 + 10.0 + 16.0  # the timeout's length again, then the backoff
    assert decided.not_before_at == 2020.0
    # A connection that never opened holds nothing back: nothing is in flight at the provider.
    refused = NoAnswer("connection_error", "connection refused or failed", 2010.0, sent=False)
    plain = interpret_status_answer(record, TABLE, refused, rng=SteppedRandom(1.0), sent_at=2000.0)
    assert (plain.next_check_at, plain.not_before_at) == (2026.0, None)
