"""What one submit answer means: a job id, a later retry, or a stop (pure, beside `pollwarden.rules.status_answer`).

`submission_verdict` says whether a call sends the submission at all;
`interpret_submit_answer` reads the provider's answer to it. Both are pure
functions of the record, the table, the time and a random source; the status
code is sorted as `interpret_status_answer` sorts a status answer's
(`pollwarden.rules.status_answer.sort_status`) and every stop is a condition of
`pollwarden.rules.stop`. `pollwarden.flows.submission` does the I/O: it claims the lease,
sends, and writes the `SubmitOutcome` in one guarded transition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pollwarden.core.clock import RandomSource
from pollwarden.core.records import OperationRecord
from pollwarden.core.timefmt import iso
from pollwarden.core.vocabulary import DelaySource, Status, StopReason
from pollwarden.rules import stop
from pollwarden.rules.schedule import earliest_allowed, first_check_at, plan_next_check
from pollwarden.rules.status_answer import (
    NoAnswer,
    ProviderAnswer,
    StatusClass,
    UnusableAnswer,
    header_wait,
    location_shown,
    rate_limit_wait,
    sort_status,
)
from pollwarden.rules.stop import Stop
from pollwarden_providers.interpret import (
    BodyError,
    RejectedHint,
    get_field,
    parse_json_object,
    rate_limited_refusal,
    read_request_id,
)
from pollwarden_providers.request_building import (
    EgressError,
    describe_location,
    job_id_from_location,
    job_id_problem_for,
    resolve_location,
    submit_url,
)
from pollwarden_providers.table import ProviderTable

# A submit answer that accepted the job.
ACCEPTED_CODES = (200, 201, 202)


@dataclass(frozen=True)
class SubmitOutcome:
    """What one submission step decided: the columns to write, the audit event and its note.

    `kind` is the audit event: ``submitted`` (a job id; now waiting),
    ``submit_unanswered`` (still submitting; `next_check_at` is when a call may
    send again) or ``stopped`` (`stop` says why).
    """

    kind: str
    at: float
    changes: dict[str, object]
    note: str
    rejected_hints: tuple[RejectedHint, ...] = ()
    stop: Stop | None = None


@dataclass(frozen=True)
class SendSubmission:
    """Send the submission now, under a lease taken with this note."""

    allow_stale: bool  # with an idempotency key an interrupted call's expired lease may be taken over
    note: str


def _submit_stopped(
    stopped: Stop,
    *,
    at: float,
    http_status: int | None = None,
    changes: Mapping[str, object] | None = None,
    rejected: tuple[RejectedHint, ...] = (),
) -> SubmitOutcome:
    values: dict[str, object] = {
        **(changes or {}),
        "status": stopped.status,
        "stop_reason": stopped.reason,
        "stop_detail": stopped.detail,
        "stopped_at": at,
    }
    if http_status is not None:
        values.update(last_http_status=http_status, last_http_at=at)
    return SubmitOutcome("stopped", at, values, stopped.detail, rejected, stopped)


def has_idempotency(record: OperationRecord, table: ProviderTable) -> bool:
    """Whether a resend reaches the same job: the table names a header and the record holds a key."""
    return bool(table.submit and table.submit.idempotency_header and record.idempotency_key)


def submission_verdict(
    record: OperationRecord, table: ProviderTable, *, now: float
) -> SendSubmission | SubmitOutcome | None:
    """Before sending a submission: send it, stop it, or leave it (None) as it is.

    Left alone while another call holds a live lease (it is sending right now:
    never two at once) or while a retry is not yet allowed (`next_check_at`).
    A lease found without an outcome means a call stopped after (perhaps)
    sending: with an idempotency key it is resent, without one it stops.
    """
    has_key = has_idempotency(record, table)
    if record.lease_owner is not None and (record.lease_expires_at or 0.0) > now:
        return None
    before = "the provider accepted the submission; nothing more is sent"
    interrupted = record.lease_owner is not None
    stopped = stop.deadline_passed(record, now, before=before) or stop.interrupted_without_key(
        interrupted=interrupted, has_key=has_key
    )
    if stopped is not None:
        return _submit_stopped(stopped, at=now)
    if (
        not interrupted
        and record.transport_failures_used + record.rate_limited_used
        and now < record.next_check_at
    ):
        return None  # a retry is allowed from next_check_at (stop_detail says when)
    return SendSubmission(
        allow_stale=has_key,
        note=(
            ("resending after an interrupted call, " if interrupted else "")
            + ("with the recorded idempotency key" if has_key else "without idempotency: sent at most once")
        ),
    )


def interpret_submit_answer(
    record: OperationRecord,
    table: ProviderTable,
    answer: ProviderAnswer | NoAnswer | UnusableAnswer,
    *,
    rng: RandomSource,
) -> SubmitOutcome:
    """What one submit answer means (README "Submitting a job"): a job id, a later retry, or a stop.

    A job id comes from the table's documented field or a same-origin Location,
    never guessed. The status code is sorted as `interpret_status_answer` sorts it.
    """
    assert table.submit is not None
    has_key = has_idempotency(record, table)
    now = answer.received_at
    if isinstance(answer, NoAnswer):
        return _submit_unanswered(
            record, table, rng, detail=answer.detail, sent=answer.sent, has_key=has_key, at=now
        )
    if isinstance(answer, UnusableAnswer):
        refused = Stop(
            StopReason.INTEGRATION_FAILURE,
            f"the submission's HTTP {answer.status_code} answer was refused: {answer.reason}; the job may "
            "exist, a person checks the provider's console",
        )
        return _submit_stopped(refused, at=now, http_status=answer.status_code)

    code = answer.status_code
    retry_after, rejected = header_wait(table, answer.headers, now=now)

    def stopped(why: Stop) -> SubmitOutcome:
        return _submit_stopped(why, at=now, http_status=code, rejected=rejected)

    # A 403 carrying the table's rate-limit signal (GitHub's secondary limit) is a limit, not a refusal,
    # on a submission as on a status request.
    limit_signal = rate_limited_refusal(table, answer.headers, answer.body) if code == 403 else None
    sorted_as = sort_status(code, rate_limit_403=limit_signal is not None)
    if sorted_as == StatusClass.REFUSED:
        return stopped(stop.credentials_refused(code, where=" on submission"))
    if sorted_as == StatusClass.REDIRECT:
        location = location_shown(answer.headers)
        return stopped(stop.redirected(code, origin=table.origin, location=location, where=" on submission"))
    if sorted_as == StatusClass.RATE_LIMITED:
        # The same wait as a rate-limited status request: the reset header, the table's documented minimum,
        # else a markedly longer backoff.
        retry_after, rejected_reset = rate_limit_wait(table, answer.headers, now=now, retry_after=retry_after)
        rejected = (*rejected, *rejected_reset)
        used = stop.rate_limits_counted(record)
        if (used_up := stop.rate_limits_used_up(record, code, on_submission=True)) is not None:
            return _submit_stopped(
                used_up, at=now, http_status=code, changes={"rate_limited_used": used}, rejected=rejected
            )
        return _submit_later(
            record,
            table,
            rng,
            at=now,
            changes={"rate_limited_used": used, "last_http_status": code, "last_http_at": now},
            what=f"the provider answered {code} (rate limited{f', {limit_signal}' if limit_signal else ''}, "
            f"{used} of {record.max_rate_limited})",
            resend="sends it again",
            attempt=used,
            retry_after=retry_after.seconds,
            rejected=rejected,
            rate_limited_without_guidance=retry_after.seconds is None,
        )
    if sorted_as == StatusClass.SERVER_ERROR:
        return _submit_unanswered(
            record,
            table,
            rng,
            detail=f"HTTP {code}",
            sent=True,
            has_key=has_key,
            at=now,
            http_status=code,
            retry_after=retry_after.seconds,
            rejected=rejected,
        )
    if code not in ACCEPTED_CODES:
        return stopped(
            Stop(
                StopReason.INTEGRATION_FAILURE,
                f"HTTP {code} on submission: not an acceptance (200, 201 or 202); the provider refused the request",
            )
        )
    found = _submitted_job_id(table, answer)
    if isinstance(found, Stop):
        return stopped(found)
    job_id, where = found
    job_id = table.canonical_job_id(job_id)  # one job however the provider wrote it ([job_id])
    first = first_check_at(now, table.schedule.base_delay_seconds, table.schedule.max_delay_seconds, rng)
    next_at, source = first, DelaySource.LOCAL_BACKOFF
    if retry_after.seconds is not None and now + retry_after.seconds > first:
        next_at, source = now + retry_after.seconds, DelaySource.PROVIDER_RETRY_AFTER
    changes: dict[str, object] = {
        "status": Status.WAITING,
        "provider_job_id": job_id,
        "last_http_status": code,
        "last_http_at": now,
        "provider_request_id": read_request_id(table, answer.headers),
        "next_check_at": next_at,
        "delay_source": source,
        "retry_after_seconds": retry_after.seconds,
        "not_before_at": earliest_allowed(
            record.not_before_at, received_at=now, retry_after=retry_after.seconds
        ),
        "stop_detail": None,
    }
    return SubmitOutcome("submitted", now, changes, f"HTTP {code}, job id from the {where}", rejected)


def _submitted_job_id(table: ProviderTable, answer: ProviderAnswer) -> tuple[str, str] | Stop:
    """The job id an accepting answer names and where it was found, or why there is none to use."""
    assert table.submit is not None
    code = answer.status_code
    why_not: list[str] = []
    field_name = table.submit.job_id_field
    if field_name is not None:
        try:
            body: dict[str, object] | None = parse_json_object(answer.body)
        except BodyError as exc:
            body = None
            why_not.append(f"the body is unreadable ({exc})")
        value = get_field(body, field_name) if body is not None else None
        if isinstance(value, str | int) and not isinstance(value, bool):
            problem = job_id_problem_for(table, str(value))
            if problem is None:
                return str(value), f"body field {field_name}"
            why_not.append(f"the body field {field_name} is not a usable job id ({problem})")
        elif body is not None:
            why_not.append(f"the body has no {field_name!r} field")
    raw_location = answer.headers.get("location")
    if raw_location:
        try:
            absolute = resolve_location(table, submit_url(table), raw_location)
        except EgressError:
            return Stop(
                StopReason.INTEGRATION_FAILURE,
                f"HTTP {code}: the submission's Location {describe_location(raw_location)} is not on "
                f"{table.origin}; it is never followed or used, and no job id is guessed. The job may exist: "
                "a person checks the provider's console",
            )
        job_id = job_id_from_location(table, absolute)
        if job_id is not None:
            return job_id, "Location header"
        why_not.append(
            f"the Location {describe_location(raw_location)} does not match status_path {table.status_path}"
        )
    else:
        why_not.append("there is no Location header")
    return Stop(
        StopReason.INTEGRATION_FAILURE,
        f"HTTP {code}: the submission answer names no job id ({'; '.join(why_not)}); pollwarden never "
        "guesses one. The job may exist: a person checks the provider's console",
    )


def _submit_unanswered(
    record: OperationRecord,
    table: ProviderTable,
    rng: RandomSource,
    *,
    detail: str,
    sent: bool,
    has_key: bool,
    at: float,
    http_status: int | None = None,
    retry_after: float | None = None,
    rejected: tuple[RejectedHint, ...] = (),
) -> SubmitOutcome:
    """No usable answer to a submit request (a transport failure or a 5xx), counted: a stop or a retry."""
    counted: dict[str, object] = {
        "transport_failures_used": stop.transport_failures_counted(record),
        "last_http_at": at,
    }
    if http_status is not None:
        counted["last_http_status"] = http_status
    ended = stop.submission_unanswered(record, detail=detail, sent=sent, has_key=has_key, origin=table.origin)
    if ended is not None:
        return _submit_stopped(ended, at=at, changes=counted, rejected=rejected)
    if sent:
        what = f"the submission got no usable answer ({detail}) and may have reached the provider"
        resend = "resends it with the same idempotency key, so the provider returns the same job"
    else:
        what = f"the submission never left ({detail}); nothing reached the provider"
        resend = "sends it again"
    return _submit_later(
        record,
        table,
        rng,
        at=at,
        changes=counted,
        what=f"{what} ({stop.transport_failures_note(record)})",
        resend=resend,
        attempt=stop.transport_failures_counted(record),
        retry_after=retry_after,
        rejected=rejected,
    )


def _submit_later(
    record: OperationRecord,
    table: ProviderTable,
    rng: RandomSource,
    *,
    at: float,
    changes: Mapping[str, object],
    what: str,
    resend: str,
    attempt: int,
    retry_after: float | None,
    rejected: tuple[RejectedHint, ...],
    rate_limited_without_guidance: bool = False,
) -> SubmitOutcome:
    """Still submitting, with the earliest time a start_operation call may send again, planned as a
    status request's next check is (`plan_next_check`); a stop when that time is past the deadline."""
    plan = plan_next_check(
        now=at,
        attempt=attempt - 1,
        base=table.schedule.base_delay_seconds,
        maximum=table.schedule.max_delay_seconds,
        rng=rng,
        retry_after=retry_after,
        rate_limited_without_guidance=rate_limited_without_guidance,
        deadline=record.effective_deadline,
    )
    retry_at, source = plan.at, plan.delay_source
    if stop.reaches_deadline(record, retry_at):
        why = "the provider's Retry-After" if plan.mandatory else "the next allowed resend"
        late = Stop(
            StopReason.DEADLINE_EXCEEDED,
            f"{what}; {why} ends {retry_at - at:.0f} s from now, after the {record.deadline_name}: "
            "no resend of the submission fits inside it",
        )
        return _submit_stopped(late, at=at, changes=changes, rejected=rejected)
    detail = (
        f"{what}. Call start_operation again with the same operation_id from {iso(retry_at)}: "
        f"it {resend}; an earlier call sends nothing"
    )
    values = {
        **changes,
        "next_check_at": retry_at,
        "delay_source": source,
        "retry_after_seconds": retry_after,
        "not_before_at": earliest_allowed(None, received_at=at, retry_after=retry_after),
        "stop_detail": detail,
    }
    return SubmitOutcome("submit_unanswered", at, values, detail, rejected)
