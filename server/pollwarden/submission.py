"""Submitting a new job: sent at most once per call, never a second job.

Plain functions over the controller, which owns the store, the HTTP client,
the clock and the random source; start_operation records the operation and
then calls `submit`. Every outcome is persisted under the submission lease:
the job id, a retry time, or a stop with the reason a person reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Protocol

from pollwarden.clock import Clock, RandomSource
from pollwarden.decide import NoAnswer, ProviderAnswer, UnusableAnswer
from pollwarden.provider_http import ProviderHTTP
from pollwarden.records import OperationRecord
from pollwarden.schedule import first_check_at, local_backoff
from pollwarden.store import Store, new_lease_owner
from pollwarden.timefmt import iso
from pollwarden.vocabulary import DelaySource, Status, StopReason, status_for
from pollwarden_providers.interpret import (
    BodyError,
    RejectedHint,
    get_field,
    parse_json_object,
    parse_retry_after,
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


class SubmissionParts(Protocol):
    """What submitting uses of the controller (`Controller` is one).

    Named here rather than imported, because the controller imports this module.
    """

    store: Store
    http: ProviderHTTP
    clock: Clock
    rng: RandomSource

    @property
    def lease_seconds(self) -> float: ...

    async def load(self, operation_id: str) -> OperationRecord: ...


async def submit(
    controller: SubmissionParts, record: OperationRecord, table: ProviderTable
) -> OperationRecord:
    """Send the submission at most once per call, and never create a second job.

    The record, its fingerprint and its idempotency key are on disk before
    anything is sent. The submit request goes out under a lease that only a
    recorded outcome clears, so a lease found without an outcome means a call
    stopped after (perhaps) sending: with an idempotency key the request is
    resent with the same key (the provider answers with the same job);
    without one the operation stops as `delivery_ambiguous` and is never resent.
    """
    assert table.submit is not None
    now = controller.clock.now()
    has_key = bool(table.submit.idempotency_header and record.idempotency_key)
    if record.lease_owner is not None and (record.lease_expires_at or 0.0) > now:
        return record  # another call is sending it right now: never two at once
    if now >= record.effective_deadline:
        return await _stop_submission(
            controller,
            record,
            StopReason.DEADLINE_EXCEEDED,
            f"the {record.deadline_name} {iso(record.effective_deadline)} passed before the provider "
            "accepted the submission; nothing more is sent",
            at=now,
        )
    interrupted = record.lease_owner is not None
    if interrupted and not has_key:
        return await _stop_submission(
            controller,
            record,
            StopReason.DELIVERY_AMBIGUOUS,
            "a call sent (or was about to send) the submission and stopped before recording the answer; "
            "the provider has no idempotency, so the job may or may not exist and it is never resubmitted. "
            "A person checks the provider's console",
            at=now,
        )
    if not interrupted and _submission_failures(record) and now < record.next_check_at:
        return record  # a retry is allowed from next_check_at (stop_detail says when)
    owner = new_lease_owner()
    claimed = await controller.store.claim_submission(
        record.operation_id,
        owner=owner,
        now=now,
        lease_seconds=controller.lease_seconds,
        allow_stale=has_key,
        note=(
            ("resending after an interrupted call, " if interrupted else "")
            + ("with the recorded idempotency key" if has_key else "without idempotency: sent at most once")
        ),
    )
    if claimed is None:
        return await controller.load(record.operation_id)
    assert claimed.submit_payload_json is not None
    payload = json.loads(claimed.submit_payload_json)
    answer = await controller.http.submit(table, payload, claimed.idempotency_key)
    if isinstance(answer, NoAnswer):
        return await _submission_failed(
            controller,
            claimed,
            table,
            owner,
            detail=answer.detail,
            sent=answer.sent,
            has_key=has_key,
            at=answer.received_at,
        )
    if isinstance(answer, UnusableAnswer):
        return await _stop_submission(
            controller,
            claimed,
            StopReason.INTEGRATION_FAILURE,
            f"the submission's HTTP {answer.status_code} answer was refused: {answer.reason}; the job may "
            "exist, a person checks the provider's console",
            at=answer.received_at,
            http_status=answer.status_code,
            owner=owner,
        )
    return await _accept_submission(controller, claimed, table, answer, owner, has_key=has_key)


async def _accept_submission(
    controller: SubmissionParts,
    record: OperationRecord,
    table: ProviderTable,
    answer: ProviderAnswer,
    owner: str,
    *,
    has_key: bool,
) -> OperationRecord:
    """Read the submit answer: a job id from the documented field or a same-origin Location, or a stop."""
    assert table.submit is not None
    now = answer.received_at
    code = answer.status_code
    retry_after = parse_retry_after(
        answer.headers.get("retry-after"), now=now, max_seconds=table.limits.max_deadline_seconds
    )
    rejected = [retry_after.rejected] if retry_after.rejected is not None else []

    async def stop(reason: StopReason, detail: str) -> OperationRecord:
        return await _stop_submission(
            controller, record, reason, detail, at=now, http_status=code, owner=owner, rejected=rejected
        )

    if code in (401, 403):
        return await stop(
            StopReason.AUTHORIZATION_DENIED,
            f"HTTP {code} on submission: the provider refused these credentials; a person must check access",
        )
    if 300 <= code < 400:
        raw_location = answer.headers.get("location")
        return await stop(
            StopReason.INTEGRATION_FAILURE,
            f"HTTP {code} redirect on submission, not followed (requests go to {table.origin} only); "
            f"Location {describe_location(raw_location) if raw_location else '(none)'}",
        )
    if code == 429:
        used = record.rate_limited_used + 1
        if used >= record.max_rate_limited:
            return await _stop_submission(
                controller,
                record,
                StopReason.RATE_LIMITED,
                f"HTTP 429 on submission {used} times (limit {record.max_rate_limited}); nothing was created",
                at=now,
                http_status=code,
                owner=owner,
                rejected=rejected,
                changes={"rate_limited_used": used},
            )
        return await _retry_submission_later(
            controller,
            record,
            table,
            owner,
            at=now,
            changes={"rate_limited_used": used, "last_http_status": code, "last_http_at": now},
            what=f"the provider answered 429 (rate limited, {used} of {record.max_rate_limited})",
            resend="sends it again",
            attempt=used,
            retry_after=retry_after.seconds,
            rejected=rejected,
        )
    if 500 <= code <= 599:  # 600–999 are no HTTP status: integration_failure below
        return await _submission_failed(
            controller,
            record,
            table,
            owner,
            detail=f"HTTP {code}",
            sent=True,
            has_key=has_key,
            at=now,
            http_status=code,
            retry_after=retry_after.seconds,
            rejected=rejected,
        )
    if code not in (200, 201, 202):
        return await stop(
            StopReason.INTEGRATION_FAILURE,
            f"HTTP {code} on submission: not an acceptance (200, 201 or 202); the provider refused the request",
        )

    job_id: str | None = None
    where = ""
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
                job_id, where = str(value), f"body field {field_name}"
            else:
                why_not.append(f"the body field {field_name} is not a usable job id ({problem})")
        elif body is not None:
            why_not.append(f"the body has no {field_name!r} field")
    raw_location = answer.headers.get("location")
    if job_id is None and raw_location:
        try:
            absolute = resolve_location(table, submit_url(table), raw_location)
        except EgressError:
            return await stop(
                StopReason.INTEGRATION_FAILURE,
                f"HTTP {code}: the submission's Location {describe_location(raw_location)} is not on "
                f"{table.origin}; it is never followed or used, and no job id is guessed. The job may exist: "
                "a person checks the provider's console",
            )
        job_id = job_id_from_location(table, absolute)
        if job_id is None:
            why_not.append(
                f"the Location {describe_location(raw_location)} does not match status_path "
                f"{table.status_path}"
            )
        else:
            where = "Location header"
    elif job_id is None:
        why_not.append("there is no Location header")
    if job_id is None:
        return await stop(
            StopReason.INTEGRATION_FAILURE,
            f"HTTP {code}: the submission answer names no job id ({'; '.join(why_not)}); pollwarden never "
            "guesses one. The job may exist: a person checks the provider's console",
        )

    first = first_check_at(
        now, table.schedule.base_delay_seconds, table.schedule.max_delay_seconds, controller.rng
    )
    next_at, source = first, DelaySource.LOCAL_BACKOFF
    if retry_after.seconds is not None and now + retry_after.seconds > first:
        next_at, source = now + retry_after.seconds, DelaySource.PROVIDER_RETRY_AFTER
    updated = await controller.store.finish_submission(
        record.operation_id,
        owner=owner,
        changes={
            "status": Status.WAITING,
            "provider_job_id": job_id,
            "last_http_status": code,
            "last_http_at": now,
            "provider_request_id": read_request_id(table, answer.headers),
            "next_check_at": next_at,
            "delay_source": source,
            "retry_after_seconds": retry_after.seconds,
            "stop_detail": None,
        },
        kind="submitted",
        at=now,
        note=f"HTTP {code}, job id from the {where}",
        payload_extra={"rejected_hints": [h.as_record() for h in rejected]},
    )
    return updated or await controller.load(record.operation_id)


async def _submission_failed(
    controller: SubmissionParts,
    record: OperationRecord,
    table: ProviderTable,
    owner: str,
    *,
    detail: str,
    sent: bool,
    has_key: bool,
    at: float,
    http_status: int | None = None,
    retry_after: float | None = None,
    rejected: list[RejectedHint] | None = None,
) -> OperationRecord:
    """No usable answer to a submit request: a transport failure (or 5xx), counted.

    Sent without idempotency: the job may exist, so stop (`delivery_ambiguous`).
    Otherwise a later start_operation may send it again, until the N-th failure.
    """
    failures = record.transport_failures_used + 1
    counted: dict[str, object] = {"transport_failures_used": failures, "last_http_at": at}
    if http_status is not None:
        counted["last_http_status"] = http_status
    budget = f"transport failures {failures} of {record.max_transport_failures}"
    if sent and not has_key:
        return await _stop_submission(
            controller,
            record,
            StopReason.DELIVERY_AMBIGUOUS,
            f"the submission was sent and got no usable answer ({detail}); the provider has no idempotency, "
            "so the job may or may not exist and it is never resubmitted. A person checks the provider's "
            f"console ({budget})",
            at=at,
            owner=owner,
            changes=counted,
            rejected=rejected,
        )
    if failures >= record.max_transport_failures:
        if sent or has_key:
            reason = StopReason.DELIVERY_AMBIGUOUS
            text = (
                f"no usable answer to {failures} submission attempts (last: {detail}); the job may exist "
                "under the recorded idempotency key. Never resubmitted: a person checks the provider's console"
            )
        else:
            reason = StopReason.INTEGRATION_FAILURE
            text = (
                f"the provider at {table.origin} could not be reached for {failures} submission attempts "
                f"(last: {detail}); nothing was delivered, no job exists. Check that the provider is "
                "reachable, then start a new operation"
            )
        return await _stop_submission(
            controller,
            record,
            reason,
            f"{text} ({budget})",
            at=at,
            owner=owner,
            changes=counted,
            rejected=rejected,
        )
    if sent:
        what = f"the submission got no usable answer ({detail}) and may have reached the provider"
        resend = "resends it with the same idempotency key, so the provider returns the same job"
    else:
        what = f"the submission never left ({detail}); nothing reached the provider"
        resend = "sends it again"
    return await _retry_submission_later(
        controller,
        record,
        table,
        owner,
        at=at,
        changes=counted,
        what=f"{what} ({budget})",
        resend=resend,
        attempt=failures,
        retry_after=retry_after,
        rejected=rejected,
    )


async def _retry_submission_later(
    controller: SubmissionParts,
    record: OperationRecord,
    table: ProviderTable,
    owner: str,
    *,
    at: float,
    changes: Mapping[str, object],
    what: str,
    resend: str,
    attempt: int,
    retry_after: float | None,
    rejected: list[RejectedHint] | None,
) -> OperationRecord:
    """Leave the operation `submitting`, with the earliest time a start_operation call may try again."""
    wait = local_backoff(
        attempt - 1, table.schedule.base_delay_seconds, table.schedule.max_delay_seconds, controller.rng
    )
    source = DelaySource.LOCAL_BACKOFF
    if retry_after is not None and retry_after >= wait:
        wait, source = retry_after, DelaySource.PROVIDER_RETRY_AFTER
    retry_at = at + wait
    detail = (
        f"{what}. Call start_operation again with the same operation_id from {iso(retry_at)}: "
        f"it {resend}; an earlier call sends nothing"
    )
    updated = await controller.store.finish_submission(
        record.operation_id,
        owner=owner,
        changes={
            **changes,
            "next_check_at": retry_at,
            "delay_source": source,
            "retry_after_seconds": retry_after,
            "stop_detail": detail,
        },
        kind="submit_unanswered",
        at=at,
        note=detail,
        payload_extra={"rejected_hints": [h.as_record() for h in rejected or []]},
    )
    return updated or await controller.load(record.operation_id)


async def _stop_submission(
    controller: SubmissionParts,
    record: OperationRecord,
    reason: StopReason,
    detail: str,
    *,
    at: float | None = None,
    http_status: int | None = None,
    owner: str | None = None,
    changes: Mapping[str, object] | None = None,
    rejected: list[RejectedHint] | None = None,
) -> OperationRecord:
    """Stop a submission; with `owner`, also release the lease taken to send it."""
    at = controller.clock.now() if at is None else at
    stop: dict[str, object] = {
        **(changes or {}),
        "status": status_for(reason),
        "stop_reason": reason,
        "stop_detail": detail,
        "stopped_at": at,
    }
    if http_status is not None:
        stop.update(last_http_status=http_status, last_http_at=at)
    # With `owner` the lease taken to send it is released; without one nothing is in flight
    # (checked by the caller) and an interrupted call's stale lease is cleared too.
    updated = await controller.store.finish_submission(
        record.operation_id,
        owner=owner,
        changes=stop,
        kind="stopped",
        at=at,
        note=detail,
        payload_extra={"rejected_hints": [h.as_record() for h in rejected or []]},
    )
    return updated or await controller.load(record.operation_id)


def _submission_failures(record: OperationRecord) -> int:
    """Failed submit attempts so far (only submission moves these counters before a job id exists)."""
    return record.transport_failures_used + record.rate_limited_used
