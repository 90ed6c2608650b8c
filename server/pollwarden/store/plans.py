"""Every store transaction's rules, written once: what a transaction read, turned into what it writes.

Sans-IO. An engine reads what a transaction needs (the operation row, the
provider's pace, the principal's booked slots, the approval row, …) in its own
way — SQLite under its write lock or guarded by the version it read,
PostgreSQL on rows locked `FOR UPDATE` — calls a plan function here, and
carries out the `Plan` it returns: a short list of typed writes (`Flush`,
`Update`, `Append`, `CountRefusal`, `SetPace`). An `Update` is always guarded
by the version the plan was made from, so a plan made from a row that changed
since writes nothing. The conditions themselves (when a deadline has passed, a
budget is used, a request is in flight) are `pollwarden.rules.stop`'s and the gate's
(`pollwarden.rules.gate`); this module only says what each verdict writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pollwarden.access.approval_policy import ApprovalPolicy
from pollwarden.audit.chain import REKEY_OPERATION
from pollwarden.audit.entry import AuditEvent, PendingRefusals, event, lease_recovered
from pollwarden.core.errors import ConfigError
from pollwarden.core.records import ApprovalRecord, FollowupRecord, OperationRecord
from pollwarden.core.vocabulary import (
    ApprovalStatus,
    DelaySource,
    Outcome,
    Status,
    status_for,
)
from pollwarden.rules.fleet_pace import (
    PaceBucket,
    PaceVerdict,
    ahead_usable,
    book_ahead,
    share_on_send,
    share_wait,
    slot_hold_seconds,
    told_at,
)
from pollwarden.rules.gate import GateVerdict, Verdict, lease_busy
from pollwarden.rules.job_identity import REOPENABLE, account_parts, duplicate_changes
from pollwarden.rules.schedule import not_before
from pollwarden.rules.stop import reaches_deadline
from pollwarden.store import statements
from pollwarden.store.pace_reads import FirstOtherPrincipal, needs_booked_slots, served_since
from pollwarden_providers.table_limits import FleetSpec

__all__ = [
    "POLICY_CHANGED",
    "Append",
    "CountRefusal",
    "Execute",
    "Flush",
    "HandSlot",
    "Plan",
    "SetPace",
    "Update",
    "Write",
    "answer_plan",
    "approval_outcome",
    "check_plan",
    "claim_plan",
    "decision_plan",
    "extension_plan",
    "finish_plan",
    "followup_plan",
    "may_wake",
    "note_plan",
    "opening_event",
    "policy_change",
    "question_plan",
    "quiet_refusal",
    "reopen_plan",
    "wake_plan",
]


# -- the writes a plan is made of ------------------------------------------------------------------


@dataclass(frozen=True)
class Flush:
    """Write the operation's pending summary of refused calls (if any) and reset its counters."""


@dataclass(frozen=True)
class Update:
    """Change the operation's fields (version + 1, `updated_at = at`), guarded by the version read."""

    changes: Mapping[str, object]
    at: float


@dataclass(frozen=True)
class Append:
    """Append one audit row about the operation."""

    entry: AuditEvent


@dataclass(frozen=True)
class CountRefusal:
    """Count one refused call on the operation as read (a summary row written when one is due)."""

    outcome: Outcome
    at: float


@dataclass(frozen=True)
class SetPace:
    """Move the provider's shared pace: its row's two clocks (`pollwarden.rules.fleet_pace`)."""

    provider: str
    tat: float
    sent_tat: float | None


@dataclass(frozen=True)
class HandSlot:
    """Give the next slot (`slot_at`, the bookings' clock then at `tat`) to `owner`'s operation `sibling`
    waiting longest (of the sender's principal, or of the principal that comes first:
    `fleet_pace.share_on_send`), if it still waits without a slot (`fleet_pace.hands_slot`); the pace row
    moves only then. A sibling row another transaction holds is skipped (PostgreSQL: `SKIP LOCKED`)."""

    provider: str
    owner: str
    sibling: str
    slot_at: float
    tat: float
    at: float
    held_since: float  # its agent is still coming (`statements.WAITING_FOR_PACE_SQL`)
    # The hand-off just before it in the plan, (operation, slot): this one is made only if that took.
    after: tuple[str, float] | None = None

    def params(self) -> dict[str, object]:
        """The hand-off statement's parameters."""
        hold = self.at - self.held_since  # `due_by`: a told time within one hold counts as waiting
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "after"}
        after = {} if self.after is None else {"after": self.after[0], "after_slot_at": self.after[1]}
        return {**fields, **after, "now": self.at, "due_by": self.at + hold}


