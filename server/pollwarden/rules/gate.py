"""Before a request: what one round of check_status does, decided from the record alone.

`gate_verdict` is a pure function of the operation record, the time and the
caller's wait bound. The store calls it inside the transaction that then
carries the verdict out (count a refusal, stop, take the lease and count the
request), so the load, the decision and the guarded write are one trip; the
store's SQL guard states the same conditions again. The order follows the
source document: stop if finished, check the deadline and the budget before
anything is sent, refuse (or wait) if too early, else reserve.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from pollwarden.core.vocabulary import Outcome, Status, StopReason
from pollwarden.rules import stop
from pollwarden.rules.schedule import not_before

if TYPE_CHECKING:
    from pollwarden.core.records import OperationRecord

# While another process's request is in flight, look again after this long.
IN_FLIGHT_RECHECK_SECONDS = 0.5


class Verdict(StrEnum):
    """The verdict of the gate for one round of check_status."""

    NO_TABLE = "no_table"  # the operation's provider table is not loaded: nothing is decided
    APPLY_APPROVALS = "apply_approvals"  # an operator's decision waits to be applied first
    STOPPED = "stopped"  # already finished or escalated: refused (counted), nothing sent
    STOP = "stop"  # the deadline passed or the budget is used: stop now, nothing sent
    WAIT = "wait"  # too early, but the caller still has wait left: it sleeps and looks again, nothing written
    NOT_YET = "not_yet"  # too early: refused (counted), nothing sent
    RESERVE = "reserve"  # count the request and take the lease
    # A request may go out now (or within the caller's wait), but the provider table requires a person
    # for every status request and none approved this one: nothing written, nothing sent.
    NEEDS_PERSON = "needs_person"
    # Written by the store, not the gate: RESERVE found the provider's shared pace used up,
    # so the operation was booked the next free slot (at `allowed_at`) instead; nothing counted.
    PACED = "paced"


# What the agent is told when a round ends in a refusal.
REFUSAL_OUTCOME: dict[Verdict, Outcome] = {Verdict.STOPPED: Outcome.STOPPED, Verdict.NOT_YET: Outcome.NOT_YET}


@dataclass(frozen=True)
class GateVerdict:
    """The gate's verdict, with what the store needs to carry it out."""

    kind: Verdict
    allowed_at: float | None = None  # WAIT, NOT_YET: when a request may go out
    lease_busy: bool = False  # WAIT, NOT_YET: another request is in flight
    stop_reason: StopReason | None = None  # STOP
    stop_detail: str | None = None  # STOP

    @property
    def writes(self) -> bool:
        """Whether carrying this verdict out changes the database."""
        return self.kind not in (
            Verdict.NO_TABLE,
            Verdict.APPLY_APPROVALS,
            Verdict.WAIT,
            Verdict.NEEDS_PERSON,
        )

    @property
    def refusal(self) -> Outcome | None:
        """The outcome of a refused call this verdict counts, or None."""
        return REFUSAL_OUTCOME.get(self.kind)


def lease_busy(record: OperationRecord, now: float) -> bool:
    """Whether another call's request is in flight (its lease has not expired)."""
    return record.lease_owner is not None and (record.lease_expires_at or 0.0) > now


def gate_verdict(
    record: OperationRecord,
    *,
    now: float,
    wait_until: float,
    has_table: bool,
    approvals_due: bool,
    account_context: str | None = None,
    may_send: bool = True,
) -> GateVerdict:
    """What this round of check_status does; `approvals_due` says an operator's decision waits.

    `account_context` is the provider table's account context now (None: not
    compared); a waiting operation recorded under another one stops, and so
    does one marked a duplicate of the operation holding its job.
    `may_send=False` (a table that requires a person for every status request, and
    none approved this call): where a request would go out now or after a wait, nothing is.
    """
    if not has_table:
        return GateVerdict(Verdict.NO_TABLE)
    if record.status == Status.ESCALATED and approvals_due:
        return GateVerdict(Verdict.APPLY_APPROVALS)
    if record.status != Status.WAITING:
        return GateVerdict(Verdict.STOPPED)
    busy = lease_busy(record, now)
    if not busy:
        # Checked only once no request is in flight: its answer may stop the operation itself.
        for stopped in (
            stop.job_already_tracked(record),
            stop.account_context_changed(record, account_context),
            stop.deadline_passed(record, now, before="this check"),
            stop.budget_used(record),
        ):
            if stopped is not None:
                return GateVerdict(Verdict.STOP, stop_reason=stopped.reason, stop_detail=stopped.detail)
    # Whatever moved next_check_at (a webhook, an approval, a reopen), never before the earliest allowed time.
    allowed_at = not_before(record.next_check_at, record.not_before_at)
    if busy:
        # Another request is in flight: its answer will move next_check_at, so
        # look again shortly rather than at the lease's (long) expiry.
        allowed_at = max(allowed_at, min(record.lease_expires_at or now, now + IN_FLIGHT_RECHECK_SECONDS))
    if now < allowed_at:
        if not may_send:
            kind = Verdict.NEEDS_PERSON if allowed_at <= wait_until else Verdict.NOT_YET
        else:
            # A caller with wait left holds on (re-reading the record each round) even when the allowed
            # time is past its wait: a webhook may bring the check forward. not_yet only at its end.
            kind = Verdict.WAIT if now < wait_until else Verdict.NOT_YET
        return GateVerdict(kind, allowed_at=allowed_at, lease_busy=busy)
    if not may_send:
        return GateVerdict(Verdict.NEEDS_PERSON, allowed_at=allowed_at)
    return GateVerdict(Verdict.RESERVE)


def may_reserve(record: OperationRecord, now: float) -> bool:
    """The reservation's preconditions, as the store's SQL guard states them."""
    return (
        record.status == Status.WAITING
        and not stop.reaches_deadline(record, now)
        and now >= not_before(record.next_check_at, record.not_before_at)
        and stop.budget_used(record) is None
        and not lease_busy(record, now)
    )
