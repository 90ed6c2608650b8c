"""Every SQL statement the SQLite engine runs, by name.

Nothing else in pollwarden writes SQL for this engine (the migrations hold
the DDL; the offline audit readers open the file read-only themselves). A
write that must not race is guarded here, in its WHERE clause, and returns the
row it wrote (`RETURNING`), so no caller reads the row again. Updates whose
set of columns depends on the decision are built here from validated field
names (`update_operation`), never from text a caller passes in.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from functools import cache

from pollwarden.audit import REKEY_OPERATION
from pollwarden.records import APPROVAL_COLUMNS, FOLLOWUP_COLUMNS, OPERATION_COLUMNS
from pollwarden.stop import BUDGET_LEFT_SQL, deadline_open_sql

# -- connection and transactions -----------------------------------------------------------

BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
JOURNAL_MODE_WAL = "PRAGMA journal_mode = WAL"
SYNCHRONOUS_FULL = "PRAGMA synchronous = FULL"
SYNCHRONOUS_NORMAL = "PRAGMA synchronous = NORMAL"
FOREIGN_KEYS_ON = "PRAGMA foreign_keys = ON"


def busy_timeout(seconds: float) -> str:
    """How long a statement waits for another process's lock."""
    return f"PRAGMA busy_timeout = {int(seconds * 1000)}"


# -- operations ------------------------------------------------------------------------------

_REFUSAL_COLUMNS = ("refused_count", "refused_outcome", "refused_first_at", "refused_last_at")
# What every read (and every RETURNING) of an operation returns: the record, then its refusal counters.
OPERATION_ROW = ", ".join((*OPERATION_COLUMNS, *_REFUSAL_COLUMNS))
OPERATION_ROW_WIDTH = len(OPERATION_COLUMNS)

SELECT_OPERATION = f"SELECT {OPERATION_ROW} FROM operations WHERE operation_id = ?"

# Newest first; each variant is served by an index on (filter, created_at DESC, operation_id).
_LIST = (
    f"SELECT {OPERATION_ROW} FROM operations {{where}} ORDER BY created_at DESC, operation_id LIMIT :limit"
)
_LIST_FILTERS = {"status": "status = :status", "provider": "provider = :provider", "owner": "owner = :owner"}


@cache
def list_operations(*filters: str) -> str:
    """The listing with these filters (names from `_LIST_FILTERS`, in that order)."""
    where = " AND ".join(_LIST_FILTERS[f] for f in filters)
    return _LIST.format(where=f"WHERE {where}" if where else "")


LIST_OPERATIONS = list_operations()
LIST_OPERATIONS_BY_STATUS = list_operations("status")
LIST_OPERATIONS_BY_PROVIDER = list_operations("provider")
LIST_OPERATIONS_BY_STATUS_AND_PROVIDER = list_operations("status", "provider")

COUNT_OPERATIONS = "SELECT count(*) FROM operations"

# The operations of one request fingerprint (one payload to one provider account), newest first.
LIST_BY_FINGERPRINT = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE request_fingerprint = :fingerprint "
    "ORDER BY created_at DESC, operation_id LIMIT :limit"
)

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
# caller that names no principal acts for the local user (both engines).
OPTIONAL_NEW_COLUMNS: Mapping[str, object] = {"resubmission_of": None, "owner": "local"}


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


INSERT_OPERATION = (
    f"INSERT INTO operations ({', '.join(NEW_OPERATION_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in NEW_OPERATION_COLUMNS)}) "
    f"ON CONFLICT (operation_id) DO NOTHING RETURNING {OPERATION_ROW}"
)

# The operation that holds a job (one job, one budget: pollwarden.job_identity), whichever principal
# started it (issue 30: another principal is told only that the job is tracked). Served by the partial
# UNIQUE index operations_one_per_job, whose condition this WHERE repeats.
SELECT_JOB_OWNER = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE provider = :provider AND account_context = :account_context "
    "AND provider_job_id = :provider_job_id AND duplicate_of IS NULL"
)

# The latest operation of a payload still in flight (pollwarden.job_identity: one payload in flight is one
# job): submitting (held for a person too) or waiting; the principal's own (issue 19: principals never see
# each other's operations). Served by operations_by_fingerprint.
SELECT_PAYLOAD_IN_FLIGHT = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE request_fingerprint = :request_fingerprint AND owner = :owner "
    "AND status IN ('submitting', 'waiting') AND submit_payload_json IS NOT NULL AND duplicate_of IS NULL "
    "ORDER BY created_at DESC, operation_id LIMIT 1"
)