@dataclass(frozen=True)
class Execute:
    """Run one statement of `pollwarden.store.statements` beside the operation's writes (an approval
    settled, a follow-up recorded)."""

    statement: str
    params: Mapping[str, object]


Write = Flush | Update | Append | CountRefusal | SetPace | HandSlot | Execute

FLUSH = Flush()

# The chain row that tells an approval policy change (`policy_change`).
POLICY_CHANGED = "approval_policy_changed"


@dataclass(frozen=True)
class Plan:
    """What one transaction writes about one operation, and the record as the writes leave it."""

    record: OperationRecord
    writes: tuple[Write, ...] = ()
    decision: GateVerdict | None = None  # the check's verdict as carried out (PACED when a slot was booked)
    applied: bool = True  # False: the guard did not hold (a late answer: audited, not applied)


def refused(record: OperationRecord) -> Plan:
    """The plan of a write whose guard did not hold: only the pending refusals are written."""
    return Plan(record, (FLUSH,), applied=False)


def updated(record: OperationRecord, changes: Mapping[str, Any], at: float) -> OperationRecord:
    """The record after an `Update` of `changes` at `at` (what the guarded write makes of the row)."""
    return dataclasses.replace(record, **changes, version=record.version + 1, updated_at=at)


# -- the check procedure ---------------------------------------------------------------------------


def quiet_refusal(refusals: PendingRefusals, decision: GateVerdict) -> bool:
    """Whether carrying out `decision` only counts a refused call, writing no audit row.

    Such a commit need not wait for the disk: nothing that decides a budget, a
    deadline or a lease reads that counter.
    """
    outcome = decision.refusal
    if outcome is None:
        return False
    return not (refusals.must_flush_before(outcome) or refusals.full_after_one_more(outcome))


