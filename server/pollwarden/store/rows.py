"""The rows both engines read and write: column lists, and an operation row as the engines know it.

One module for both: `StoredOperation` is what a transaction read of an
operation (the record, the refused calls counted on it and not yet audited,
and on PostgreSQL its own audit chain's head); the column lists say which
fields a new operation has and which a decision may change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pollwarden.audit.chain import REKEY_OPERATION
from pollwarden.audit.entry import NO_REFUSALS, OperationChain, PendingRefusals
from pollwarden.core.records import OPERATION_COLUMNS, OperationRecord
from pollwarden.core.vocabulary import Outcome

REFUSAL_COLUMNS = ("refused_count", "refused_outcome", "refused_first_at", "refused_last_at")
# The operation's own audit chain (PostgreSQL, schema step 13): how many rows, and the last one's hash.
CHAIN_COLUMNS = ("audit_rows", "audit_hash")
OPERATION_ROW_WIDTH = len(OPERATION_COLUMNS)

NEW_OPERATION_COLUMNS = (
    "operation_id",
    "provider",
    "provider_job_id",
    "account_context",
    "request_fingerprint",
    "idempotency_key",
    "expected_terminal_state",
    "status",
    "started_at",
    "deadline_at",
    "business_deadline_at",
    "max_status_requests",
    "max_transport_failures",
    "max_rate_limited",
    "next_check_at",
    "delay_source",
    "submit_payload_json",
    "created_at",
    "updated_at",
    "resubmission_of",
    "owner",
)
# New columns a caller may leave out: a new operation is no resubmission unless it says so, and a
# caller that names no principal acts for the local user.
OPTIONAL_NEW_COLUMNS: Mapping[str, object] = {"resubmission_of": None, "owner": "local"}

# The fields a decision may change (never the identity, the fingerprint or the start; the version and
# `updated_at` move with every change by themselves).
MUTABLE_COLUMNS = frozenset(OPERATION_COLUMNS) - {
    "operation_id",
    "provider",
    "account_context",
    "request_fingerprint",
    "idempotency_key",
    "expected_terminal_state",
    "started_at",
    "submit_payload_json",
    "created_at",
    "updated_at",
    "version",
    "resubmission_of",
}


def new_operation_values(values: Mapping[str, object]) -> dict[str, object]:
    """A new operation's columns, the optional ones filled in; ValueError for a caller's mistake."""
    complete = {**OPTIONAL_NEW_COLUMNS, **values}
    missing = set(NEW_OPERATION_COLUMNS) - set(complete)
    extra = set(complete) - set(NEW_OPERATION_COLUMNS)
    if missing or extra:
        raise ValueError(f"a new operation needs exactly its columns (missing {missing}, unknown {extra})")
    if complete["operation_id"] == REKEY_OPERATION:
        raise ValueError(f"{REKEY_OPERATION!r} names the audit chain's own rows; no operation may use it")
    return complete


def writable(columns: Sequence[str]) -> tuple[str, ...]:
    """`columns` if a decision may change each of them; a ValueError names any other."""
    unknown = [c for c in columns if c not in MUTABLE_COLUMNS]
    if unknown:
        raise ValueError(f"not a field an operation's change may set: {', '.join(unknown)}")
    return tuple(columns)


@dataclass(frozen=True)
class StoredOperation:
    """An operation row: the record, the refused calls counted on it and not yet audited, and (on
    PostgreSQL, where each operation's audit rows form a chain of their own) that chain's head."""

    record: OperationRecord
    refusals: PendingRefusals
    chain: OperationChain | None = None


def stored(row: Sequence[Any]) -> StoredOperation:
    """A row of an engine's operation row (`OPERATION_COLUMNS`, then `REFUSAL_COLUMNS`, and on PostgreSQL
    `CHAIN_COLUMNS`) as the record, its refusal counters and its chain."""
    width = OPERATION_ROW_WIDTH
    record = OperationRecord.from_row(row[:width])
    count, outcome, first_at, last_at = row[width : width + 4]
    chain = None if len(row) == width + 4 else OperationChain(int(row[width + 4]), str(row[width + 5] or ""))
    if not count:
        return StoredOperation(record, NO_REFUSALS, chain)
    return StoredOperation(record, PendingRefusals(int(count), Outcome(outcome), first_at, last_at), chain)