# An operator reopens a refused operation (pollwarden reopen): only as it was shown to them.
REOPEN = (
    "UPDATE operations SET status = 'waiting', stop_reason = NULL, stop_detail = NULL, stopped_at = NULL, "
    "next_check_at = :next_check_at, delay_source = 'manual_extension', fleet_slot_at = NULL, "
    "lease_owner = NULL, lease_expires_at = NULL, version = version + 1, updated_at = :at "
    "WHERE operation_id = :operation_id AND version = :version AND status = 'escalated' "
    "AND stop_reason IN ('authorization_denied', 'integration_failure', 'account_context_changed') "
    f"AND provider_job_id IS NOT NULL AND duplicate_of IS NULL RETURNING {OPERATION_ROW}"
)

# The gate's RESERVE, guarded by the same conditions (pollwarden.stop's, and the version the gate read).
RESERVE = (
    "UPDATE operations SET status_requests_used = status_requests_used + 1, fleet_slot_at = NULL, "
    "lease_owner = :owner, lease_expires_at = :lease_expires_at, version = version + 1, updated_at = :now "
    "WHERE operation_id = :operation_id AND version = :version AND status = 'waiting' "
    f"AND {deadline_open_sql(':now')} AND :now >= next_check_at AND :now >= coalesce(not_before_at, :now) AND {BUDGET_LEFT_SQL} "
    f"AND (lease_owner IS NULL OR lease_expires_at <= :now) RETURNING {OPERATION_ROW}"
)

# The provider's shared pace was used up: the operation holds the next free slot instead.
BOOK_FLEET_SLOT = (
    "UPDATE operations SET fleet_slot_at = :slot_at, next_check_at = :slot_at, "
    "delay_source = 'fleet_pacing', version = version + 1, updated_at = :now "
    f"WHERE operation_id = :operation_id AND version = :version AND status = 'waiting' RETURNING {OPERATION_ROW}"
)

# Fair shares (issue 19): the future fleet slots one principal holds for a provider, and the
# check that waits for the earliest of them instead of booking one more.
PRINCIPAL_BOOKED_SLOTS = (
    "SELECT count(*), min(fleet_slot_at) FROM operations WHERE provider = :provider AND owner = :owner "
    "AND fleet_slot_at > :now AND status = 'waiting' AND operation_id <> :operation_id"
)
WAIT_FOR_OWN_SLOT = (
    "UPDATE operations SET fleet_slot_at = NULL, next_check_at = :at, "
    "delay_source = 'fleet_pacing', version = version + 1, updated_at = :now "
    f"WHERE operation_id = :operation_id AND version = :version AND status = 'waiting' RETURNING {OPERATION_ROW}"
)
COUNT_ACTIVE_OF_OWNER = (
    "SELECT count(*) FROM operations WHERE owner = ? AND status IN ('waiting', 'submitting')"
)
COUNT_CREATED_SINCE_BY_OWNER = "SELECT count(*) FROM operations WHERE owner = ? AND created_at > ?"

# The gate's STOP (deadline passed, budget used): only while no live request holds the lease.
STOP_BEFORE_REQUEST = (
    "UPDATE operations SET status = :status, stop_reason = :stop_reason, stop_detail = :stop_detail, "
    "stopped_at = :at, lease_owner = NULL, lease_expires_at = NULL, version = version + 1, updated_at = :at "
    "WHERE operation_id = :operation_id AND version = :version AND status = 'waiting' "
    f"AND (lease_owner IS NULL OR lease_expires_at <= :at) RETURNING {OPERATION_ROW}"
)

# One refused call (not_yet or stopped). The version guard: the operation is still as the gate read it
# (every change but this counter bumps the version), so only the counters need returning.
COUNT_REFUSAL = (
    "UPDATE operations SET refused_count = refused_count + 1, refused_outcome = :outcome, "
    "refused_first_at = COALESCE(refused_first_at, :at), refused_last_at = :at "
    "WHERE operation_id = :operation_id AND version = :version "
    "AND (refused_outcome IS NULL OR refused_outcome = :outcome) "
    f"RETURNING {', '.join(_REFUSAL_COLUMNS)}"
)
SELECT_PENDING_REFUSALS = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE operation_id = ? AND refused_count > 0"
)
SELECT_ALL_PENDING_REFUSALS = f"SELECT {OPERATION_ROW} FROM operations WHERE refused_count > 0"
ANY_PENDING_REFUSALS = "SELECT 1 FROM operations WHERE refused_count > 0 LIMIT 1"
ANY_PENDING_REFUSALS_OF = "SELECT 1 FROM operations WHERE operation_id = ? AND refused_count > 0"
RESET_REFUSALS = (
    "UPDATE operations SET refused_count = 0, refused_outcome = NULL, refused_first_at = NULL, "
    "refused_last_at = NULL WHERE operation_id = ?"
)