def check_plan(
    record: OperationRecord,
    decision: GateVerdict,
    *,
    now: float,
    owner: str,
    lease_seconds: float,
    step: PaceVerdict | None = None,
    bucket: PaceBucket | None = None,
    booked: tuple[int, float | None, int] | None = None,
    fleet_slots: int | None = None,
    fleet: FleetSpec | None = None,
    next_poll_within: float | None = None,
    sibling: tuple[str, float] | None = None,
    other_principal: FirstOtherPrincipal | None = None,
    came_at: float | None = None,
) -> Plan:
    """What the gate's verdict writes (the verdict must write: `decision.writes`).

    A refused call is counted. A stop (deadline, budget) is written before any
    request, after the pending refusals and, when an expired lease is taken,
    the `lease_recovered` row. A reservation takes the provider's pace `step`
    first (`pace_step`): when the pace is used up the operation books the next
    free slot instead (PACED), unless fair shares apply (`fleet_pace.share_wait`:
    its principal already holds `fleet_slots` slots, or another of its operations
    has waited longer; `booked` as `booked_slots` reads it) — then it waits and
    takes nothing from the pace. Under fair shares an operation without a held
    slot leaves room the pace has now to another principal served less recently
    (`other_principal`, the first of them) or to its principal's operation that
    has waited longer (`sibling`: id, when its last request left), which is handed
    the slot (`HandSlot`); one that sends hands its principal's next slot to that
    operation, and one to `other_principal`'s operation before it
    (`fleet_pace.share_on_send`).
    Otherwise the request is counted and the lease taken (an expired lease
    recovered and told first).
    """
    outcome = decision.refusal
    if outcome is not None:
        return Plan(record, (CountRefusal(outcome, now),), decision)
    recovered: tuple[Write, ...] = ()
    if record.lease_owner is not None:
        # A check that never finished held the lease until it expired (the gate decides only then).
        recovered = (FLUSH, Append(lease_recovered(record, now)))
    first = recovered or (FLUSH,)
    if decision.kind == Verdict.STOP:
        assert decision.stop_reason is not None
        changes = {
            "status": status_for(decision.stop_reason),
            "stop_reason": decision.stop_reason,
            "stop_detail": decision.stop_detail,
            "stopped_at": now,
            "lease_owner": None,
            "lease_expires_at": None,
        }
        stopped = updated(record, changes, now)
        writes = (
            *first,
            Update(changes, now),
            Append(event(stopped, "stopped", now, outcome=Outcome.STOPPED)),
        )
        return Plan(stopped, writes, decision)
    until = None
    if needs_booked_slots(step, fleet_slots) and booked is not None and fleet is not None:
        count, earliest, older = booked
        until = share_wait(
            booked=count,
            earliest=earliest,
            # A send books ahead for itself only when none of its principal's operations waits at all
            # (one that waits is handed the slot instead, below).
            older_waiting=older > 0 or (step is not None and step.send and sibling is not None),
            fleet_slots=fleet_slots,
            now=now,
            rate=fleet.max_requests_per_second,
        )
    handed: tuple[Write, ...] = ()
    if step is not None and step.send and fleet is not None and fleet_slots is not None:
        share = share_on_send(
            held_slot=step.by_held_slot,
            served=served_since(record),
            sibling_served=None if sibling is None else sibling[1],
            booked=0 if booked is None else booked[0],
            fleet_slots=fleet_slots,
            now=now,
            rate=fleet.max_requests_per_second,
            other_booked=None if other_principal is None else other_principal.booked,
        )
        # Handed room it gives up (the pace as read), or the slots after its own request: the principal
        # that comes first, then its own sibling (only if the first took: `HandSlot.after`).
        on = bucket if share.wait is not None else step.bucket
        before: tuple[str, float] | None = None
        if share.hands_other and other_principal is not None:
            leader = _hand_slot(
                record, fleet, on, other_principal.operation_id, now=now, owner=other_principal.owner
            )
            handed, on = (leader,), PaceBucket(leader.tat, None if on is None else on.sent_tat)
            before = (leader.sibling, leader.slot_at)
        if share.hands and sibling is not None:
            own = _hand_slot(record, fleet, on, sibling[0], now=now)
            handed = (*handed, dataclasses.replace(own, after=before))
        if share.wait is not None:
            until, step = share.wait, None
    if until is not None and (step is None or not step.send):
        wait = {"fleet_slot_at": None, "next_check_at": until, "delay_source": DelaySource.FLEET_PACING}
        waiting = updated(record, wait, now)
        return Plan(waiting, (*handed, Update(wait, now)), GateVerdict(Verdict.PACED, allowed_at=until))
    after = None if step is None else step.bucket
    next_slot = None
    if step is not None and step.books_ahead and until is None and not handed and fleet is not None:
        rate = fleet.max_requests_per_second
        used = record.fleet_slot_at if step.by_held_slot else None
        ahead_at, ahead_bucket = book_ahead(
            step.bucket, now=now, rate=rate, burst=fleet.burst, used_slot=used, came_at=came_at
        )
        if ahead_usable(
            ahead_at,
            now=now,
            rate=rate,
            next_poll_within=next_poll_within,
            principals_slot=fleet_slots is not None,
        ):
            next_slot, after = ahead_at, ahead_bucket
    taken: tuple[Write, ...] = ()
    if after is not None and after != bucket:
        # A pace row never used keeps `now` as its bookings' clock: a past clock paces as none.
        taken = (SetPace(record.provider, now if after.tat is None else after.tat, after.sent_tat),)
    if step is not None and not step.send:
        told = step.at
        if step.moved and fleet is not None:  # told to come as much earlier as this call took to decide
            told = told_at(step.at, now=now, came_at=came_at, rate=fleet.max_requests_per_second)
        slot: dict[str, object] = {"next_check_at": told, "delay_source": DelaySource.FLEET_PACING}
        if step.new_booking:
            slot["fleet_slot_at"] = step.at
        # else a held slot moved (or not due yet): it keeps its own time, so its place before later ones
        return Plan(
            updated(record, slot, now),
            (*taken, Update(slot, now)),
            GateVerdict(Verdict.PACED, allowed_at=told),
        )
    reserve = {
        "status_requests_used": record.status_requests_used + 1,
        "fleet_slot_at": next_slot,
        "lease_owner": owner,
        "lease_expires_at": now + lease_seconds,
        "request_sent_at": now,  # until its answer records when it left: served when reserved
    }
    writes = (*taken, *handed, *recovered, Update(reserve, now))
    return Plan(updated(record, reserve, now), writes, decision)


