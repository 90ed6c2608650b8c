"""One audit row before it is stored: what it says, and how it links to the chain.

Pure functions, shared by every engine. The payload of a controller decision is
built here (every decision field, null where it does not apply), and so is the
row's place in the chain: given the head the engine read inside its write
transaction, `link` returns the row to insert (seq, previous hash, hash). The
engine reads the head and inserts the row in that same transaction, so
appends from several processes never fork the chain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from pollwarden.audit.chain import (
    CHAIN,
    GENESIS_HASH,
    OPERATION_LINK,
    REKEY_KIND,
    AuditKeyError,
    canonical_json,
    format_timestamp,
    hashed_middle,
    key_mismatch,
    row_hash,
)
from pollwarden.core.records import OperationRecord
from pollwarden.core.timefmt import iso, to_datetime
from pollwarden.core.vocabulary import Outcome, Status

# A looping agent's refused calls become one audit row per this many calls (or
# one per decision in between), so the audit cannot grow without bound.
REFUSALS_PER_SUMMARY = 100

# The audit kind of a summary of refused calls, by what the agent was told.
REFUSAL_SUMMARY_KIND: dict[Outcome, str] = {
    Outcome.NOT_YET: "not_yet_summary",
    Outcome.STOPPED: "stopped_summary",
}


def decision_payload(
    record: OperationRecord, *, kind: str, outcome: Outcome | None, note: str | None = None
) -> dict[str, object]:
    """The audit payload of one decision: every decision field, null where it does not apply."""
    waiting = record.status == Status.WAITING
    return {
        "decision": kind,
        "principal": record.owner,
        "outcome": outcome,
        "status": record.status,
        "state": record.state,
        "category": record.category,
        "stop_reason": record.stop_reason,
        "stop_detail": record.stop_detail,
        "next_check_at": iso(record.next_check_at) if waiting else None,
        "delay_source": record.delay_source if waiting else None,
        "retry_after_seconds": record.retry_after_seconds,
        "status_requests_used": record.status_requests_used,
        "max_status_requests": record.max_status_requests,
        "transport_failures_used": record.transport_failures_used,
        "max_transport_failures": record.max_transport_failures,
        "rate_limited_used": record.rate_limited_used,
        "deadline_at": iso(record.deadline_at),
        "business_deadline_at": iso(record.business_deadline_at),
        "http_status": record.last_http_status,
        "request_sent_at": iso(record.request_sent_at),
        "submit_sent_at": iso(record.submit_sent_at),
        "answered_at": iso(record.last_http_at),
        "provider_request_id": record.provider_request_id,
        "provider_job_id": record.provider_job_id,
        "rejected_hints": [],
        "note": note,
    }


@dataclass(frozen=True)
class PendingRefusals:
    """Refused calls counted on an operation and not yet in the audit (all of one outcome)."""

    count: int
    outcome: Outcome | None
    first_at: float | None
    last_at: float | None

    def must_flush_before(self, outcome: Outcome) -> bool:
        """Whether counting one more refusal of `outcome` first writes the pending summary."""
        return self.count > 0 and self.outcome != outcome

    def full_after_one_more(self, outcome: Outcome) -> bool:
        """Whether one more refusal of `outcome` completes a summary row."""
        counted = 0 if self.must_flush_before(outcome) else self.count
        return counted + 1 >= REFUSALS_PER_SUMMARY


NO_REFUSALS = PendingRefusals(0, None, None, None)


@dataclass(frozen=True)
class AuditEvent:
    """One decision to append: about which operation, when, what kind, what it says."""

    operation_id: str
    at: float
    kind: str
    payload: Mapping[str, object]


def event(
    record: OperationRecord,
    kind: str,
    at: float,
    *,
    outcome: Outcome | None = None,
    note: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> AuditEvent:
    """The audit row of one decision about `record`, with `extra` fields added to the payload."""
    payload = decision_payload(record, kind=kind, outcome=outcome, note=note)
    if extra:
        payload.update(extra)
    return AuditEvent(record.operation_id, at, kind, payload)


def refusal_summary(record: OperationRecord, pending: PendingRefusals) -> AuditEvent:
    """The one row that tells a run of refused calls: how many, of which kind, from when to when."""
    outcome = pending.outcome or Outcome.NOT_YET
    kind = REFUSAL_SUMMARY_KIND[outcome]
    return event(
        record,
        kind,
        pending.last_at if pending.last_at is not None else record.updated_at,
        outcome=outcome,
        extra={"count": pending.count, "first_at": iso(pending.first_at), "last_at": iso(pending.last_at)},
    )


def lease_recovered(before: OperationRecord, at: float) -> AuditEvent:
    """Make a check that never finished (its process died, say) visible when its expired lease is taken."""
    note = (
        f"the check holding status request {before.status_requests_used} did not finish within its lease "
        f"(expired {iso(before.lease_expires_at)}; its process may have stopped). That request stays "
        "counted: it may have reached the provider. It is never re-sent"
    )
    return event(before, "lease_recovered", at, note=note)


@dataclass(frozen=True)
class ChainHead:
    """The last row of the one chain, as read inside the appending transaction (`seq`: its place)."""

    seq: int
    hash: str
    keyed: bool


@dataclass(frozen=True)
class OperationChain:
    """An operation's own chain as its row records it (PostgreSQL): how many rows, the last one's hash."""

    rows: int
    hash: str


@dataclass(frozen=True)
class ChainRow:
    """One audit row ready to insert: `position` is the number its hash covers (`pollwarden.audit.verify`).

    A chain row's position is its place in the one chain (and its seq, on SQLite); an operation
    row's, its place among its operation's rows.
    """

    position: int
    operation_id: str
    at: str
    kind: str
    payload: str
    prev_hash: str
    hash: str
    keyed: bool
    link: str = CHAIN


@dataclass(frozen=True)
class UnlinkedRow:
    """One audit row's text before its place in the chain is known (an operation's first row, which
    PostgreSQL links and hashes in the statement that inserts it: `store.postgres.sql.OPEN_OPERATION`)."""

    operation_id: str
    at: str
    kind: str
    payload: str
    middle: str


def unlinked(entry: AuditEvent) -> UnlinkedRow:
    """The stored text of `entry` and the place-free middle of its hashed message (`audit.hashed_middle`)."""
    at = format_timestamp(to_datetime(entry.at))
    payload = canonical_json(dict(entry.payload))
    middle = hashed_middle(operation_id=entry.operation_id, at=at, kind=entry.kind, payload=payload)
    return UnlinkedRow(entry.operation_id, at, entry.kind, payload, middle)


def link(head: ChainHead | None, entry: AuditEvent, *, key: bytes | None) -> ChainRow:
    """The chain row that appends `entry` after `head` (None: the chain is empty)."""
    return chain_row(
        head,
        operation_id=entry.operation_id,
        at=to_datetime(entry.at),
        kind=entry.kind,
        payload=entry.payload,
        key=key,
    )


def link_in_operation(chain: OperationChain, entry: AuditEvent, *, key: bytes | None) -> ChainRow:
    """The operation row that appends `entry` after its operation's last row (`chain`, never empty).

    Whether `key` may extend the chain is the caller's to check against the chain's head
    (`audit.key_mismatch`): an operation's chain is keyed exactly when the one chain is.
    """
    at_text = format_timestamp(to_datetime(entry.at))
    payload_text = canonical_json(dict(entry.payload))
    position = chain.rows + 1
    digest = row_hash(
        prev_hash=chain.hash,
        seq=position,
        operation_id=entry.operation_id,
        at=at_text,
        kind=entry.kind,
        payload=payload_text,
        key=key,
    )
    return ChainRow(
        position,
        entry.operation_id,
        at_text,
        entry.kind,
        payload_text,
        chain.hash,
        digest,
        key is not None,
        OPERATION_LINK,
    )


def chain_row(
    head: ChainHead | None,
    *,
    operation_id: str,
    at: datetime,
    kind: str,
    payload: Mapping[str, object],
    key: bytes | None,
) -> ChainRow:
    """The chain row that appends one decision after `head`: its place, the previous hash and its own hash.

    `at` must be timezone-aware (``ValueError`` otherwise). Raises `AuditKeyError`
    when the head is keyed and `key` is None (continuing a keyed chain unkeyed
    would make every later row unverifiable), and when `key` is given but the
    head is unkeyed and this is not the re-key row (a keyed server never extends
    an unkeyed chain silently).
    """
    at_text = format_timestamp(at)
    if head is None:
        position, prev_hash = 1, GENESIS_HASH
    else:
        problem = key_mismatch(head.seq, head.keyed, key)
        # The explicit re-key row is the one keyed row allowed on an unkeyed head.
        if problem is not None and not (kind == REKEY_KIND and key is not None):
            raise AuditKeyError(problem)
        position, prev_hash = head.seq + 1, head.hash
    payload_text = canonical_json(dict(payload))
    digest = row_hash(
        prev_hash=prev_hash,
        seq=position,
        operation_id=operation_id,
        at=at_text,
        kind=kind,
        payload=payload_text,
        key=key,
    )
    return ChainRow(position, operation_id, at_text, kind, payload_text, prev_hash, digest, key is not None)
