"""Stop predicates: what one status answer means for an operation.

`interpret_status_answer` is a pure function of the record (as reloaded under the
lease, with this request already counted), the provider's answer, the time and
a random source. It returns a `Transition` that the store applies in one
transaction. Nothing in a provider answer can change a budget, a deadline or an
approval: only counters, the observed state and the next check time move.

Hints (`Retry-After` on any status code, a body's poll hint) are validated
first; every rejected one is carried on the transition, whatever the answer
turns out to mean, so the audit records what was ignored and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from pollwarden.core.clock import RandomSource
from pollwarden.core.records import OperationRecord
from pollwarden.core.timefmt import iso
from pollwarden.core.vocabulary import Category, DelaySource, Status, StopReason, status_for
from pollwarden.rules import stop
from pollwarden.rules.job_identity import terminal_state_mismatch
from pollwarden.rules.schedule import earliest_allowed, plan_next_check
from pollwarden.rules.stop import Stop
from pollwarden_providers.interpret import (
    BodyError,
    HintCheck,
    RejectedHint,
    StatusBody,
    get_field,
    longest_wait,
    outcome_from_counts,
    parse_json_object,
    parse_rate_limit_reset,
    parse_retry_after,
    parse_retry_after_ms,
    rate_limit_phrase,
    rate_limited_refusal,
    read_fields,
    read_request_id,
    read_status_body,
    reset_applies,
    truncate_text,
    where_person_acts,
)
from pollwarden_providers.request_building import describe_location, repeated_job_id
from pollwarden_providers.table import ProviderTable


@dataclass(frozen=True)
class ProviderAnswer:
    """An HTTP answer from the provider, body already capped and decompressed."""

    status_code: int
    headers: Mapping[str, str]  # lower-cased names
    body: bytes
    received_at: float


@dataclass(frozen=True)
class NoAnswer:
    """A transport failure: timeout, connection error, a body that never finished."""

    kind: str
    detail: str
    received_at: float
    # False only when the request provably never left (connection refused):
    # a submission may then be retried without risk of a second job.
    sent: bool = True
    # A timeout's length: how long the request was waited for before it was given up (the limit that fired).
    waited_seconds: float | None = None


@dataclass(frozen=True)
class UnusableAnswer:
    """An answer we refuse to read: too large, badly encoded."""

    status_code: int
    reason: str
    received_at: float


@dataclass(frozen=True)
class Transition:
    """The record's new facts after one status request."""

    status: Status
    stop_reason: StopReason | None = None
    stop_detail: str | None = None
    state: str | None = None
    category: Category | None = None
    next_check_at: float | None = None
    delay_source: DelaySource | None = None
    retry_after_seconds: float | None = None
    # The operation's earliest allowed request time after this answer (schedule.earliest_allowed).
    not_before_at: float | None = None
    transport_failure: bool = False
    rate_limited: bool = False
    http_status: int | None = None
    provider_request_id: str | None = None
    provider_expires_at: float | None = None
    error: str | None = None
    # Validated result fields: a success's, or those the table documents for another end state.
    result: dict[str, object] | None = None
    # The provider's request counts ([counts]), on any answer that reports them.
    counts: dict[str, int] | None = None
    rejected_hints: tuple[RejectedHint, ...] = ()
    note: str | None = None
    location: str | None = None
    extra: dict[str, object] = field(default_factory=dict[str, object])

    @property
    def stopped(self) -> bool:
        """True when this answer ends waiting."""
        return self.status != Status.WAITING


class StatusClass(StrEnum):
    """What a status or submit answer's HTTP status code says before its body is read."""

    SERVER_ERROR = "server_error"  # 500–599: counted as a transport failure
    REFUSED = "refused"  # 401, or a 403 that is not the provider's rate limit
    RATE_LIMITED = "rate_limited"  # 429, or a 403 the table documents as its rate limit
    REDIRECT = "redirect"  # 3xx: never followed
    NOT_FOUND = "not_found"  # 404
    SUCCESS = "success"  # 2xx: the body is read
    OTHER = "other"  # anything else, including 600–999 (no HTTP status)


def sort_status(code: int, *, rate_limit_403: bool = False) -> StatusClass:
    """Sort an HTTP status code; `rate_limit_403` says a 403 carries the table's rate-limit signal."""
    if 500 <= code <= 599:
        return StatusClass.SERVER_ERROR
    if code == 429 or (code == 403 and rate_limit_403):
        return StatusClass.RATE_LIMITED
    if code in (401, 403):
        return StatusClass.REFUSED
    if 300 <= code < 400:
        return StatusClass.REDIRECT
    if code == 404:
        return StatusClass.NOT_FOUND
    if 200 <= code < 300:
        return StatusClass.SUCCESS
    return StatusClass.OTHER