def busy_turn_plan(record: OperationRecord, until: float, now: float) -> Plan:
    """A check that could not get its server's turn at the provider's pace row (`PaceTurnBusy`): it is
    told to come back at `until` as a paced check is, and that is written, so the gate holds an earlier
    call without a turn. A slot it held is released, as one whose agent does not come within its hold
    is: kept, the sends' clock would keep room for it that this process's checks cannot reach in time
    (measured at +400 ms to PostgreSQL: 53-64 % of the pace used, 77 % with the slot released)."""
    told = {"next_check_at": until, "delay_source": DelaySource.FLEET_PACING, "fleet_slot_at": None}
    return Plan(
        updated(record, told, now), (Update(told, now),), GateVerdict(Verdict.PACED, allowed_at=until)
    )


def _hand_slot(
    record: OperationRecord,
    fleet: FleetSpec,
    bucket: PaceBucket | None,
    sibling: str,
    *,
    now: float,
    owner: str | None = None,
) -> HandSlot:
    """The next free slot on `bucket`'s bookings' clock, handed to `sibling`, an operation of `owner`
    (default: `record`'s principal)."""
    rate, burst = fleet.max_requests_per_second, fleet.burst
    slot_at, after = book_ahead(bucket or PaceBucket(None, None), now=now, rate=rate, burst=burst)
    assert after.tat is not None
    held_since = now - slot_hold_seconds(rate)
    principal = record.owner if owner is None else owner
    return HandSlot(record.provider, principal, sibling, slot_at, after.tat, now, held_since)


def answer_plan(
    record: OperationRecord,
    *,
    owner: str,
    changes: Mapping[str, object],
    at: float,
    payload_extra: Mapping[str, object],
) -> Plan:
    """What one status answer writes: applied (and the lease released) only while `owner` holds the lease.

    An answer that arrives after the lease was lost and taken over is audited
    (`late_answer_ignored`), not applied; `Plan.record is record` tells it.
    """
    if record.lease_owner != owner:
        late = event(record, "late_answer_ignored", at, outcome=Outcome.POLLED, extra=payload_extra)
        return Plan(record, (FLUSH, Append(late)), applied=False)
    released = {**changes, "lease_owner": None, "lease_expires_at": None}
    after = updated(record, released, at)
    polled = event(after, "polled", at, outcome=Outcome.POLLED, extra=payload_extra)
    return Plan(after, (FLUSH, Update(released, at), Append(polled)))


# -- creating and submitting -----------------------------------------------------------------------


def opening_event(created: OperationRecord, kind: str, at: float) -> AuditEvent:
    """An operation's first audit row: its record, the account context's origin and credential
    variable, and the terminal state it expects."""
    origin, credential_env = account_parts(created.account_context)
    extra = {
        "account_origin": origin,
        "account_credential_env": credential_env,
        "expected_terminal_state": created.expected_terminal_state,
    }
    return event(created, kind, at, extra=extra)


def claim_plan(
    record: OperationRecord, *, owner: str, now: float, lease_seconds: float, allow_stale: bool, note: str
) -> Plan:
    """Take the submission lease before the submit request is sent (not applied: not free).

    Free: submitting, no lease held (or, with `allow_stale` — an idempotent
    resend is safe — an expired one), and not a resubmission a person has yet
    to approve (it is never sent).
    """
    stale = allow_stale and (record.lease_expires_at or 0.0) <= now
    if record.status != Status.SUBMITTING or not (record.lease_owner is None or stale):
        return refused(record)
    if record.held_for_approval:
        return refused(record)
    changes = {"lease_owner": owner, "lease_expires_at": now + lease_seconds, "submit_sent_at": now}
    claimed = updated(record, changes, now)
    return Plan(
        claimed, (FLUSH, Update(changes, now), Append(event(claimed, "submit_sending", now, note=note)))
    )


# What a submission answer that named another operation's job still records about itself.
SUBMIT_ANSWER_FACTS = frozenset({"last_http_status", "last_http_at", "provider_request_id"})


