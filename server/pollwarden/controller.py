"""The controller: the check procedure and the operations around it.

Plain async functions over the store, the provider HTTP client and the pure
decision code; the MCP tools are thin wrappers over these. The order of a
check follows the source document's pseudocode: load, stop if finished, check
the deadline and the budget before anything is sent, refuse if too early,
take the lease and count the request in one transaction, reload, send one
request, persist what it meant.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pollwarden.clock import Clock, RandomSource
from pollwarden.config import ServerConfig
from pollwarden.decide import NoAnswer, ProviderAnswer, Transition, UnusableAnswer, decide_after_response
from pollwarden.errors import InvalidRequest, OperationConflict, OperationNotFound
from pollwarden.extensions import ExtensionPlan, ExtensionResult, extension_changes, plan_extension
from pollwarden.faults import fault_point
from pollwarden.provider_http import ProviderHTTP
from pollwarden.records import OperationRecord, status_for
from pollwarden.schedule import first_check_at, local_backoff
from pollwarden.store import Store
from pollwarden.timefmt import iso, parse_iso
from pollwarden.views import OperationView, Outcome, allowed_actions, operation_view
from pollwarden_providers.interpret import (
    BodyError,
    RejectedHint,
    get_field,
    parse_json_object,
    parse_retry_after,
    truncate_text,
)
from pollwarden_providers.request_building import (
    MAX_JOB_ID_LENGTH,
    EgressError,
    MissingCredentialError,
    describe_location,
    job_id_from_location,
    job_id_problem,
    resolve_location,
    submit_url,
)
from pollwarden_providers.table import ProviderTable

log = logging.getLogger("pollwarden")

# While another process's request is in flight, look again after this long.
IN_FLIGHT_RECHECK_SECONDS = 0.5

ProgressCallback = Callable[[float, float | None, str], Awaitable[None]]

# An idempotency key travels in a header: visible ASCII only, so it cannot inject one.
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# A submission payload is stored and sent as JSON; larger inputs belong behind a reference.
MAX_SUBMIT_BYTES = 256 * 1024


def fingerprint(provider: str, account_context: str, payload: object) -> str:
    """SHA-256 of the canonical JSON of provider, account context and payload."""
    canonical = json.dumps(
        {"provider": provider, "account": account_context, "payload": payload},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def account_context_of(table: ProviderTable) -> str:
    """Which provider account the server acts as: the origin and the credential's variable name."""
    who = f"${table.auth.env}" if table.auth else "anonymous"
    return f"{table.origin} as {who}"