def location_shown(headers: Mapping[str, str]) -> str | None:
    """The Location header as it may be shown (never followed), or None."""
    raw = headers.get("location")
    return describe_location(raw) if raw else None


def _stop(base: Transition, reason: StopReason, detail: str, **facts: object) -> Transition:
    return replace(base, status=status_for(reason), stop_reason=reason, stop_detail=detail, **facts)


def _halt(base: Transition, stopped: Stop, **facts: object) -> Transition:
    """`base` stopped as `stopped` (a condition of `pollwarden.rules.stop`) says."""
    return _stop(base, stopped.reason, stopped.detail, **facts)


def _keep_waiting(
    record: OperationRecord,
    table: ProviderTable,
    *,
    now: float,
    rng: RandomSource,
    retry_after: HintCheck,
    poll_hint: HintCheck,
    rate_limited_without_guidance: bool,
    base: Transition,
    timed_out_after: float | None = None,
) -> Transition:
    """Schedule the next check, or stop when the budget or the deadline leaves no room.

    `base.rejected_hints` already holds every rejected hint. A valid poll hint
    that lands at or after the deadline is honoured up to it (DESIGN §1.7): the
    next check is planned at the deadline, where waiting stops unless a webhook
    wakes the operation first; the provider is never polled sooner than it asked.
    """
    rejected = base.rejected_hints
    if (used := stop.budget_used(record, unfinished=True)) is not None:
        # Retry-After kept so that an approved extension still waits for it (a minimum; README
        # "How a check decides").
        return _halt(base, used, retry_after_seconds=retry_after.seconds, rejected_hints=rejected)
    plan = plan_next_check(
        now=now,
        attempt=record.polls_completed + 1,
        base=table.schedule.base_delay_seconds,
        maximum=table.schedule.max_delay_seconds,
        rng=rng,
        retry_after=retry_after.seconds,
        poll_hint=poll_hint.seconds,
        rate_limited_without_guidance=rate_limited_without_guidance,
        deadline=record.effective_deadline,
        timed_out_after=timed_out_after,
    )
    if plan.until_deadline:  # a hint honoured up to the deadline, unless the answer came after it
        late = stop.deadline_passed(record, now, before="this answer")
    else:
        late = stop.no_check_fits(record, now, plan.at, mandatory=plan.mandatory)
    if late is not None:
        return _halt(base, late, retry_after_seconds=retry_after.seconds, rejected_hints=rejected)
    return replace(
        base,
        status=Status.WAITING,
        next_check_at=plan.at,
        delay_source=plan.delay_source,
        retry_after_seconds=retry_after.seconds,
        rejected_hints=rejected,
    )


def header_wait(
    table: ProviderTable, headers: Mapping[str, str], *, now: float
) -> tuple[HintCheck, tuple[RejectedHint, ...]]:
    """The longest valid wait an answer's headers ask for (`Retry-After`, and the table's milliseconds
    header), and the values rejected (a status answer's and a submission's alike)."""
    max_hint = table.limits.max_deadline_seconds
    waits = [parse_retry_after(headers.get("retry-after"), now=now, max_seconds=max_hint)]
    if (ms_header := table.response.retry_after_ms_header) is not None:
        waits.append(parse_retry_after_ms(headers.get(ms_header.lower()), max_seconds=max_hint))
    return longest_wait(*waits), tuple(w.rejected for w in waits if w.rejected is not None)


def rate_limit_wait(
    table: ProviderTable, headers: Mapping[str, str], *, now: float, retry_after: HintCheck
) -> tuple[HintCheck, tuple[RejectedHint, ...]]:
    """The wait a rate-limited answer asks for: `retry_after` (its headers'), else the table's reset
    header where it applies, else the table's documented shortest wait (GitHub: "at least one
    minute"); and the reset value rejected, if any. No wait at all: the caller backs off markedly."""
    rejected: tuple[RejectedHint, ...] = ()
    reset_header = table.rate_limit.reset_header
    if retry_after.seconds is None and reset_header is not None and reset_applies(table, headers):
        max_hint = table.limits.max_deadline_seconds
        reset = parse_rate_limit_reset(headers.get(reset_header.lower()), now=now, max_seconds=max_hint)
        rejected = () if reset.rejected is None else (reset.rejected,)
        retry_after = reset if reset.seconds is not None else retry_after
    minimum = table.rate_limit.min_wait_seconds
    if retry_after.seconds is None and minimum is not None:
        retry_after = HintCheck(seconds=minimum, source="rate_limit_minimum")
    return retry_after, rejected


