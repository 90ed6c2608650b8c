"""Stop predicates: what one status answer means for an operation.

`decide_after_response` is a pure function of the record (as reloaded under the
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

from pollwarden.clock import RandomSource
from pollwarden.records import OperationRecord, status_for
from pollwarden.schedule import plan_next_check
from pollwarden.timefmt import iso
from pollwarden_providers.interpret import (
    BodyError,
    HintCheck,
    RejectedHint,
    get_field,
    parse_json_object,
    parse_rate_limit_reset,
    parse_retry_after,
    rate_limited_refusal,
    read_request_id,
    read_status_body,
    truncate_text,
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


@dataclass(frozen=True)
class UnusableAnswer:
    """An answer we refuse to read: too large, badly encoded."""

    status_code: int
    reason: str
    received_at: float


@dataclass(frozen=True)
class Transition:
    """The record's new facts after one status request."""

    status: str
    stop_reason: str | None = None
    stop_detail: str | None = None
    state: str | None = None
    category: str | None = None
    next_check_at: float | None = None
    delay_source: str | None = None
    retry_after_seconds: float | None = None
    transport_failure: bool = False
    rate_limited: bool = False
    http_status: int | None = None
    provider_request_id: str | None = None
    provider_expires_at: float | None = None
    error: str | None = None
    result: dict[str, object] | None = None
    rejected_hints: tuple[RejectedHint, ...] = ()
    note: str | None = None
    location: str | None = None
    extra: dict[str, object] = field(default_factory=dict[str, object])

    @property
    def stopped(self) -> bool:
        """True when this answer ends waiting."""
        return self.status != "waiting"


def _stop(base: Transition, reason: str, detail: str, **facts: object) -> Transition:
    return replace(base, status=status_for(reason), stop_reason=reason, stop_detail=detail, **facts)


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
) -> Transition:
    """Schedule the next check, or stop when the budget or the deadline leaves no room.

    `base.rejected_hints` already holds every rejected hint. A valid poll hint
    that lands at or after the deadline is a suggestion that cannot be honoured:
    it is recorded as ignored and the local backoff is used instead.
    """
    rejected = base.rejected_hints
    deadline = record.effective_deadline
    if poll_hint.seconds is not None and now + poll_hint.seconds >= deadline:
        rejected += (
            RejectedHint(
                poll_hint.source or "poll_after",
                f"{poll_hint.seconds:g} s",
                f"ends after the {record.deadline_name}; local backoff used instead",
            ),
        )
        poll_hint = HintCheck()
    used_after = record.status_requests_used
    if used_after >= record.max_status_requests:
        return replace(
            base,
            status="escalated",
            stop_reason="request_budget_exhausted",
            stop_detail=(
                f"all {record.max_status_requests} status requests are used and the job is not finished"
            ),
            rejected_hints=rejected,
        )
    plan = plan_next_check(
        now=now,
        attempt=record.polls_completed + 1,
        base=table.schedule.base_delay_seconds,
        maximum=table.schedule.max_delay_seconds,
        rng=rng,
        retry_after=retry_after.seconds,
        poll_hint=poll_hint.seconds,
        rate_limited_without_guidance=rate_limited_without_guidance,
    )
    if plan.at >= deadline:
        why = "the provider's Retry-After" if plan.mandatory else "the next allowed check"
        return replace(
            base,
            status="escalated",
            stop_reason="deadline_exceeded",
            stop_detail=(
                f"{why} ends {plan.at - now:.0f} s from now, after the {record.deadline_name}; "
                "no further status request fits inside it"
            ),
            retry_after_seconds=retry_after.seconds,
            rejected_hints=rejected,
        )
    return replace(
        base,
        status="waiting",
        next_check_at=plan.at,
        delay_source=plan.delay_source,
        retry_after_seconds=retry_after.seconds,
        rejected_hints=rejected,
    )


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


