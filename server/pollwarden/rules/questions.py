"""A denial is an answer: when a person may be asked again about more time or requests for one operation.

Found by trying it: after a person declined, the agent was told "Allowed next:
request_extension" with no limit, and declined 8 times, the person was asked 8
times; without elicitation, 8 calls left 8 pending approvals for one operation.
The rule, a pure function of what was asked before (`Ask`, read from the
operation's approvals and its audit trail) and the time:

* **One open question per operation.** While a question waits for an operator
  (pending, not expired), asking again returns that question: nothing new is
  recorded or shown to anyone.
* **Asking again after a denial needs something new**: a new answer from the
  provider since the denial (the job moved), or `ASK_AGAIN_AFTER_SECONDS`
  later. A dismissed question counts as declined.
* **A bounded number of questions**: at most `MAX_QUESTIONS_PER_OPERATION`
  per operation, whatever the answers; after that a person takes over.

The agent is told which applies, and when it may ask again, in the refusal and
by `request_extension` leaving its allowed actions until then.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pollwarden.core.timefmt import iso
from pollwarden.core.untrusted import quoted

# At most this many questions about more time or requests are put to a person for one operation.
MAX_QUESTIONS_PER_OPERATION = 3
# After a person declined, the same question may come back this much later (or after a new provider answer).
ASK_AGAIN_AFTER_SECONDS = 900.0
# Audit rows keep times to the millisecond: an answer within it of a denial came before it.
AUDIT_TIME_RESOLUTION = 0.001


@dataclass(frozen=True)
class Ask:
    """One question put to a person about this operation: when, and whether they declined it."""

    at: float
    declined: bool


@dataclass(frozen=True)
class AskVerdict:
    """May a person be asked now: yes; no, with why (`refusal`) and from when (`again_at`); or an open question."""

    allowed: bool
    refusal: str | None = None
    again_at: float | None = None  # None with a refusal: never again (the bound is reached)
    open_approval_id: str | None = None  # a question already waiting: answered with it


@dataclass(frozen=True)
class OpenQuestion:
    """A question waiting for an operator."""

    approval_id: str
    expires_at: float


def may_ask(
    asks: Sequence[Ask],
    open_questions: Iterable[OpenQuestion],
    *,
    now: float,
    last_answer_at: float | None,
) -> AskVerdict:
    """Whether a person may be asked about more time or requests for this operation now (module docstring).

    `asks` are the questions put to a person before (any order); `last_answer_at`
    is when the provider last answered a request for it.
    """
    for question in open_questions:
        if now < question.expires_at:
            return AskVerdict(True, open_approval_id=question.approval_id)
    if len(asks) >= MAX_QUESTIONS_PER_OPERATION:
        return AskVerdict(
            False,
            refusal=f"a person was already asked {len(asks)} times about this operation, the limit "
            f"({MAX_QUESTIONS_PER_OPERATION}); nothing more is asked: a person takes over",
        )
    latest = max(asks, key=lambda a: a.at, default=None)
    if latest is None or not latest.declined:
        return AskVerdict(True)
    again_at = latest.at + ASK_AGAIN_AFTER_SECONDS
    job_moved = last_answer_at is not None and last_answer_at > latest.at + AUDIT_TIME_RESOLUTION
    if now >= again_at or job_moved:
        return AskVerdict(True)
    return AskVerdict(
        False,
        refusal=f"a person declined at {iso(latest.at)}, and a denial is an answer: ask again only with "
        f"something new — a new answer from the provider, or from {iso(again_at)} "
        f"({len(asks)} of {MAX_QUESTIONS_PER_OPERATION} questions asked for this operation)",
        again_at=again_at,
    )


def open_question_message(approval_id: str, expires_at: float) -> str:
    """What the agent is told when it asks while a question already waits for an operator."""
    return (
        f"A question about this operation already waits for an operator as approval {quoted(approval_id)} "
        f"(until {iso(expires_at)}); nothing new was asked. Call check_status once after the operator decided: "
        "it applies the decision. Do not ask again or poll in between."
    )