@dataclass
class Controller:
    """Everything a tool call needs, injected."""

    store: Store
    tables: Mapping[str, ProviderTable]
    http: ProviderHTTP
    clock: Clock
    rng: RandomSource
    config: ServerConfig

    # -- helpers -------------------------------------------------------------

    def table_for(self, provider: str) -> ProviderTable:
        """The provider's table, or a clear error listing the known ones."""
        table = self.tables.get(provider)
        if table is None:
            known = ", ".join(sorted(self.tables)) or "(none loaded)"
            raise InvalidRequest(
                f"unknown provider {provider!r}; known providers: {known}. "
                "Add a table with --providers DIR (see README 'Writing a provider table')"
            )
        return table

    async def load(self, operation_id: str) -> OperationRecord:
        """The record, or OperationNotFound naming the id."""
        record = await self.store.get(operation_id)
        if record is None:
            raise OperationNotFound(
                f"no operation {operation_id!r}; call list_operations to see the ids, "
                "or start_operation to create it"
            )
        return record

    def view(
        self, record: OperationRecord, outcome: Outcome | None = None, *, retry_at: float | None = None
    ) -> OperationView:
        """The operation view, with the extension suggestion clipped to the operator caps."""
        table = self.tables.get(record.provider)
        caps = self.config.caps
        suggestion = (min(900.0, caps.max_extra_seconds), min(4, caps.max_extra_status_requests))
        return operation_view(
            record, table, now=self.clock.now(), outcome=outcome, suggestion=suggestion, retry_at=retry_at
        )

    @property
    def lease_seconds(self) -> float:
        """Longer than any one request can take, so a live owner never loses its lease.

        `config.lease_seconds` (env POLLWARDEN_LEASE_SECONDS) overrides it for crash tests.
        """
        if self.config.lease_seconds is not None:
            return self.config.lease_seconds
        return self.http.limits.total_timeout_seconds + 10.0

    # -- start_operation --------------------------------------------------------

    async def start_operation(
        self,
        *,
        provider: str,
        operation_id: str | None = None,
        provider_job_id: str | None = None,
        submit: Mapping[str, Any] | None = None,
        deadline_seconds: float | None = None,
        business_deadline_at: str | None = None,
        max_status_requests: int | None = None,
        idempotency_key: str | None = None,
    ) -> OperationView:
        """Record a new operation before any status request (or return the existing one)."""
        table = self.table_for(provider)
        if (provider_job_id is None) == (submit is None):
            raise InvalidRequest(
                "give exactly one of provider_job_id (track a job that already exists) or submit "
                "(a JSON object to submit as a new job)"
            )
        if provider_job_id is not None and (problem := job_id_problem(provider_job_id)) is not None:
            raise InvalidRequest(
                f"provider_job_id cannot be used: {problem}; pass the provider's job id exactly, "
                f"1 to {MAX_JOB_ID_LENGTH} characters"
            )
        if submit is not None and table.submit is None:
            raise InvalidRequest(
                f"provider {provider!r} has no [submit] section, so pollwarden cannot submit to it; "
                "submit the job yourself and pass provider_job_id"
            )
        try:
            self.http.credentials(table)
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
        now = self.clock.now()
        business_at: float | None = None
        if business_deadline_at is not None:
            try:
                business_at = parse_iso(business_deadline_at)
            except ValueError as exc:
                raise InvalidRequest(f"business_deadline_at: {exc}") from exc
            if business_at <= now:
                raise InvalidRequest(
                    f"business_deadline_at {business_deadline_at} has already passed (now is {iso(now)}); "
                    "give a future RFC 3339 time, or omit it"
                )
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
        operation_id = operation_id or f"{provider}-{uuid.uuid4().hex[:12]}"
        if not operation_id.strip() or len(operation_id) > 200:
            raise InvalidRequest("operation_id must be 1 to 200 characters")

        key = None
        if submit is not None and table.submit is not None and table.submit.idempotency_header:
            key = idempotency_key or f"pw-{uuid.uuid4()}"
        values: dict[str, object] = {
            "operation_id": operation_id,
            "provider": provider,
            "provider_job_id": provider_job_id,
            "account_context": account,
            "request_fingerprint": request_fingerprint,
            "idempotency_key": key,
            "expected_terminal_state": ",".join(table.states.succeeded),
            "status": "waiting" if submit is None else "submitting",
            "started_at": now,
            "deadline_at": now + deadline_seconds,
            "business_deadline_at": business_at,
            "max_status_requests": max_status_requests,
            "max_transport_failures": limits.max_transport_failures,
            "max_rate_limited": limits.max_rate_limited,
            "next_check_at": first_check_at(
                now, table.schedule.base_delay_seconds, table.schedule.max_delay_seconds, self.rng
            ),
            "delay_source": "local_backoff",
            "submit_payload_json": json.dumps(submit, sort_keys=True) if submit is not None else None,
            "created_at": now,
            "updated_at": now,
        }
        record, created = await self.store.create_operation(
            values, kind="tracking" if submit is None else "submission_recorded", at=now
        )
        if not created:
            if record.request_fingerprint != request_fingerprint or record.provider != provider:
                raise OperationConflict(
                    f"operation {operation_id!r} already exists for a different provider, job or payload; "
                    "use a new operation_id"
                )
            if idempotency_key is not None and idempotency_key != record.idempotency_key:
                raise OperationConflict(
                    f"operation {operation_id!r} was recorded with a different idempotency key; "
                    "call again without idempotency_key (the recorded one is re-used) or use a new operation_id"
                )
            log.info("start_operation %s: existing record returned", operation_id)
        if record.status == "submitting":
            record = await self._submit(record, table)
        return self.view(record)

    async def _submit(self, record: OperationRecord, table: ProviderTable) -> OperationRecord:
        """Send the submission at most once per call, and never create a second job (DESIGN §1.13, §1.14).

        The record, its fingerprint and its idempotency key are on disk before
        anything is sent. The submit request goes out under a lease that only a
        recorded outcome clears, so a lease found without an outcome means a call
        stopped after (perhaps) sending: with an idempotency key the request is
        resent with the same key (the provider answers with the same job);
        without one the operation stops as `delivery_ambiguous` and is never resent.
        """
        assert table.submit is not None
        now = self.clock.now()
        has_key = bool(table.submit.idempotency_header and record.idempotency_key)
        if record.lease_owner is not None and (record.lease_expires_at or 0.0) > now:
            return record  # another call is sending it right now: never two at once
        if now >= record.effective_deadline:
            return await self._stop_submission(
                record,
                "deadline_exceeded",
                f"the {record.deadline_name} {iso(record.effective_deadline)} passed before the provider "
                "accepted the submission; nothing more is sent",
                at=now,
            )
        interrupted = record.lease_owner is not None
        if interrupted and not has_key:
            return await self._stop_submission(
                record,
                "delivery_ambiguous",
                "a call sent (or was about to send) the submission and stopped before recording the answer; "
                "the provider has no idempotency, so the job may or may not exist and it is never resubmitted. "
                "A person checks the provider's console",
                at=now,
            )
        if not interrupted and _submission_failures(record) and now < record.next_check_at:
            return record  # a retry is allowed from next_check_at (stop_detail says when)
        owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        claimed = await self.store.claim_submission(
            record.operation_id,
            owner=owner,
            now=now,
            lease_seconds=self.lease_seconds,
            allow_stale=has_key,
            note=(
                ("resending after an interrupted call, " if interrupted else "")
                + (
                    "with the recorded idempotency key"
                    if has_key
                    else "without idempotency: sent at most once"
                )
            ),
        )
        if claimed is None:
            return await self.load(record.operation_id)
        assert claimed.submit_payload_json is not None
        payload = json.loads(claimed.submit_payload_json)
        answer = await self.http.submit(table, payload, claimed.idempotency_key)
        if isinstance(answer, NoAnswer):
            return await self._submission_failed(
                claimed,
                table,
                owner,
                detail=answer.detail,
                sent=answer.sent,
                has_key=has_key,
                at=answer.received_at,
            )
        if isinstance(answer, UnusableAnswer):
            return await self._stop_submission(
                claimed,
                "integration_failure",
                f"the submission's HTTP {answer.status_code} answer was refused: {answer.reason}; the job may "
                "exist, a person checks the provider's console",
                at=answer.received_at,
                http_status=answer.status_code,
                owner=owner,
            )
        return await self._accept_submission(claimed, table, answer, owner, has_key=has_key)

    async def _accept_submission(
        self,
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

        async def stop(reason: str, detail: str) -> OperationRecord:
            return await self._stop_submission(
                record, reason, detail, at=now, http_status=code, owner=owner, rejected=rejected
            )

        if code in (401, 403):
            return await stop(
                "authorization_denied",
                f"HTTP {code} on submission: the provider refused these credentials; a person must check access",
            )
        if 300 <= code < 400:
            raw_location = answer.headers.get("location")
            return await stop(
                "integration_failure",
                f"HTTP {code} redirect on submission, not followed (requests go to {table.origin} only); "
                f"Location {describe_location(raw_location) if raw_location else '(none)'}",
            )
        if code == 429:
            used = record.rate_limited_used + 1
            if used >= record.max_rate_limited:
                return await self._stop_submission(
                    record,
                    "rate_limited",
                    f"HTTP 429 on submission {used} times (limit {record.max_rate_limited}); nothing was created",
                    at=now,
                    http_status=code,
                    owner=owner,
                    rejected=rejected,
                    changes={"rate_limited_used": used},
                )
            return await self._retry_submission_later(
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
        if code >= 500:
            return await self._submission_failed(
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
                "integration_failure",
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
                problem = job_id_problem(str(value))
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
                    "integration_failure",
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
                "integration_failure",
                f"HTTP {code}: the submission answer names no job id ({'; '.join(why_not)}); pollwarden never "
                "guesses one. The job may exist: a person checks the provider's console",
            )

        first = first_check_at(
            now, table.schedule.base_delay_seconds, table.schedule.max_delay_seconds, self.rng
        )
        next_at, source = first, "local_backoff"
        if retry_after.seconds is not None and now + retry_after.seconds > first:
            next_at, source = now + retry_after.seconds, "provider_retry_after"
        updated = await self.store.finish_submission(
            record.operation_id,
            owner=owner,
            changes={
                "status": "waiting",
                "provider_job_id": job_id,
                "last_http_status": code,
                "last_http_at": now,
                "provider_request_id": _request_id(table, answer.headers),
                "next_check_at": next_at,
                "delay_source": source,
                "retry_after_seconds": retry_after.seconds,
                "stop_detail": None,
            },
            kind="submitted",
            at=now,
            note=f"HTTP {code}, job id from the {where}",
            payload_extra={"rejected_hints": _hints_payload(rejected)},
        )
        return updated or await self.load(record.operation_id)

    async def _submission_failed(
        self,
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
            return await self._stop_submission(
                record,
                "delivery_ambiguous",
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
                reason = "delivery_ambiguous"
                text = (
                    f"no usable answer to {failures} submission attempts (last: {detail}); the job may exist "
                    "under the recorded idempotency key. Never resubmitted: a person checks the provider's console"
                )
            else:
                reason = "integration_failure"
                text = (
                    f"the provider at {table.origin} could not be reached for {failures} submission attempts "
                    f"(last: {detail}); nothing was delivered, no job exists. Check that the provider is "
                    "reachable, then start a new operation"
                )
            return await self._stop_submission(
                record, reason, f"{text} ({budget})", at=at, owner=owner, changes=counted, rejected=rejected
            )
        if sent:
            what = f"the submission got no usable answer ({detail}) and may have reached the provider"
            resend = "resends it with the same idempotency key, so the provider returns the same job"
        else:
            what = f"the submission never left ({detail}); nothing reached the provider"
            resend = "sends it again"
        return await self._retry_submission_later(
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
        self,
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
            attempt - 1, table.schedule.base_delay_seconds, table.schedule.max_delay_seconds, self.rng
        )
        source = "local_backoff"
        if retry_after is not None and retry_after >= wait:
            wait, source = retry_after, "provider_retry_after"
        retry_at = at + wait
        detail = (
            f"{what}. Call start_operation again with the same operation_id from {iso(retry_at)}: "
            f"it {resend}; an earlier call sends nothing"
        )
        updated = await self.store.finish_submission(
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
            payload_extra={"rejected_hints": _hints_payload(rejected or [])},
        )
        return updated or await self.load(record.operation_id)

    async def _stop_submission(
        self,
        record: OperationRecord,
        reason: str,
        detail: str,
        *,
        at: float | None = None,
        http_status: int | None = None,
        owner: str | None = None,
        changes: Mapping[str, object] | None = None,
        rejected: list[RejectedHint] | None = None,
    ) -> OperationRecord:
        """Stop a submission; with `owner`, also release the lease taken to send it."""
        at = self.clock.now() if at is None else at
        stop: dict[str, object] = {
            **(changes or {}),
            "status": status_for(reason),
            "stop_reason": reason,
            "stop_detail": detail,
            "stopped_at": at,
        }
        if http_status is not None:
            stop.update(last_http_status=http_status, last_http_at=at)
        if owner is not None:
            updated = await self.store.finish_submission(
                record.operation_id,
                owner=owner,
                changes=stop,
                kind="stopped",
                at=at,
                note=detail,
                payload_extra={"rejected_hints": _hints_payload(rejected or [])},
            )
        else:
            # Nothing in flight (checked by the caller): an interrupted call's lease is cleared too.
            stop.update(lease_owner=None, lease_expires_at=None)
            updated = await self.store.update_fields(
                record.operation_id,
                stop,
                expect_status=("submitting",),
                audit_kind="stopped",
                at=at,
                note=detail,
            )
        return updated or await self.load(record.operation_id)

    # -- check_status -----------------------------------------------------------------

    async def check_status(
        self,
        operation_id: str,
        *,
        wait_seconds: float = 0.0,
        progress: ProgressCallback | None = None,
    ) -> OperationView:
        """One bounded status check (DESIGN §1.10). Never sends more than one request."""
        if not math.isfinite(wait_seconds) or wait_seconds < 0:
            raise InvalidRequest(f"wait_seconds must be between 0 and {self.config.max_wait_seconds:g}")
        wait_seconds = min(wait_seconds, self.config.max_wait_seconds)
        wait_started = self.clock.now()
        wait_until = wait_started + wait_seconds
        # A bounded number of rounds: each either answers or sleeps toward wait_until.
        for _ in range(1000):
            record = await self.load(operation_id)
            table = self.table_for(record.provider)
            now = self.clock.now()
            if record.status == "escalated":
                record = await self.apply_decided_approvals(record)
                if record.status == "waiting":
                    continue
            if record.status != "waiting":
                record = await self.store.note_refusal(operation_id, now)
                return self.view(record, "stopped")
            if now >= record.effective_deadline or record.status_requests_used >= record.max_status_requests:
                stopped = await self._stop_before_request(record, now)
                if stopped is not None:
                    return self.view(stopped, "stopped")
            lease_busy = record.lease_owner is not None and (record.lease_expires_at or 0) > now
            allowed_at = record.next_check_at
            if lease_busy:
                # Another request is in flight: its answer will move next_check_at, so
                # look again shortly rather than at the lease's (long) expiry.
                allowed_at = max(
                    allowed_at, min(record.lease_expires_at or now, now + IN_FLIGHT_RECHECK_SECONDS)
                )
            if now < allowed_at:
                if allowed_at <= wait_until:
                    await self._wait(allowed_at, wait_started, wait_until, now, progress, lease_busy)
                    continue
                record = await self.store.note_refusal(operation_id, now)
                return self.view(record, "not_yet", retry_at=allowed_at)
            owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
            reservation = await self.store.reserve(
                operation_id, owner=owner, now=now, lease_seconds=self.lease_seconds, fleet=table.fleet
            )
            if reservation.paced:
                # The provider's shared pace is used up: this operation now holds the next free slot.
                slot = reservation.record.next_check_at
                if slot <= wait_until:
                    await self._wait(slot, wait_started, wait_until, now, progress, False)
                    continue
                return self.view(reservation.record, "not_yet")
            if not reservation.reserved:
                continue  # another process moved first: look again
            fault_point("after_reservation")
            return await self._send_and_record(reservation.record, table, owner)
        raise InvalidRequest("check_status could not settle; try again")  # pragma: no cover

    async def _wait(
        self,
        allowed_at: float,
        wait_started: float,
        wait_until: float,
        now: float,
        progress: ProgressCallback | None,
        lease_busy: bool,
    ) -> None:
        """Sleep toward the allowed time in slices (holding no lease), reporting progress."""
        remaining = max(0.0, allowed_at - now)
        step = min(remaining, self.config.progress_interval_seconds) if remaining > 0 else 0.05
        if progress is not None:
            why = "another check is in flight" if lease_busy else "waiting for the next allowed check"
            await progress(now - wait_started, wait_until - wait_started, f"{why}: {remaining:.1f} s left")
        await self.clock.sleep(step)

    async def _stop_before_request(self, record: OperationRecord, now: float) -> OperationRecord | None:
        if now >= record.effective_deadline:
            which = record.deadline_name
            reason, detail = (
                "deadline_exceeded",
                f"the {which} {iso(record.effective_deadline)} passed before this check",
            )
        else:
            reason = "request_budget_exhausted"
            detail = f"all {record.max_status_requests} status requests are used"
        return await self.store.stop_without_request(
            record.operation_id, reason=reason, detail=detail, status="escalated", at=now
        )

    async def _send_and_record(
        self, record: OperationRecord, table: ProviderTable, owner: str
    ) -> OperationView:
        assert record.provider_job_id is not None
        answer = await self.http.get_status(table, record.provider_job_id)
        fault_point("after_response")
        transition = decide_after_response(record, table, answer, rng=self.rng)
        fault_point("before_persist")
        changes = transition_changes(record, transition, answer)
        extra: dict[str, object] = {
            "rejected_hints": [
                {"source": h.source, "value": h.value, "reason": h.reason} for h in transition.rejected_hints
            ],
            "note": transition.note or transition.location,
        }
        updated, applied = await self.store.apply_answer(
            record.operation_id, owner=owner, changes=changes, at=answer.received_at, payload_extra=extra
        )
        if not applied:
            log.warning(
                "answer for %s arrived after the lease was lost; recorded, not applied", record.operation_id
            )
        return self.view(updated, "polled")

    # -- extensions and approvals ----------------------------------------------------------

    async def plan_extension(
        self, operation_id: str, *, extra_seconds: float, extra_status_requests: int, reason: str
    ) -> ExtensionPlan:
        """Clip and explain a request for more time or requests (no side effects)."""
        record = await self.load(operation_id)
        table = self.table_for(record.provider)
        if not math.isfinite(extra_seconds) or extra_seconds < 0 or extra_status_requests < 0:
            raise InvalidRequest("extra_seconds and extra_status_requests must be zero or more")
        return plan_extension(
            record,
            table,
            self.config.caps,
            extra_seconds=extra_seconds,
            extra_status_requests=extra_status_requests,
            reason=reason,
        )

    async def apply_extension(
        self, plan: ExtensionPlan, *, approval_id: str | None = None, by: str = "person"
    ) -> ExtensionResult:
        """Record an approved plan, only if the operation is still as it was when asked."""
        record = await self.load(plan.operation_id)
        table = self.table_for(record.provider)
        now = self.clock.now()
        if record.version != plan.bound_version:
            if approval_id is not None:
                await self.store.close_approval(
                    approval_id, status="void", at=now, note="the operation changed after the question"
                )
            return self._extension_result(
                record,
                "void",
                "The approval is void: the operation changed (state, counters or deadline) after the person "
                "was asked. Ask again if it is still needed.",
                approval_id=approval_id,
            )
        changes = extension_changes(record, table, plan, now=now)
        updated = await self.store.apply_extension(
            record.operation_id,
            bound_version=plan.bound_version,
            changes=changes,
            at=now,
            approval_id=approval_id,
            payload_extra={
                "extra_seconds": plan.extra_seconds,
                "extra_status_requests": plan.extra_status_requests,
                "approved_by": by,
                "delay_source": "manual_extension",
            },
        )
        if updated is None:
            return self._extension_result(
                await self.load(plan.operation_id),
                "void",
                "The approval is void: the operation changed while it was being recorded.",
                approval_id=approval_id,
            )
        return self._extension_result(
            updated,
            "approved",
            f"Approved by {by}: deadline now {iso(updated.deadline_at)}, budget {updated.max_status_requests} "
            f"status requests ({updated.status_requests_used} used). Call check_status; the next check's "
            "delay source is manual_extension.",
            approval_id=approval_id,
            plan=plan,
        )

    async def record_answer(self, plan: ExtensionPlan, decision: str) -> ExtensionResult:
        """Audit a person's deny or cancel; nothing else changes."""
        record = await self.load(plan.operation_id)
        kind = "extension_denied" if decision == "denied" else "extension_cancelled"
        await self.store.audit_event(
            plan.operation_id,
            kind=kind,
            at=self.clock.now(),
            note=f"asked +{plan.extra_seconds:g} s, +{plan.extra_status_requests} checks",
            extra={},
        )
        text = "denied" if decision == "denied" else "not answered (cancelled)"
        return self._extension_result(
            record, decision, f"The person {text} the extension; nothing changed. " + _after_no(record)
        )

    async def request_operator_approval(self, plan: ExtensionPlan) -> ExtensionResult:
        """Record a pending approval for an operator to decide outside the chat."""
        record = await self.load(plan.operation_id)
        now = self.clock.now()
        approval = await self.store.open_approval(
            approval_id=f"ap-{uuid.uuid4().hex[:10]}",
            record=record,
            kind="extension",
            request=plan.model_dump(mode="json"),
            at=now,
            ttl_seconds=self.config.approval_ttl_seconds,
        )
        return self._extension_result(
            record,
            "pending_approval",
            f"A person must decide; this client cannot ask them. An operator runs "
            f"`pollwarden approve {approval.approval_id}` or `pollwarden deny {approval.approval_id}` "
            f"(same database) before {iso(approval.expires_at)}. Then call check_status: it applies the "
            "decision. Do not poll in between.",
            approval_id=approval.approval_id,
        )

    async def apply_decided_approvals(self, record: OperationRecord) -> OperationRecord:
        """Apply an operator's CLI decision on the agent's next check; expire or void stale ones."""
        approvals = await self.store.list_approvals(operation_id=record.operation_id)
        now = self.clock.now()
        for approval in approvals:
            if approval.kind != "extension":
                continue  # a cancel approval is used by the next cancel_operation call
            if approval.status == "pending" and now >= approval.expires_at:
                await self.store.close_approval(
                    approval.approval_id, status="expired", at=now, note="nobody decided in time"
                )
                await self.store.audit_event(
                    record.operation_id, kind="approval_expired", at=now, note=approval.approval_id, extra={}
                )
            elif approval.status == "approved":
                plan = ExtensionPlan.model_validate(approval.request)
                await self.apply_extension(
                    plan, approval_id=approval.approval_id, by=approval.decided_by or "operator"
                )
            elif approval.status == "denied":
                await self.store.close_approval(approval.approval_id, status="applied", at=now, note="denied")
        return await self.load(record.operation_id)

    def _extension_result(
        self,
        record: OperationRecord,
        decision: str,
        message: str,
        *,
        approval_id: str | None = None,
        plan: ExtensionPlan | None = None,
    ) -> ExtensionResult:
        return ExtensionResult(
            operation_id=record.operation_id,
            decision=decision,  # type: ignore[arg-type]
            message=message,
            approval_id=approval_id,
            granted_extra_seconds=plan.extra_seconds if plan else 0,
            granted_extra_status_requests=plan.extra_status_requests if plan else 0,
            clipped=plan.clipped if plan else [],
            operation=self.view(record),
        )

    def refused(self, plan: ExtensionPlan, record: OperationRecord) -> ExtensionResult:
        """A structured refusal naming why and what is allowed."""
        return self._extension_result(record, "refused", f"Refused: {plan.refusal}.")

    # -- read-only ---------------------------------------------------------------------

    async def get_operation(self, operation_id: str) -> OperationView:
        """The recorded state; no provider call."""
        return self.view(await self.load(operation_id))

    async def list_operations(
        self, *, status: str | None = None, provider: str | None = None, limit: int = 50
    ) -> list[OperationView]:
        """Recent operations; no provider call."""
        records = await self.store.list_operations(status=status, provider=provider, limit=limit)
        return [self.view(r) for r in records]


def _after_no(record: OperationRecord) -> str:
    return "Allowed next: " + (", ".join(record_allowed(record)) or "nothing; a person takes over") + "."


def record_allowed(record: OperationRecord) -> list[str]:
    """Allowed actions without a table (for messages)."""
    return allowed_actions(record, None)


def _submission_failures(record: OperationRecord) -> int:
    """Failed submit attempts so far (only submission moves these counters before a job id exists)."""
    return record.transport_failures_used + record.rate_limited_used


def _hints_payload(hints: list[RejectedHint]) -> list[dict[str, str]]:
    return [{"source": h.source, "value": h.value, "reason": h.reason} for h in hints]


def _request_id(table: ProviderTable, headers: Mapping[str, str]) -> str | None:
    name = table.response.request_id_header
    value = headers.get(name.lower()) if name else None
    return truncate_text(value, 128) if value else None


def transition_changes(
    record: OperationRecord, t: Transition, answer: ProviderAnswer | NoAnswer | UnusableAnswer
) -> dict[str, object]:
    """The columns one status answer changes. Budgets and deadlines are never among them."""
    changes: dict[str, object] = {
        "status": t.status,
        "stop_reason": t.stop_reason,
        "stop_detail": t.stop_detail,
        "polls_completed": record.polls_completed + 1,
        "transport_failures_used": record.transport_failures_used + (1 if t.transport_failure else 0),
        "rate_limited_used": record.rate_limited_used + (1 if t.rate_limited else 0),
        "last_http_status": t.http_status,
        "last_http_at": answer.received_at,
        "provider_request_id": t.provider_request_id,
        "retry_after_seconds": t.retry_after_seconds,
    }
    if t.state is not None:
        changes["state"] = t.state
        changes["category"] = t.category
    if t.provider_expires_at is not None:
        changes["provider_expires_at"] = t.provider_expires_at
    if t.error is not None:
        changes["error"] = t.error
    if t.result is not None:
        changes["result_json"] = json.dumps(t.result, sort_keys=True)
    if t.status == "waiting":
        assert t.next_check_at is not None
        assert t.delay_source is not None
        changes["next_check_at"] = t.next_check_at
        changes["delay_source"] = t.delay_source
    else:
        changes["stopped_at"] = answer.received_at
    return changes