def answer_about_another_job(
    table: ProviderTable, body: Mapping[str, object], job_id: str | None
) -> str | None:
    """Why a status body is not about `job_id` (its `response.job_id_field` names another), or None.

    For a multi-part job id the body repeats the last part (GitHub's run id).
    A body without the field says nothing either way.
    """
    name = table.response.job_id_field
    value = get_field(body, name) if name is not None and job_id is not None else None
    if value is None or job_id is None:
        return None
    expected = repeated_job_id(table, job_id)
    if isinstance(value, str | int) and not isinstance(value, bool) and str(value) == expected:
        return None
    return f"the status body is about job {truncate_text(value, 80)!r} ({name}), not {expected!r}"


_STOP_FOR_END: dict[str, StopReason] = {
    "failed": StopReason.PROVIDER_FAILURE,
    "cancelled": StopReason.CANCELLED,
    "expired": StopReason.EXPIRED,
}


def _end_state(
    table: ProviderTable,
    body: Mapping[str, object],
    read: StatusBody,
    answered: Transition,
    category: str,
    detail: str,
    extra_fields: tuple[str, ...] = (),
) -> Transition:
    """Stop in an end state other than success, keeping the result fields the table documents for it.

    A kept field that does not validate is left out and named in the detail.
    """
    names = tuple(dict.fromkeys((*extra_fields, *table.results.of(category))))
    kept = read_fields(table, body, names)
    if kept.values:
        detail += f"; {', '.join(kept.values)} kept for fetch_result"
    if kept.invalid:
        detail += f"; ignored {'; '.join(kept.invalid)}"
    error = read.error if category == "failed" else None
    return _stop(answered, _STOP_FOR_END[category], detail, error=error, result=kept.values or None)


def _after_success(
    table: ProviderTable, body: Mapping[str, object], read: StatusBody, answered: Transition
) -> Transition:
    """A success state: succeeded only with every required field valid, else what it really is.

    A required field present but invalid is an integration failure naming it.
    Counts showing no request succeeded make it the end state they show. A
    missing required field with a documented failure field present is the
    provider's failure (every request failed); without one it is a contradiction.
    """
    if read.invalid_fields:
        return _stop(
            answered,
            StopReason.INTEGRATION_FAILURE,
            f"state {read.state!r} with an invalid result field: {'; '.join(read.invalid_fields)}",
        )
    implied = outcome_from_counts(read.counts)
    if implied is not None:
        shown = ", ".join(f"{name} {count}" for name, count in read.counts.items())
        return _end_state(
            table,
            body,
            read,
            answered,
            implied,
            f"state {read.state!r} but no request succeeded ({shown})",
            extra_fields=table.success.failure_fields if implied == "failed" else (),
        )
    if read.missing_fields:
        failure = read_fields(table, body, table.success.failure_fields)
        # Counts saying some requests succeeded contradict "every request failed".
        if failure.values and not read.counts.get("succeeded"):
            return _end_state(
                table,
                body,
                read,
                answered,
                "failed",
                f"state {read.state!r} without {', '.join(read.missing_fields)} but with "
                f"{', '.join(failure.values)}: the provider reports that every request failed",
                extra_fields=table.success.failure_fields,
            )
        return _stop(
            answered,
            StopReason.INTEGRATION_FAILURE,
            f"state {read.state!r} without the required field(s) {', '.join(read.missing_fields)}",
        )
    detail = f"state {read.state!r} with every required field"
    return _stop(answered, StopReason.SUCCEEDED, detail, result=read.result)


def _person_must_act(table: ProviderTable, state: str | None, job_id: str | None) -> str:
    """The stop detail of an ``awaiting_review`` state: a person must act at the provider, and where."""
    return f"state {state!r}: a person must act at the provider: {where_person_acts(table, state, job_id)}"


def timed_out_after(
    answer: ProviderAnswer | NoAnswer | UnusableAnswer, sent_at: float | None
) -> float | None:
    """How long a request that timed out was waited for (its answer may still be in work), or None."""
    if not (isinstance(answer, NoAnswer) and answer.sent and answer.kind in ("timeout", "response_too_slow")):
        return None
    measured = answer.received_at - sent_at if sent_at is not None else 0.0
    return max(0.0, measured, answer.waited_seconds or 0.0)