def finish_plan(
    record: OperationRecord,
    *,
    owner: str | None,
    changes: Mapping[str, object],
    kind: str,
    at: float,
    note: str | None,
    payload_extra: Mapping[str, object] | None,
    job_holder: OperationRecord | None = None,
) -> Plan:
    """Record what a submission led to (not applied: the guard did not hold).

    With `owner`, only while that call holds the submission lease, which is
    released; without one, only while the operation is still submitting with
    nothing in flight (a stop decided from a read outside the transaction must
    not land on a submission another process claimed since), and a stale lease
    is cleared too. `job_holder`: the operation holding the job the provider
    named (one job, one budget) — when it is another, this submission adopts
    nothing and stops.
    """
    if record.status != Status.SUBMITTING:
        return refused(record)
    if owner is None and lease_busy(record, at):
        return refused(record)
    if owner is not None and record.lease_owner != owner:
        return refused(record)
    released: dict[str, object] = {**changes, "lease_owner": None, "lease_expires_at": None}
    job_id = changes.get("provider_job_id")
    if job_id is not None and job_holder is not None and job_holder.operation_id != record.operation_id:
        kept = {k: v for k, v in changes.items() if k in SUBMIT_ANSWER_FACTS}
        other = job_holder.owner != record.owner
        released = {
            **kept,
            **duplicate_changes(job_holder.operation_id, str(job_id), at=at, another_principal=other),
        }
        released["provider_job_id"] = job_id
        kind, note = "stopped", str(released["stop_detail"])
    after = updated(record, released, at)
    return Plan(
        after, (FLUSH, Update(released, at), Append(event(after, kind, at, note=note, extra=payload_extra)))
    )


# -- what people decide ----------------------------------------------------------------------------


def extension_plan(
    record: OperationRecord,
    *,
    bound_version: int,
    changes: Mapping[str, object],
    at: float,
    approval_id: str | None,
    payload_extra: Mapping[str, object],
) -> Plan:
    """Grant a new authorization, only if the operation is still as it was when the person was asked."""
    if record.version != bound_version or record.status != Status.ESCALATED:
        return refused(record)
    granted = {**changes, "extensions_used": record.extensions_used + 1}
    after = updated(record, granted, at)
    told = event(after, "extension_approved", at, note=approval_id, extra=payload_extra)
    applied: tuple[Write, ...] = ()
    if approval_id is not None:
        applied = (Execute(statements.MARK_APPROVAL_APPLIED, {"approval_id": approval_id}),)
    return Plan(after, (FLUSH, Update(granted, at), *applied, Append(told)))


_DECIDED_KIND = {
    ApprovalStatus.APPROVED: "approval_granted",
    ApprovalStatus.EXPIRED: "approval_expired",
    ApprovalStatus.VOID: "approval_void",
}


def approval_outcome(
    approval: ApprovalRecord, *, version_now: int, approve: bool, at: float
) -> ApprovalStatus:
    """A person's answer to a pending approval: expired when late, void when the operation changed
    since they were asked (an approval only), else approved or denied."""
    if at >= approval.expires_at:
        return ApprovalStatus.EXPIRED
    if approve and version_now != approval.bound_version:
        return ApprovalStatus.VOID
    return ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED


def decision_plan(
    approval: ApprovalRecord, record: OperationRecord, *, approve: bool, by: str, at: float, method: str
) -> tuple[ApprovalStatus, Plan]:
    """The approval's outcome (`approval_outcome`), and the operation's story of it."""
    status = approval_outcome(approval, version_now=record.version, approve=approve, at=at)
    kind = _DECIDED_KIND.get(status, f"{approval.kind}_denied")
    told = event(record, kind, at, note=f"{approval.approval_id} by {by}", extra={"authenticated_by": method})
    return status, Plan(record, (FLUSH, Append(told)))


def reopen_plan(
    record: OperationRecord,
    *,
    bound_version: int,
    next_check_at: float,
    at: float,
    extra: Mapping[str, object],
) -> Plan:
    """An operator reopens an operation stopped by a refusal (`job_identity.REOPENABLE`); not applied: it changed.

    Back to waiting with the same budget, deadline and counters, only while it
    is still as shown to the operator (`bound_version`) and holds its job.
    """
    if (
        record.version != bound_version
        or record.status != Status.ESCALATED
        or record.stop_reason not in REOPENABLE
        or record.provider_job_id is None
        or record.duplicate_of is not None
    ):
        return refused(record)
    changes = {
        "status": Status.WAITING,
        "stop_reason": None,
        "stop_detail": None,
        "stopped_at": None,
        "next_check_at": next_check_at,
        "delay_source": DelaySource.MANUAL_EXTENSION,
        "fleet_slot_at": None,
        "lease_owner": None,
        "lease_expires_at": None,
    }
    after = updated(record, changes, at)
    told = event(after, "reopened", at, note=str(extra.get("reason")), extra=extra)
    return Plan(after, (FLUSH, Update(changes, at), Append(told)))


