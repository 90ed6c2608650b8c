"""start_operation: record a new operation before any status request, or return the one already there.

Checks what an agent gives (ids, the payload, deadlines, budgets) before anything is stored; a
payload that ended before is held for a person (`resubmission`); a job another operation tracks
is answered with that operation (`job_identity`); a new job is sent once (`submission`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import unicodedata
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pollwarden.audit.chain import REKEY_OPERATION
from pollwarden.core.errors import InvalidRequest, OperationConflict
from pollwarden.core.untrusted import shown
from pollwarden.core.vocabulary import DelaySource, Status
from pollwarden.flows import resubmission, submission
from pollwarden.flows.approval_flow import NOT_ASKED, Answer
from pollwarden.rules import stop
from pollwarden.rules.business_deadline import business_deadline
from pollwarden.rules.job_identity import (
    account_context_of,
    expected_terminal_state_of,
    fingerprint,
    tracked_by_another_principal,
)
from pollwarden.rules.schedule import deadline_too_short, first_check_at
from pollwarden.surface.views import OperationView

if TYPE_CHECKING:
    from pollwarden.flows.controller import Controller
from pollwarden_providers.request_building import (
    MAX_JOB_ID_LENGTH,
    MissingCredentialError,
    job_id_form,
    job_id_problem_for,
)

log = logging.getLogger("pollwarden")

# An idempotency key travels in a header: visible ASCII only, so it cannot inject one.
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# A submission payload is stored and sent as JSON; larger inputs belong behind a reference.
MAX_SUBMIT_BYTES = 256 * 1024
# Caller-chosen ids are stored, shown to people and put in resource URIs.
MAX_OPERATION_ID_LENGTH = 200


def invisible_text_problem(value: str) -> str | None:
    """Why an id cannot hold this text, or None: ids are stored, shown to people and sent in URLs."""
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value):
        return f"must not contain control or invisible format characters (got {shown(value)})"
    return None


def operation_id_problem(value: str) -> str | None:
    """Why a caller-chosen operation id cannot be used, or None."""
    if not value.strip() or len(value) > MAX_OPERATION_ID_LENGTH:
        return (
            f"must be 1 to {MAX_OPERATION_ID_LENGTH} characters, not blank (got {shown(value)}), "
            "e.g. 'report-2025-04-18-01'"
        )
    if value == REKEY_OPERATION:
        return (
            f"must not be {shown(value)}: the audit's own rows carry that id; choose an id such as "
            "'report-2025-04-18-01'"
        )
    if value.startswith("@"):
        return (
            f"must not start with '@' (got {shown(value)}): that form is how pollwarden names another "
            "principal's operations; choose an id such as 'report-2025-04-18-01'"
        )
    return invisible_text_problem(value)


async def start_operation(
    controller: Controller,
    *,
    provider: str,
    operation_id: str | None = None,
    provider_job_id: str | None = None,
    submit: Mapping[str, Any] | None = None,
    deadline_seconds: float | None = None,
    business_deadline_at: str | None = None,
    max_status_requests: int | None = None,
    idempotency_key: str | None = None,
    resubmission_answer: Answer = NOT_ASKED,
    owner: str = "local",
    stored_id: Callable[[str], str] | None = None,
) -> OperationView:
    """Record a new operation before any status request (or return the existing one).

    A payload whose earlier operation ended or escalated is recorded held:
    nothing is sent until a person approves (`resubmission_answer`, or an
    operator's decision found by `resubmission.clear`).

    `owner` is the principal it belongs to; `stored_id` maps the chosen id to the stored one
    (`pollwarden.access.ownership.stored_id`).
    """
    if operation_id is not None and (problem := operation_id_problem(operation_id)) is not None:
        raise InvalidRequest(f"operation_id {problem}")
    if provider_job_id is not None and (problem := invisible_text_problem(provider_job_id)) is not None:
        raise InvalidRequest(f"provider_job_id {problem}")
    table = controller.table_for(provider)
    if (provider_job_id is None) == (submit is None):
        raise InvalidRequest(
            "give exactly one of provider_job_id (track a job that already exists) or submit "
            "(a JSON object to submit as a new job)"
        )
    if provider_job_id is not None and (problem := job_id_problem_for(table, provider_job_id)) is not None:
        raise InvalidRequest(
            f"provider_job_id cannot be used: {problem}; pass the provider's job id exactly as "
            f"{job_id_form(table)}, 1 to {MAX_JOB_ID_LENGTH} characters"
        )
    if provider_job_id is not None:
        # Kept and compared in the table's canonical form ([job_id]): Octo-Org/Hello/042 is octo-org/hello/42.
        provider_job_id = table.canonical_job_id(provider_job_id)
    if submit is not None and table.submit is None:
        raise InvalidRequest(
            f"provider {provider!r} has no [submit] section, so pollwarden cannot submit to it; "
            "submit the job yourself and pass provider_job_id"
        )
    try:
        controller.http.credentials(table)
    except MissingCredentialError as exc:
        raise InvalidRequest(str(exc)) from exc

    limits = table.limits
    if deadline_seconds is None:
        deadline_seconds = limits.default_deadline_seconds
    if not (math.isfinite(deadline_seconds) and 0 < deadline_seconds <= limits.max_deadline_seconds):
        raise InvalidRequest(
            f"deadline_seconds must be more than 0 and at most {limits.max_deadline_seconds:g} "
            f"(the {provider} table's max_deadline_seconds); a longer wait needs request_extension later"
        )
    if max_status_requests is None:
        max_status_requests = limits.default_max_status_requests
    if not 0 < max_status_requests <= limits.max_status_requests:
        raise InvalidRequest(
            f"max_status_requests must be 1 to {limits.max_status_requests} "
            f"(the {provider} table's max_status_requests)"
        )
    now = controller.clock.now()
    business_at: float | None = None
    if business_deadline_at is not None:
        business_at = business_deadline(business_deadline_at, now=now)
    for name, seconds in (
        ("deadline_seconds", deadline_seconds),
        ("business_deadline_at", None if business_at is None else business_at - now),
    ):
        too_short = (
            None
            if seconds is None
            else deadline_too_short(
                name,
                seconds,
                base=table.schedule.base_delay_seconds,
                maximum=table.schedule.max_delay_seconds,
            )
        )
        if too_short is not None:
            raise InvalidRequest(too_short)
    if idempotency_key is not None and (
        submit is None or not table.submit or not table.submit.idempotency_header
    ):
        raise InvalidRequest(
            "idempotency_key only applies to submit on a provider whose table names an idempotency_header"
        )
    if idempotency_key is not None and not _IDEMPOTENCY_KEY.fullmatch(idempotency_key):
        raise InvalidRequest(
            "idempotency_key must be 1 to 255 visible ASCII characters without spaces, "
            "e.g. 'report-2025-04-18-01'"
        )
    if submit is not None and len(json.dumps(submit, default=str)) > MAX_SUBMIT_BYTES:
        raise InvalidRequest(
            f"submit is larger than {MAX_SUBMIT_BYTES} bytes as JSON; pass a reference to large inputs"
        )

    account = account_context_of(table)
    payload: object = dict(submit) if submit is not None else {"provider_job_id": provider_job_id}
    try:
        request_fingerprint = fingerprint(provider, account, payload)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"submit must be a JSON object of plain values: {exc}") from exc
    earlier = (
        await resubmission.earlier_outcome(
            controller.store,
            request_fingerprint,
            exclude=stored_id(operation_id) if stored_id is not None and operation_id else operation_id,
        )
        if submit is not None
        else None
    )
    if operation_id is None:
        operation_id = (
            resubmission.held_operation_id(provider, request_fingerprint, earlier)
            if earlier is not None
            else f"{provider}-{uuid.uuid4().hex[:12]}"
        )

    key = None
    if submit is not None and table.submit is not None and table.submit.idempotency_header:
        key = idempotency_key or f"pw-{uuid.uuid4()}"
    name, operation_id = (
        operation_id,
        (stored_id(operation_id) if stored_id is not None else operation_id),
    )
    values: dict[str, object] = {
        "operation_id": operation_id,
        "owner": owner,
        "provider": provider,
        "provider_job_id": provider_job_id,
        "account_context": account,
        "request_fingerprint": request_fingerprint,
        "idempotency_key": key,
        "expected_terminal_state": expected_terminal_state_of(table),
        "status": Status.WAITING if submit is None else Status.SUBMITTING,
        "started_at": now,
        "deadline_at": now + deadline_seconds,
        "business_deadline_at": business_at,
        "max_status_requests": max_status_requests,
        "max_transport_failures": limits.max_transport_failures,
        "max_rate_limited": limits.max_rate_limited,
        "next_check_at": first_check_at(
            now, table.schedule.base_delay_seconds, table.schedule.max_delay_seconds, controller.rng
        ),
        "delay_source": DelaySource.LOCAL_BACKOFF,
        "submit_payload_json": json.dumps(submit, sort_keys=True) if submit is not None else None,
        "created_at": now,
        "updated_at": now,
        "resubmission_of": earlier.operation_id if earlier is not None else None,
    }
    record, created = await controller.store.create_operation(
        values, kind="tracking" if submit is None else "submission_recorded", at=now
    )
    if not created and record.operation_id != operation_id and record.owner != owner:
        # One job, one budget across principals (issue 30): told that it is tracked, never by which operation.
        raise OperationConflict(tracked_by_another_principal(name))
    if not created and record.operation_id != operation_id:
        # One job, one budget: the job (or the payload, in flight) is another operation's; nothing was created.
        log.info("start_operation %s: answered with %s", operation_id, record.operation_id)
        same_payload = submit is not None and record.request_fingerprint == request_fingerprint
        return await controller.view(record, requested_operation_id=operation_id, same_payload=same_payload)
    if not created and record.account_context != account and record.provider == provider:
        # The table's account changed since this operation was recorded: never send under another.
        if record.request_fingerprint != fingerprint(provider, record.account_context, payload):
            raise OperationConflict(
                f"operation {operation_id!r} already exists for a different job or payload; "
                "use a new operation_id"
            )
        changed = stop.account_context_changed(record, account)
        if record.status == Status.SUBMITTING and record.lease_owner is None and changed is not None:
            stopped = await controller.store.finish_submission(
                operation_id,
                owner=None,
                changes={
                    "status": changed.status,
                    "stop_reason": changed.reason,
                    "stop_detail": changed.detail,
                    "stopped_at": now,
                },
                kind="stopped",
                at=now,
                note="account context changed before the submission was sent",
            )
            record = stopped or await controller.load(operation_id)
        return await controller.view(record)
    if not created:
        if (
            record.request_fingerprint != request_fingerprint
            or record.provider != provider
            or record.owner != owner
        ):
            raise OperationConflict(
                f"operation {name!r} already exists for a different provider, job or payload; "
                "use a new operation_id"
            )
        if idempotency_key is not None and idempotency_key != record.idempotency_key:
            raise OperationConflict(
                f"operation {name!r} was recorded with a different idempotency key; "
                "call again without idempotency_key (the recorded one is re-used) or use a new operation_id"
            )
        log.info("start_operation %s: existing record returned", operation_id)
    if record.held_for_approval:
        record = await resubmission.clear(controller, record, resubmission_answer)
        if record.held_for_approval:
            return await controller.view(record)  # nothing is sent before a person approves
    if record.duplicate_of is not None:
        return await controller.job_holder_view(record, operation_id)
    if record.status == Status.SUBMITTING:
        record = await submission.submit(controller, record, table)
        if record.duplicate_of is not None:
            return await controller.job_holder_view(record, operation_id)
    return await controller.view(record)
