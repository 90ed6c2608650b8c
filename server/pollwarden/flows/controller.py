"""The controller: the check procedure and the operations around it.

Plain async functions over the store, the provider HTTP client and the pure
decision code; the MCP tools are thin wrappers over these. Sending a new job
lives in `submission`, extensions and approvals in `approvals`, fetch and
cancel in `followups`: each is functions over this controller. The order of a
check follows the source document's pseudocode: load, stop if finished, check
the deadline and the budget before anything is sent, refuse if too early,
take the lease and count the request in one transaction, reload, send one
request, persist what it meant.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import anyio
from anyio.abc import TaskGroup

from pollwarden.config import ServerConfig
from pollwarden.core.clock import Clock, RandomSource
from pollwarden.core.errors import InvalidRequest, OperationNotFound, StoreError
from pollwarden.core.records import OperationRecord
from pollwarden.core.untrusted import shown
from pollwarden.core.vocabulary import Outcome
from pollwarden.flows import approvals, starting
from pollwarden.flows.check_hooks import BoundaryHook, ignore_boundary
from pollwarden.flows.held_answers import HeldAnswer, HeldAnswers, answer_held_message
from pollwarden.ops import decision_log, observe
from pollwarden.provider_io.provider_http import ProviderHTTP
from pollwarden.rules.gate import Verdict
from pollwarden.rules.job_identity import (
    account_context_of,
    already_tracked_message,
    payload_in_flight_message,
)
from pollwarden.rules.schedule import wait_bound
from pollwarden.rules.status_answer import (
    NoAnswer,
    ProviderAnswer,
    Transition,
    UnusableAnswer,
    interpret_status_answer,
)
from pollwarden.rules.stored_result import encode_result
from pollwarden.store import Store, new_lease_owner
from pollwarden.surface.views import OperationView
from pollwarden_providers.request_building import (
    MissingCredentialError,
)
from pollwarden_providers.table import ProviderTable
from pollwarden_providers.table_limits import FleetSpec

log = logging.getLogger("pollwarden")

ProgressCallback = Callable[[float, float | None, str], Awaitable[None]]

# A waiting check_status re-reads its operation this often: a webhook's wake-up (from any process
# sharing the database) is noticed within this long, at the cost of one snapshot read per slice.
WAKE_RECHECK_SECONDS = 0.5

NEEDS_PERSON_MESSAGE = (
    "Nothing was sent: the {} provider table requires a person to approve every status request, and "
    "none approved this one. Call check_status again when a person can answer."
)


@dataclass
class Controller:
    """Everything a tool call needs, injected."""

    store: Store
    tables: Mapping[str, ProviderTable]
    http: ProviderHTTP
    clock: Clock
    rng: RandomSource
    config: ServerConfig
    # Called at each boundary of a status check (see check_hooks.py); the crash tests stop the process there.
    on_boundary: BoundaryHook = ignore_boundary
    # Answers the database could not record yet, and where they are retried (issue 29; `held_answers`).
    held_answers: HeldAnswers = field(default_factory=HeldAnswers)
    background: TaskGroup | None = None

    # -- helpers -------------------------------------------------------------

    def table_for(self, provider: str) -> ProviderTable:
        """The provider's table, or a clear error listing the known ones."""
        table = self.tables.get(provider)
        if table is None:
            known = ", ".join(sorted(self.tables)) or "(none loaded)"
            raise InvalidRequest(
                f"unknown provider {shown(provider)}; known providers: {known}. "
                "Add a table with --providers DIR (see docs/writing-tables.md)"
            )
        return table

    async def load(self, operation_id: str) -> OperationRecord:
        """The record, or OperationNotFound naming the id."""
        record = await self.store.get(operation_id)
        if record is None:
            raise self._not_found(operation_id)
        return record

    @staticmethod
    def not_found(operation_id: str) -> OperationNotFound:
        """The error for an id nobody (visible to the caller) has."""
        return Controller._not_found(operation_id)

    @staticmethod
    def _not_found(operation_id: str) -> OperationNotFound:
        return OperationNotFound(
            f"no operation {shown(operation_id)}; check operation_id: call list_operations to see "
            "the ids, or start_operation to create it"
        )

    @cached_property
    def _poll_schedules(self) -> dict[str, tuple[float, float]]:
        """Each provider's own schedule (base and longest delay): how soon an operation checks again."""
        return {
            name: (table.schedule.base_delay_seconds, table.schedule.max_delay_seconds)
            for name, table in self.tables.items()
        }

    @cached_property
    def _fleets(self) -> dict[str, FleetSpec | None]:
        """Every provider a check may send to, and its shared pace (None without [fleet]).

        A provider whose credential cannot be sent is left out, so the gate
        answers before counting a request: a check that could not send costs no budget.
        """
        return {
            name: table.fleet for name, table in self.tables.items() if name not in self._credential_problems
        }

    @cached_property
    def per_request_providers(self) -> frozenset[str]:
        """Providers whose tables require a person for every status request ([approval])."""
        return frozenset(name for name, table in self.tables.items() if table.approval.every_status_request)

    @cached_property
    def _accounts(self) -> dict[str, str]:
        """Each loaded provider's account context now (compared with the one an operation recorded)."""
        return {name: account_context_of(table) for name, table in self.tables.items()}

    @cached_property
    def _credential_problems(self) -> dict[str, str]:
        """Why a loaded provider's credential cannot be sent (missing, not ASCII), by provider."""
        problems: dict[str, str] = {}
        for name, table in self.tables.items():
            try:
                self.http.credentials(table)
            except MissingCredentialError as exc:
                problems[name] = str(exc)
        return problems

    async def view(
        self,
        record: OperationRecord,
        outcome: Outcome | None = None,
        *,
        retry_at: float | None = None,
        requested_operation_id: str | None = None,
        same_payload: bool = False,
    ) -> OperationView:
        """The operation view (`approvals.offered_view`: request_extension only where it would be accepted).

        With `requested_operation_id` (another id than the record's) it says why start_operation answered
        with this operation: it holds the job, or (`same_payload`) the submitted payload is in flight.
        """
        shown = await approvals.offered_view(
            self.store,
            record,
            self.tables.get(record.provider),
            self.config.caps,
            now=self.clock.now(),
            outcome=outcome,
            retry_at=retry_at,
        )
        if requested_operation_id is not None and requested_operation_id != record.operation_id:
            why = payload_in_flight_message if same_payload else already_tracked_message
            return shown.model_copy(
                update={
                    "requested_operation_id": requested_operation_id,
                    "message": f"{why(record, requested_operation_id)} {shown.message}",
                }
            )
        return shown

    async def job_holder_view(self, record: OperationRecord, requested: str) -> OperationView:
        """The view of the operation holding the job `record` (a duplicate) names, as start_operation answers.

        Another principal's holder is never shown: `record` itself is, its stop saying the job is tracked.
        """
        holder = await self.store.get(record.duplicate_of) if record.duplicate_of else None
        if holder is not None and holder.owner != record.owner:
            return await self.view(record)
        return await self.view(holder or record, requested_operation_id=requested)

    @property
    def lease_seconds(self) -> float:
        """Longer than any one request can take, so a live owner never loses its lease.

        `config.lease_seconds` overrides it: the crash tests shorten it to see recovery in seconds.
        """
        if self.config.lease_seconds is not None:
            return self.config.lease_seconds
        return self.http.limits.total_timeout_seconds + 10.0

    # -- start_operation --------------------------------------------------------

    # Record a new operation before any status request, or return the existing one.
    start_operation = starting.start_operation

    # -- check_status -----------------------------------------------------------------

    async def check_status(
        self,
        operation_id: str,
        *,
        wait_seconds: float = 0.0,
        progress: ProgressCallback | None = None,
        person_approved: bool = False,
    ) -> OperationView:
        """One bounded status check (README "How a check decides"), observed: a span, a metric, a log event."""
        with observe.check_span() as seen:
            view = await self._check_status(
                operation_id, wait_seconds=wait_seconds, progress=progress, person_approved=person_approved
            )
            outcome = str(view.outcome or "")
            seen.decided(
                outcome=outcome,
                status=str(view.status),
                stop_reason=view.stop_reason,
                delay_source=view.delay_source,
                provider=view.provider,
            )
            if view.outcome != Outcome.POLLED:
                observe.refused(outcome)
            decision_log.decided("check_status", view)
            return view

    async def _check_status(
        self,
        operation_id: str,
        *,
        wait_seconds: float = 0.0,
        progress: ProgressCallback | None = None,
        person_approved: bool = False,
    ) -> OperationView:
        """One bounded status check (README "How a check decides"). Never sends more than one request.

        For a provider whose table requires a person for every status request,
        a request goes out only with `person_approved` (see `status_approval`).
        """
        if not math.isfinite(wait_seconds) or wait_seconds < 0:
            raise InvalidRequest(f"wait_seconds must be between 0 and {self.config.max_wait_seconds:g}")
        # Past this, a request could not finish inside the client's timeout: answer not_yet instead.
        wait_seconds = wait_bound(
            wait_seconds,
            max_wait=self.config.max_wait_seconds,
            request_timeout=self.http.limits.total_timeout_seconds,
        )
        wait_started = self.clock.now()
        wait_until = wait_started + wait_seconds
        owner = new_lease_owner()
        apply_approvals = True
        last_progress: list[float] = []  # when the last progress notification went out
        # A bounded number of rounds: each is one transaction that either answers or sleeps toward wait_until.
        for _ in range(1000):
            if operation_id in self.held_answers:  # an answer this process holds goes first
                await self.held_answers.record(self.store, operation_id)
            now = self.clock.now()
            start = await self.store.begin_check(
                operation_id,
                now=now,
                wait_until=wait_until,
                owner=owner,
                lease_seconds=self.lease_seconds,
                fleets=self._fleets,
                apply_approvals=apply_approvals,
                clock=self.clock.now,  # the gate's time is read once the write lock is held
                accounts=self._accounts,
                needs_person=frozenset() if person_approved else self.per_request_providers,
                fleet_slots=self.config.limits.fleet_slots,
                poll_schedules=self._poll_schedules,
            )
            if start is None:
                raise self._not_found(operation_id)
            record, decision = start.record, start.decision
            match decision.kind:
                case Verdict.NO_TABLE:
                    if (problem := self._credential_problems.get(record.provider)) is not None:
                        raise InvalidRequest(problem)
                    self.table_for(record.provider)  # raises, naming the loaded providers
                case Verdict.APPLY_APPROVALS:
                    await approvals.apply_decided_approvals(self, record)
                    apply_approvals = False  # once per call: whatever they did, look again
                case Verdict.STOPPED | Verdict.STOP:
                    return await self.view(record, Outcome.STOPPED)
                case Verdict.NOT_YET:
                    return await self.view(record, Outcome.NOT_YET, retry_at=decision.allowed_at)
                case Verdict.NEEDS_PERSON:
                    shown = await self.view(record, Outcome.NOT_YET, retry_at=decision.allowed_at)
                    return shown.model_copy(update={"message": NEEDS_PERSON_MESSAGE.format(record.provider)})
                case Verdict.WAIT | Verdict.PACED:
                    # Too early (or the provider's shared pace is used up and a slot is booked). The call
                    # waits toward the allowed time, or to the end of its own wait, whichever comes first,
                    # and looks again each round: a wake-up (a webhook) may move the allowed time earlier.
                    allowed_at = decision.allowed_at or now
                    if decision.kind == Verdict.PACED and allowed_at > wait_until:
                        return await self.view(record, Outcome.NOT_YET)
                    await self._wait(
                        allowed_at,
                        wait_started,
                        wait_until,
                        progress,
                        decision.lease_busy,
                        last_progress,
                    )
                case Verdict.RESERVE:
                    self.on_boundary("after_reservation")
                    return await self._send_and_record(record, self.table_for(record.provider), owner)
        raise InvalidRequest("check_status could not settle; try again")  # pragma: no cover

    async def _wait(
        self,
        allowed_at: float,
        wait_started: float,
        wait_until: float,
        progress: ProgressCallback | None,
        lease_busy: bool,
        last_progress: list[float],
    ) -> None:
        """Sleep toward the allowed time or the wait's end, whichever is sooner, in short slices (no lease held).

        Each slice is at most `WAKE_RECHECK_SECONDS`, so the next round re-reads
        the record and a webhook that brought the check forward (in any process
        on the database) is noticed that promptly; progress goes out once per
        `progress_interval_seconds`. The time is read again here: the round that
        decided took its round trips to the database, and a sleep measured from
        its start would wake that much after the allowed time (issue 29).
        """
        now = self.clock.now()
        remaining = max(0.0, allowed_at - now)
        until = max(0.0, min(allowed_at, wait_until) - now)
        step = min(until, WAKE_RECHECK_SECONDS) if until > 0 else 0.05
        due = not last_progress or now - last_progress[-1] >= self.config.progress_interval_seconds
        if progress is not None and due:
            why = "another check is in flight" if lease_busy else "waiting for the next allowed check"
            await progress(now - wait_started, wait_until - wait_started, f"{why}: {remaining:.1f} s left")
            last_progress[:] = [now]
        await self.clock.sleep(step)

    async def _send_and_record(
        self, record: OperationRecord, table: ProviderTable, owner: str
    ) -> OperationView:
        """Send the one request the reservation counted, and record its answer.

        Shielded from cancellation: once the request may have left, a caller
        that gives up (client timeout, notifications/cancelled) must not lose
        what the provider answered. The request is bounded by its total timeout,
        so the shield is too; the caller's cancellation lands once it is recorded.
        """
        assert record.provider_job_id is not None
        with anyio.CancelScope(shield=True):
            sent_at = self.clock.now()
            answer = await self.http.get_status(table, record.provider_job_id)
            self.on_boundary("after_response")
            transition = interpret_status_answer(record, table, answer, rng=self.rng, sent_at=sent_at)
            self.on_boundary("before_persist")
            changes = transition_changes(record, transition, answer, sent_at=sent_at)
            extra: dict[str, object] = {
                "rejected_hints": [h.as_record() for h in transition.rejected_hints],
                "note": transition.note or transition.location,
            }
            try:
                updated, applied = await self.store.apply_answer(
                    record.operation_id,
                    owner=owner,
                    changes=changes,
                    at=answer.received_at,
                    payload_extra=extra,
                )
            except StoreError as exc:
                # Sent, and answered: hold the answer and record it when the database returns.
                held = HeldAnswer(record.operation_id, owner, changes, answer.received_at, extra)
                self.held_answers.keep(held)
                if self.background is not None:
                    self.background.start_soon(
                        self.held_answers.record_in_background, self.store, self.clock, record.operation_id
                    )
                log.warning("answer for %s held: %s", record.operation_id, exc)
                raise StoreError(answer_held_message(record.operation_id, exc)) from exc
            if not applied:
                log.warning(
                    "answer for %s arrived after the lease was lost; recorded, not applied",
                    record.operation_id,
                )
            return await self.view(updated, Outcome.POLLED)
        raise AssertionError("unreachable: a shield nobody cancels lets every exception through")

    # -- read-only ---------------------------------------------------------------------

    async def get_operation(self, operation_id: str) -> OperationView:
        """The recorded state; no provider call."""
        return await self.view(await self.load(operation_id))

    async def list_operations(
        self,
        *,
        status: str | None = None,
        provider: str | None = None,
        limit: int = 50,
        owner: str | None = None,
    ) -> list[OperationView]:
        """Recent operations (only `owner`'s when given); no provider call."""
        records = await self.store.list_operations(status=status, provider=provider, limit=limit, owner=owner)
        return [await self.view(r) for r in records]


def transition_changes(
    record: OperationRecord,
    t: Transition,
    answer: ProviderAnswer | NoAnswer | UnusableAnswer,
    *,
    sent_at: float | None = None,
) -> dict[str, object]:
    """The columns one status answer changes. Budgets and deadlines are never among them.

    `sent_at` is when the request was sent (kept beside `last_http_at`, when the answer came).
    """
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
        "not_before_at": t.not_before_at,
    }
    if sent_at is not None:
        changes["request_sent_at"] = sent_at
    if t.state is not None:
        changes["state"] = t.state
        changes["category"] = t.category
    if t.provider_expires_at is not None:
        changes["provider_expires_at"] = t.provider_expires_at
    if t.error is not None:
        changes["error"] = t.error
    if t.result is not None or t.counts is not None:
        changes["result_json"] = encode_result(t.result or {}, t.counts or {})
    if t.status == "waiting":
        assert t.next_check_at is not None
        assert t.delay_source is not None
        changes["next_check_at"] = t.next_check_at
        changes["delay_source"] = t.delay_source
    else:
        changes["stopped_at"] = answer.received_at
    return changes