def followup_plan(
    record: OperationRecord,
    followup: FollowupRecord,
    *,
    operation_changes: Mapping[str, object] | None,
    expect_version: int | None,
) -> Plan:
    """One follow-up recorded with its story, the operation changed with it, and the approval it used
    marked so.

    The follow-up was sent, so it is always recorded; only `operation_changes` wait on the operation
    being still at `expect_version` (not applied: it moved meanwhile, and its story says the change
    was not made).
    """
    writes: list[Write] = [FLUSH]
    at = followup.requested_at
    applied = True
    note = followup.note
    if operation_changes:
        if record.version == expect_version:
            writes.append(Update(operation_changes, at))
            record = updated(record, operation_changes, at)
        else:
            applied = False
            moved = f"the operation changed since (version {expect_version} → {record.version}): not changed"
            note = moved if note is None else f"{note}; {moved}"
    writes.append(Execute(statements.INSERT_FOLLOWUP, followup.__dict__))
    if followup.approval_id is not None:
        used = {"note": f"used by {followup.followup_id}", "approval_id": followup.approval_id}
        writes.append(Execute(statements.MARK_APPROVAL_USED, used))
    extra = {
        "followup_id": followup.followup_id,
        "http_status": followup.http_status,
        "approval_id": followup.approval_id,
    }
    kind = f"{followup.kind}_{followup.status}"
    writes.append(Append(event(record, kind, at, note=note, extra=extra)))
    return Plan(record, tuple(writes), applied=applied)


def policy_change(
    stored: Sequence[object] | None, policy: ApprovalPolicy, *, at: float, by: str
) -> AuditEvent | None:
    """The chain's row telling that the approval policy changed from `stored` (its row as read) to
    `policy`, by `by`; None when nothing changed (a server writing the same policy again)."""
    try:
        was = None if stored is None else ApprovalPolicy.from_row(stored).facts()
    except ConfigError:
        was = {"unreadable": True}  # a row edited into nonsense, now replaced
    now = policy.facts()
    if was == now:
        return None
    payload = {
        "decision": POLICY_CHANGED,
        "note": f"approval policy changed by {by}",
        "before": was,
        "after": now,
    }
    return AuditEvent(REKEY_OPERATION, at, POLICY_CHANGED, payload)


def note_plan(
    record: OperationRecord,
    kind: str,
    at: float,
    *,
    note: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> Plan:
    """One audit row about the operation as it is (after its pending refusals)."""
    return Plan(record, (FLUSH, Append(event(record, kind, at, note=note, extra=extra))))


def question_plan(
    record: OperationRecord, *, approval_id: str, kind: str, request: Mapping[str, object], at: float
) -> Plan:
    """A question put to a person about the operation as `record` shows it (`approval_pending`)."""
    extra = {"request": dict(request), "approval_kind": str(kind)}
    return note_plan(record, "approval_pending", at, note=approval_id, extra=extra)


# -- webhook wake-ups ------------------------------------------------------------------------------


def woken_at(record: OperationRecord, now: float) -> float:
    """When a webhook's wake-up moves the next allowed check to: now, or the earliest allowed request if later."""
    return not_before(now, record.not_before_at)


def may_wake(record: OperationRecord, now: float) -> bool:
    """Whether a verified webhook may bring this operation's next check forward (to `woken_at`).

    A hint moves the next allowed check only forward: while waiting, to the later
    of now and the earliest allowed request (`not_before_at`: a Retry-After, a
    timed-out request) when that is before the planned time; never past a
    deadline, never on a booked fleet slot (the check would be refused anyway),
    never while a request is in flight (its answer sets the schedule).
    """
    return (
        record.status == Status.WAITING
        and woken_at(record, now) < record.next_check_at
        and record.delay_source != DelaySource.FLEET_PACING
        and not reaches_deadline(record, now)
        and not lease_busy(record, now)
    )


def wake_plan(record: OperationRecord, *, now: float, event_id: str, event_type: str) -> Plan | None:
    """A webhook's wake-up of one operation (None: `may_wake` says no): `next_check_at = woken_at`."""
    if not may_wake(record, now):
        return None
    at = woken_at(record, now)
    changes = {"next_check_at": at, "woken_at": at}
    extra = {"event_id": event_id, "event_type": event_type, "delay_source": DelaySource.PROVIDER_WEBHOOK}
    woken = updated(record, changes, now)
    return Plan(
        woken, (FLUSH, Update(changes, now), Append(event(woken, "woken_by_webhook", now, extra=extra)))
    )
