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
from pollwarden.schedule import first_check_at
from pollwarden.store import Store
from pollwarden.timefmt import iso, parse_iso
from pollwarden.views import OperationView, Outcome, allowed_actions, operation_view
from pollwarden_providers.interpret import get_field, parse_json_object, truncate_text
from pollwarden_providers.request_building import (
    EgressError,
    MissingCredentialError,
    job_id_from_location,
    resolve_location,
)
from pollwarden_providers.table import ProviderTable

log = logging.getLogger("pollwarden")

ProgressCallback = Callable[[float, float | None, str], Awaitable[None]]


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

    def view(self, record: OperationRecord, outcome: Outcome | None = None) -> OperationView:
        """The operation view, with the extension suggestion clipped to the operator caps."""
        table = self.tables.get(record.provider)
        caps = self.config.caps
        suggestion = (min(900.0, caps.max_extra_seconds), min(4, caps.max_extra_status_requests))
        return operation_view(record, table, now=self.clock.now(), outcome=outcome, suggestion=suggestion)

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
        if provider_job_id is not None and (not provider_job_id.strip() or len(provider_job_id) > 256):
            raise InvalidRequest("provider_job_id must be 1 to 256 characters")
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
                raise InvalidRequest(f"business_deadline_at {business_deadline_at} has already passed")
        if idempotency_key is not None and (
            submit is None or not table.submit or not table.submit.idempotency_header
        ):
            raise InvalidRequest(
                "idempotency_key only applies to submit on a provider whose table names an idempotency_header"
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
            log.info("start_operation %s: existing record returned", operation_id)
        if record.status == "submitting":
            record = await self._submit(record, table)
        return self.view(record)

    async def _submit(self, record: OperationRecord, table: ProviderTable) -> OperationRecord:
        """Send the submission once; on a crash-and-recall the same idempotency key is re-used."""
        assert table.submit is not None
        assert record.submit_payload_json is not None
        has_idempotency = bool(table.submit.idempotency_header and record.idempotency_key)
        if not has_idempotency and record.version > 1:
            # A submission without idempotency may already have been sent by the
            # crashed call: never send a second one.
            return await self._stop_submission(
                record,
                "delivery_ambiguous",
                "the submission may have been sent before a crash and the provider has no idempotency; "
                "never resubmitted",
            )
        claimed = await self.store.update_fields(
            record.operation_id,
            {"updated_at": self.clock.now()},
            expect_status=("submitting",),
            audit_kind="submit_sent",
            at=self.clock.now(),
            note=f"idempotency key {'present' if has_idempotency else 'absent'}",
        )
        if claimed is None:
            return await self.load(record.operation_id)
        payload = json.loads(record.submit_payload_json)
        answer = await self.http.submit(table, payload, record.idempotency_key)
        now = self.clock.now()
        if isinstance(answer, NoAnswer):
            if not answer.sent and not has_idempotency:
                detail = f"submission not delivered ({answer.detail}); nothing was created, start again"
                return await self._stop_submission(record, "integration_failure", detail, at=now)
            if has_idempotency:
                # Safe to retry with the same key: leave it submitting for the next call.
                await self.store.update_fields(
                    record.operation_id,
                    {"updated_at": now},
                    expect_status=("submitting",),
                    audit_kind="submit_unanswered",
                    at=now,
                    note=f"{answer.detail}; call start_operation again with the same operation_id to retry "
                    "with the same idempotency key",
                )
                return await self.load(record.operation_id)
            return await self._stop_submission(
                record,
                "delivery_ambiguous",
                f"submission {answer.detail}; the provider may or may not have created the job and has no "
                "idempotency, so it is never resubmitted",
                at=now,
            )
        if isinstance(answer, UnusableAnswer):
            return await self._stop_submission(
                record, "integration_failure", f"submission answer unusable: {answer.reason}", at=now
            )
        return await self._accept_submission(record, table, answer)

    async def _accept_submission(
        self, record: OperationRecord, table: ProviderTable, answer: ProviderAnswer
    ) -> OperationRecord:
        assert table.submit is not None
        now = answer.received_at
        code = answer.status_code
        if code in (401, 403):
            return await self._stop_submission(
                record, "authorization_denied", f"HTTP {code} on submission", at=now, http_status=code
            )
        if code not in (200, 201, 202):
            return await self._stop_submission(
                record, "integration_failure", f"HTTP {code} on submission", at=now, http_status=code
            )
        job_id: str | None = None
        where = ""
        if table.submit.job_id_field:
            try:
                body = parse_json_object(answer.body)
            except ValueError as exc:
                return await self._stop_submission(
                    record,
                    "integration_failure",
                    f"submission body unreadable: {exc}",
                    at=now,
                    http_status=code,
                )
            value = get_field(body, table.submit.job_id_field)
            if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
                job_id = str(value)
                where = f"body field {table.submit.job_id_field}"
        if job_id is None and "location" in answer.headers:
            location = answer.headers["location"]
            try:
                absolute = resolve_location(table, table.origin + table.submit.path, location)
            except EgressError as exc:
                return await self._stop_submission(
                    record,
                    "integration_failure",
                    f"submission Location {truncate_text(location, 120)} refused: {exc}",
                    at=now,
                    http_status=code,
                )
            job_id = job_id_from_location(table, absolute)
            where = "Location header"
        if job_id is None or len(job_id) > 256:
            return await self._stop_submission(
                record,
                "integration_failure",
                "the submission answer names no job id in the documented field or a same-origin Location; "
                "pollwarden never guesses one",
                at=now,
                http_status=code,
            )
        updated = await self.store.update_fields(
            record.operation_id,
            {
                "status": "waiting",
                "provider_job_id": job_id,
                "last_http_status": code,
                "last_http_at": now,
                "provider_request_id": _request_id(table, answer.headers),
            },
            expect_status=("submitting",),
            audit_kind="submitted",
            at=now,
            note=f"job id from {where}",
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
    ) -> OperationRecord:
        at = self.clock.now() if at is None else at
        changes: dict[str, object] = {
            "status": status_for(reason),
            "stop_reason": reason,
            "stop_detail": detail,
            "stopped_at": at,
        }
        if http_status is not None:
            changes.update(last_http_status=http_status, last_http_at=at)
        updated = await self.store.update_fields(
            record.operation_id,
            changes,
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
            allowed_at = (
                max(record.next_check_at, record.lease_expires_at or 0)
                if lease_busy
                else record.next_check_at
            )
            if now < allowed_at or lease_busy:
                if allowed_at <= wait_until:
                    await self._wait(allowed_at, wait_started, wait_until, now, progress, lease_busy)
                    continue
                record = await self.store.note_refusal(operation_id, now)
                return self.view(record, "not_yet")
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