def decide_after_response(
    record: OperationRecord,
    table: ProviderTable,
    answer: ProviderAnswer | NoAnswer | UnusableAnswer,
    *,
    rng: RandomSource,
) -> Transition:
    """Apply the documented rule for one status answer (DESIGN §1.11, §1.13)."""
    now = answer.received_at
    max_hint = table.limits.max_deadline_seconds
    limits_note = f"{record.transport_failures_used + 1} of {record.max_transport_failures}"

    if isinstance(answer, NoAnswer):
        base = Transition(status="waiting", transport_failure=True, note=answer.detail)
        if record.transport_failures_used + 1 >= record.max_transport_failures:
            return replace(
                base,
                status="escalated",
                stop_reason="delivery_ambiguous",
                stop_detail=f"no answer ({answer.detail}); transport failures {limits_note}",
            )
        return _keep_waiting(
            record,
            table,
            now=now,
            rng=rng,
            retry_after=HintCheck(),
            poll_hint=HintCheck(),
            rate_limited_without_guidance=False,
            base=base,
        )

    if isinstance(answer, UnusableAnswer):
        unread = Transition(status="waiting", http_status=answer.status_code, note=answer.reason)
        return _stop(
            unread, "integration_failure", f"HTTP {answer.status_code} answer refused: {answer.reason}"
        )

    code = answer.status_code
    headers = answer.headers
    request_id = read_request_id(table, headers)
    retry_after = parse_retry_after(headers.get("retry-after"), now=now, max_seconds=max_hint)
    answered = Transition(
        status="waiting",
        http_status=code,
        provider_request_id=request_id,
        rejected_hints=(retry_after.rejected,) if retry_after.rejected else (),
    )

    if 500 <= code <= 599:  # 600–999 are no HTTP status: integration_failure below
        base = replace(answered, transport_failure=True)
        if record.transport_failures_used + 1 >= record.max_transport_failures:
            return replace(
                base,
                status="escalated",
                stop_reason="delivery_ambiguous",
                stop_detail=f"HTTP {code}; transport failures {limits_note}",
                retry_after_seconds=retry_after.seconds,
            )
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

    limit_signal = rate_limited_refusal(table, headers) if code == 403 else None
    if code in (401, 403) and limit_signal is None:
        return _stop(
            answered,
            "authorization_denied",
            f"HTTP {code}: the provider refused these credentials; a person must check access",
        )

    if code == 429 or limit_signal is not None:
        used = record.rate_limited_used + 1
        base = replace(answered, rate_limited=True)
        if limit_signal is not None:
            base = replace(base, note=f"HTTP 403 {limit_signal}: the provider's rate limit, not a refusal")
        reset_header = table.rate_limit.reset_header
        if retry_after.seconds is None and reset_header is not None:
            reset = parse_rate_limit_reset(headers.get(reset_header.lower()), now=now, max_seconds=max_hint)
            if reset.rejected is not None:
                base = replace(base, rejected_hints=(*base.rejected_hints, reset.rejected))
            retry_after = reset if reset.seconds is not None else retry_after
        if used >= record.max_rate_limited:
            return replace(
                base,
                status="escalated",
                stop_reason="rate_limited",
                stop_detail=f"rate limited {used} times, the last with HTTP {code} (limit {record.max_rate_limited})",
                retry_after_seconds=retry_after.seconds,
            )
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

    if 300 <= code < 400:
        raw_location = headers.get("location")
        location = describe_location(raw_location) if raw_location else None
        return _stop(
            answered,
            "integration_failure",
            f"HTTP {code} redirect, not followed (requests go to {table.origin} only); "
            f"Location {location or '(none)'}",
            location=location,
        )

    if code == 404:
        since_start = now - record.started_at
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
            return _stop(answered, "expired", "HTTP 404 after the provider's retention period")
        return _stop(
            answered,
            "integration_failure",
            f"HTTP 404 for job {record.provider_job_id} {since_start:.0f} s after start, "
            f"outside the {table.not_found.grace_seconds:g} s grace window",
        )

    if not 200 <= code < 300:
        return _stop(answered, "integration_failure", f"unexpected HTTP status {code}")

    try:
        body = parse_json_object(answer.body)
    except BodyError as exc:
        return _stop(answered, "integration_failure", f"unreadable status body: {exc}")

    read = read_status_body(table, body, now=now, max_hint_seconds=max_hint)
    answered = replace(
        answered,
        state=read.state,
        category=read.category,
        provider_expires_at=read.expires_at,
        rejected_hints=answered.rejected_hints + read.rejected_hints,
    )
    if read.state is None:
        return _stop(answered, "integration_failure", f"the body has no {table.response.state_field!r} field")
    if (other_job := answer_about_another_job(table, body, record.provider_job_id)) is not None:
        return _stop(answered, "integration_failure", other_job)
    if read.category == "succeeded":
        if read.missing_fields:
            return _stop(
                answered,
                "integration_failure",
                f"state {read.state!r} without the required field(s) {', '.join(read.missing_fields)}",
            )
        detail = f"state {read.state!r} with every required field"
        return _stop(answered, "succeeded", detail, result=read.result)
    if read.category == "failed":
        return _stop(answered, "provider_failure", f"the provider reported {read.state!r}", error=read.error)
    if read.category == "cancelled":
        return _stop(answered, "cancelled", f"the provider reported {read.state!r}")
    if read.category == "expired":
        return _stop(answered, "expired", f"the provider reported {read.state!r}")
    if read.category == "unknown":
        return _stop(
            answered,
            "unknown_state",
            f"state {read.state!r} is not in the {table.name} state table"
            + (f" ({read.unknown_because})" if read.unknown_because else "")
            + "; it is not safe to keep waiting",
        )
    # pending
    if read.expires_at is not None and now > read.expires_at:
        return _stop(
            answered,
            "integration_failure",
            f"contradiction: the provider still reports {read.state!r} after its own expiry "
            f"{iso(read.expires_at)} ({table.response.expires_at_field})",
        )
    base = answered
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
