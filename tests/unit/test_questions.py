"""A denial is an answer (issue 30, item 10): the pure rule on asking a person again."""

from __future__ import annotations

from pollwarden.rules.questions import (
    ASK_AGAIN_AFTER_SECONDS,
    MAX_QUESTIONS_PER_OPERATION,
    Ask,
    OpenQuestion,
    may_ask,
)


def test_the_first_question_may_be_asked() -> None:
    assert may_ask([], [], now=100.0, last_answer_at=50.0).allowed


def test_a_question_still_open_is_answered_with_itself_and_an_expired_one_is_not() -> None:
    open_one = may_ask([Ask(90.0, False)], [OpenQuestion("ap-1", 500.0)], now=100.0, last_answer_at=50.0)
    assert (open_one.allowed, open_one.open_approval_id) == (True, "ap-1")
    expired = may_ask([Ask(90.0, False)], [OpenQuestion("ap-1", 100.0)], now=100.0, last_answer_at=50.0)
    assert expired.open_approval_id is None


def test_after_a_denial_only_a_later_time_or_a_new_provider_answer_lets_the_agent_ask_again() -> None:
    declined = [Ask(100.0, True)]
    refused = may_ask(declined, [], now=101.0, last_answer_at=50.0)
    assert not refused.allowed
    assert refused.again_at == 100.0 + ASK_AGAIN_AFTER_SECONDS
    assert refused.refusal is not None
    assert "a person declined at" in refused.refusal
    assert may_ask(declined, [], now=100.0 + ASK_AGAIN_AFTER_SECONDS, last_answer_at=50.0).allowed
    assert may_ask(declined, [], now=101.0, last_answer_at=100.5).allowed  # the job moved since
    assert may_ask([Ask(100.0, False)], [], now=101.0, last_answer_at=50.0).allowed  # approved, not declined


def test_no_more_than_the_bound_of_questions_is_asked_per_operation_whatever_the_answers() -> None:
    asks = [Ask(float(i), False) for i in range(MAX_QUESTIONS_PER_OPERATION)]
    verdict = may_ask(asks, [], now=10_000.0, last_answer_at=9_999.0)
    assert not verdict.allowed
    assert verdict.again_at is None
    assert verdict.refusal is not None
    assert f"the limit ({MAX_QUESTIONS_PER_OPERATION})" in verdict.refusal