# A resubmission a person has not approved is never claimed for sending.
_NOT_HELD = "AND (resubmission_of IS NULL OR resubmission_approved_by IS NOT NULL) "
CLAIM_SUBMISSION = (
    "UPDATE operations SET lease_owner = :owner, lease_expires_at = :lease_expires_at, submit_sent_at = :now, "
    "version = version + 1, updated_at = :now "
    "WHERE operation_id = :operation_id AND status = 'submitting' AND lease_owner IS NULL "
    f"{_NOT_HELD}RETURNING {OPERATION_ROW}"
)
# With idempotency an expired lease (a call that died mid-send) may be taken over: a resend is safe.
CLAIM_SUBMISSION_TAKING_OVER = (
    "UPDATE operations SET lease_owner = :owner, lease_expires_at = :lease_expires_at, submit_sent_at = :now, "
    "version = version + 1, updated_at = :now "
    "WHERE operation_id = :operation_id AND status = 'submitting' "
    f"AND (lease_owner IS NULL OR lease_expires_at <= :now) {_NOT_HELD}RETURNING {OPERATION_ROW}"
)

# The fields a decision may change (never the identity, the fingerprint or the start).
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


class Guard(StrEnum):
    """The condition under which a decided change may be written."""

    LEASE_HELD = "lease_owner = :guard_owner"
    SUBMISSION_LEASE_HELD = "status = 'submitting' AND lease_owner = :guard_owner"
    SUBMITTING = "status = 'submitting'"
    ESCALATED_AS_ASKED = "version = :guard_version AND status = 'escalated'"
    UNCHANGED = "version = :guard_version"


# Counted in SQL alongside a guarded change.
_ALSO: dict[Guard, str] = {Guard.ESCALATED_AS_ASKED: "extensions_used = extensions_used + 1, "}


@cache
def update_operation(columns: tuple[str, ...], guard: Guard) -> str:
    """`UPDATE … SET <columns> … WHERE <guard> RETURNING` the row; parameters are named `c_<column>`.

    `columns` must be fields a decision may change (a ValueError names any other).
    """
    unknown = [c for c in columns if c not in MUTABLE_COLUMNS]
    if unknown:
        raise ValueError(f"not a field an operation's change may set: {', '.join(unknown)}")
    sets = "".join(f"{c} = :c_{c}, " for c in columns)
    return (
        f"UPDATE operations SET {sets}{_ALSO.get(guard, '')}version = version + 1, updated_at = :at "
        f"WHERE operation_id = :operation_id AND {guard.value} RETURNING {OPERATION_ROW}"
    )


# -- fleet pacing ----------------------------------------------------------------------------------

SELECT_FLEET_TAT = "SELECT tat, sent_tat FROM fleet_buckets WHERE provider = ?"
UPSERT_FLEET_TAT = (
    "INSERT INTO fleet_buckets (provider, tat, sent_tat) VALUES (?, ?, ?) "
    "ON CONFLICT(provider) DO UPDATE SET tat = excluded.tat, sent_tat = excluded.sent_tat"
)

# -- approvals -------------------------------------------------------------------------------