def interpret_status_answer(
    record: OperationRecord,
    table: ProviderTable,
    answer: ProviderAnswer | NoAnswer | UnusableAnswer,
    *,
    rng: RandomSource,
    sent_at: float | None = None,
) -> Transition:
    """Apply the documented rule for one status answer (README "How a check decides", "Stop reasons").

    `sent_at` is when the request went out: after a timeout, the next one waits
    at least as long again. The transition carries the operation's earliest
    allowed request time (`not_before_at`), which no other path goes before.
    """
    timed_out = timed_out_after(answer, sent_at)
    decided = _interpret(record, table, answer, rng=rng, timed_out=timed_out)
    not_before_at = earliest_allowed(
        record.not_before_at,
        received_at=answer.received_at,
        retry_after=decided.retry_after_seconds,
        timed_out_after=timed_out,
    )
    return replace(decided, not_before_at=not_before_at)


def _interpret(
    record: OperationRecord,
    table: ProviderTable,
    answer: ProviderAnswer | NoAnswer | UnusableAnswer,
    *,
    rng: RandomSource,
    timed_out: float | None,
) -> Transition:
    now = answer.received_at
    max_hint = table.limits.max_deadline_seconds

    if isinstance(answer, NoAnswer):
        base = Transition(status=Status.WAITING, transport_failure=True, note=answer.detail)
        failure = stop.StatusReadFailure.NO_ANSWER if answer.sent else stop.StatusReadFailure.UNREACHABLE
        if (used_up := stop.transport_failures_used_up(record, answer.detail, failure)) is not None:
            return _halt(base, used_up)
        return _keep_waiting(
            record,
            table,
            now=now,
            rng=rng,
            retry_after=HintCheck(),
            poll_hint=HintCheck(),
            rate_limited_without_guidance=False,
            base=base,
            timed_out_after=timed_out,
        )

    if isinstance(answer, UnusableAnswer):
        unread = Transition(status=Status.WAITING, http_status=answer.status_code, note=answer.reason)
        return _stop(
            unread,
            StopReason.INTEGRATION_FAILURE,
            f"HTTP {answer.status_code} answer refused: {answer.reason}",
        )

    code = answer.status_code
    headers = answer.headers
    request_id = read_request_id(table, headers)
    retry_after, rejected_waits = header_wait(table, headers, now=now)
    answered = Transition(
        status=Status.WAITING,
        http_status=code,
        provider_request_id=request_id,
        rejected_hints=rejected_waits,
    )

    limit_signal = rate_limited_refusal(table, headers, answer.body) if code == 403 else None
    sorted_as = sort_status(code, rate_limit_403=limit_signal is not None)
    if sorted_as == StatusClass.SERVER_ERROR:
        base = replace(answered, transport_failure=True)
        used_up = stop.transport_failures_used_up(record, f"HTTP {code}", stop.StatusReadFailure.SERVER_ERROR)
        if used_up is not None:
            return _halt(base, used_up, retry_after_seconds=retry_after.seconds)
        return _keep_waiting(
            record,
            table,
            now=now,
            rng=rng,
            retry_after=retry_after,
            poll_hint=HintCheck(),
            rate_limited_without_guidance=False,
            base=base,
        )

    if sorted_as == StatusClass.REFUSED:
        return _halt(answered, stop.credentials_refused(code))

    if sorted_as == StatusClass.RATE_LIMITED:
        base = replace(answered, rate_limited=True)
        if limit_signal is not None:
            base = replace(base, note=f"HTTP 403 {limit_signal}: the provider's rate limit, not a refusal")
        elif code == 429 and (phrase := rate_limit_phrase(table, answer.body)) is not None:
            base = replace(base, note=f"HTTP 429 whose {table.rate_limit.body_field} says {phrase!r}")
        retry_after, rejected_reset = rate_limit_wait(table, headers, now=now, retry_after=retry_after)
        base = replace(base, rejected_hints=(*base.rejected_hints, *rejected_reset))
        if (used_up := stop.rate_limits_used_up(record, code)) is not None:
            return _halt(base, used_up, retry_after_seconds=retry_after.seconds)
        return _keep_waiting(
            record,
            table,
            now=now,
            rng=rng,
            retry_after=retry_after,
            poll_hint=HintCheck(),
            rate_limited_without_guidance=retry_after.seconds is None,
            base=base,
        )

    if sorted_as == StatusClass.REDIRECT:
        location = location_shown(headers)
        return _halt(
            answered, stop.redirected(code, origin=table.origin, location=location), location=location
        )

    if sorted_as == StatusClass.NOT_FOUND:
        # A job pollwarden submitted exists from the submission that created it, however long the earlier
        # attempts (a 503, a 429) took: the grace for eventual consistency counts from then.
        submitted = record.submit_sent_at is not None
        since_start = now - (
            record.submit_sent_at if record.submit_sent_at is not None else record.started_at
        )
        retention = table.not_found.retention_seconds
        if since_start < table.not_found.grace_seconds:
            base = replace(answered, note="404 inside the not-found grace window")
            return _keep_waiting(
                record,
                table,
                now=now,
                rng=rng,
                retry_after=retry_after,
                poll_hint=HintCheck(),
                rate_limited_without_guidance=False,
                base=base,
            )
        if retention is not None and since_start >= retention:
            return _stop(answered, StopReason.EXPIRED, "HTTP 404 after the provider's retention period")
        return _stop(
            answered,
            StopReason.INTEGRATION_FAILURE,
            f"HTTP 404 for job {record.provider_job_id} {since_start:.0f} s after "
            f"{'its submission was sent' if submitted else 'start'}, "
            f"outside the {table.not_found.grace_seconds:g} s grace window",
        )

    if sorted_as != StatusClass.SUCCESS:
        return _stop(answered, StopReason.INTEGRATION_FAILURE, f"unexpected HTTP status {code}")

    try:
        body = parse_json_object(answer.body)
    except BodyError as exc:
        return _stop(answered, StopReason.INTEGRATION_FAILURE, f"unreadable status body: {exc}")

    read = read_status_body(table, body, now=now, max_hint_seconds=max_hint)
    answered = replace(
        answered,
        state=read.state,
        category=read.category,
        provider_expires_at=read.expires_at,
        counts=read.counts or None,
        rejected_hints=answered.rejected_hints + read.rejected_hints,
    )
    if read.state is None:
        return _stop(
            answered, StopReason.INTEGRATION_FAILURE, f"the body has no {table.response.state_field!r} field"
        )
    if (other_job := answer_about_another_job(table, body, record.provider_job_id)) is not None:
        return _stop(answered, StopReason.INTEGRATION_FAILURE, other_job)
    changed = terminal_state_mismatch(record.expected_terminal_state, table, read.state, read.category)
    if changed is not None:
        return _stop(answered, StopReason.INTEGRATION_FAILURE, changed)
    if read.category == "succeeded":
        return _after_success(table, body, read, answered)
    if read.category in ("failed", "cancelled", "expired"):
        return _end_state(table, body, read, answered, read.category, f"the provider reported {read.state!r}")
    if read.category == "awaiting_review":
        return _stop(
            answered, StopReason.AWAITING_REVIEW, _person_must_act(table, read.state, record.provider_job_id)
        )
    if read.category == "unknown":
        return _stop(
            answered,
            StopReason.UNKNOWN_STATE,
            f"state {read.state!r} is not in the {table.name} state table"
            + (f" ({read.unknown_because})" if read.unknown_because else "")
            + "; it is not safe to keep waiting",
        )
    # pending
    base = answered
    if read.expires_at is not None and now > read.expires_at:
        expiry = table.expiry
        if read.state in expiry.states_after_expiry:
            base = replace(
                base, note=f"{read.state!r} after the expiry {iso(read.expires_at)}: documented to end later"
            )
        elif now > read.expires_at + expiry.grace_seconds:
            grace = f" and its {expiry.grace_seconds:g} s grace" if expiry.grace_seconds else ""
            return _stop(
                answered,
                StopReason.INTEGRATION_FAILURE,
                f"contradiction: the provider still reports {read.state!r} after its own expiry "
                f"{iso(read.expires_at)} ({table.response.expires_at_field}){grace}",
            )
        else:
            base = replace(
                base, note=f"{read.state!r} after the expiry {iso(read.expires_at)}, within the grace"
            )
    if read.expires_at_rejected:
        base = replace(base, note=f"ignored {read.expires_at_rejected}")
    return _keep_waiting(
        record,
        table,
        now=now,
        rng=rng,
        retry_after=retry_after,
        poll_hint=read.poll_hint,
        rate_limited_without_guidance=False,
        base=base,
    )