APPROVAL_ROW = ", ".join(APPROVAL_COLUMNS)
SELECT_APPROVAL = f"SELECT {APPROVAL_ROW} FROM approvals WHERE approval_id = ?"
_LIST_APPROVALS = f"SELECT {APPROVAL_ROW} FROM approvals {{where}} ORDER BY asked_at DESC"
LIST_APPROVALS = _LIST_APPROVALS.format(where="")
LIST_APPROVALS_BY_STATUS = _LIST_APPROVALS.format(where="WHERE status = :status")
LIST_APPROVALS_OF = _LIST_APPROVALS.format(where="WHERE operation_id = :operation_id")
LIST_APPROVALS_OF_BY_STATUS = _LIST_APPROVALS.format(
    where="WHERE operation_id = :operation_id AND status = :status"
)
# An extension decision an operator took (or a question nobody answered in time) waits to be applied.
HAS_DUE_EXTENSION_APPROVALS = (
    "SELECT 1 FROM approvals WHERE operation_id = ? AND kind IN ('extension', 'reopen') "
    "AND (status IN ('approved', 'denied') OR (status = 'pending' AND expires_at <= ?)) LIMIT 1"
)
FIND_PENDING_APPROVAL = (
    f"SELECT {APPROVAL_ROW} FROM approvals WHERE operation_id = ? AND kind = ? AND bound_version = ? "
    "AND request_json = ? AND status = 'pending' AND expires_at > ?"
)
INSERT_APPROVAL = (
    "INSERT INTO approvals (approval_id, operation_id, kind, status, request_json, bound_version, asked_at, "
    f"expires_at) VALUES (?, ?, ?, 'pending', ?, ?, ?, ?) RETURNING {APPROVAL_ROW}"
)
DECIDE_APPROVAL = (
    "UPDATE approvals SET status = ?, decided_at = ?, decided_by = ?, decided_method = ?, decision_signature = ? "
    "WHERE approval_id = ? AND status = 'pending' "
    f"RETURNING {APPROVAL_ROW}"
)
# Guarded: only from the statuses the target may follow (vocabulary.APPROVAL_CLOSABLE_FROM), so a late or concurrent close
# never turns `applied` into `void`, nor a person's `approved` into `expired`.
CLOSE_APPROVAL = (
    "UPDATE approvals SET status = ?, note = ?, decided_at = COALESCE(decided_at, ?) WHERE approval_id = ? "
    f"AND status IN (SELECT value FROM json_each(?)) RETURNING {APPROVAL_ROW}"
)

MARK_APPROVAL_APPLIED = "UPDATE approvals SET status = 'applied', note = 'applied' WHERE approval_id = ?"
MARK_APPROVAL_USED = (
    "UPDATE approvals SET status = 'applied', note = ? WHERE approval_id = ? AND status = 'approved'"
)

# -- follow-ups --------------------------------------------------------------------------------

FOLLOWUP_ROW = ", ".join(FOLLOWUP_COLUMNS)
INSERT_FOLLOWUP = (
    f"INSERT INTO followups ({FOLLOWUP_ROW}) VALUES ({', '.join('?' for _ in FOLLOWUP_COLUMNS)}) "
    f"RETURNING {FOLLOWUP_ROW}"
)
LIST_FOLLOWUPS = f"SELECT {FOLLOWUP_ROW} FROM followups WHERE operation_id = ? ORDER BY requested_at, rowid"

# -- the audit chain ----------------------------------------------------------------------------

AUDIT_HEAD = "SELECT seq, hash, keyed FROM audit ORDER BY seq DESC LIMIT 1"
INSERT_AUDIT_ROW = "INSERT INTO audit (seq, operation_id, at, kind, payload, prev_hash, hash, keyed) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"

# -- webhook wake-ups (issue 21) ---------------------------------------------------------------

PRUNE_WEBHOOK_EVENTS = "DELETE FROM webhook_events WHERE provider = ? AND received_at < ?"
# Insert-or-ignore: a row back means the event id is new.
REMEMBER_WEBHOOK_EVENT = (
    "INSERT INTO webhook_events (provider, event_id, received_at) VALUES (?, ?, ?) "
    "ON CONFLICT (provider, event_id) DO NOTHING RETURNING event_id"
)
KNOWS_JOB = "SELECT 1 FROM operations WHERE provider = ? AND provider_job_id = ? LIMIT 1"
# A hint moves the next allowed check to now, and only forward: while waiting, before the planned
# time, never past a deadline, never before the earliest allowed request (`not_before_at`: a
# Retry-After, a timed-out request; pollwarden.schedule.not_before) nor a booked fleet slot (the
# check would be refused anyway), never while a request is in flight (its answer sets the schedule).
_WOKEN_AT = "max(:now, coalesce(not_before_at, :now))"
WAKE = (
    f"UPDATE operations SET next_check_at = {_WOKEN_AT}, woken_at = {_WOKEN_AT}, version = version + 1, "
    "updated_at = :now WHERE provider = :provider AND provider_job_id = :job_id AND status = 'waiting' "
    f"AND {_WOKEN_AT} < next_check_at AND delay_source <> 'fleet_pacing' "
    f"AND {deadline_open_sql(':now')} "
    f"AND (lease_owner IS NULL OR lease_expires_at <= :now) RETURNING {OPERATION_ROW}"
)

# The approval policy (`pollwarden.approval_policy`): one row, raised without a read in between.
APPROVAL_POLICY = "SELECT require_operator_key, channels, operator_keys FROM approval_policy WHERE id = 1"
WRITE_APPROVAL_POLICY = (
    "UPDATE approval_policy SET require_operator_key = ?, channels = ?, operator_keys = ?, updated_at = ?, "
    "updated_by = ? WHERE id = 1 AND (require_operator_key = 0 OR NOT ?)"
)
