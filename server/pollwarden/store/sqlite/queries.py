"""Every SQL statement the SQLite engine runs, by name.

Nothing else in pollwarden writes SQL for this engine (the migrations hold
the DDL; the offline audit readers open the file read-only themselves). A
write that must not race is guarded here, in its WHERE clause, and returns the
row it wrote (`RETURNING`), so no caller reads the row again. Updates whose
set of columns depends on the decision are built here from validated field
names (`update_operation`), never from text a caller passes in.
"""

from __future__ import annotations

from functools import cache

from pollwarden.records import APPROVAL_COLUMNS, FOLLOWUP_COLUMNS, OPERATION_COLUMNS
from pollwarden.stop import BUDGET_LEFT_SQL, deadline_open_sql
from pollwarden.store.rows import NEW_OPERATION_COLUMNS, REFUSAL_COLUMNS

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

# What every read (and every RETURNING) of an operation returns: the record, then its refusal counters.
OPERATION_ROW = ", ".join((*OPERATION_COLUMNS, *REFUSAL_COLUMNS))

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

INSERT_OPERATION = (
    f"INSERT INTO operations ({', '.join(NEW_OPERATION_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in NEW_OPERATION_COLUMNS)}) "
    f"ON CONFLICT (operation_id) DO NOTHING RETURNING {OPERATION_ROW}"
)

# The operation that holds a job (one job, one budget: pollwarden.job_identity) for one principal
# (issue 19: principals never see each other's operations). Served by the partial UNIQUE index
# operations_one_per_job, whose condition this WHERE repeats.
SELECT_JOB_OWNER = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE provider = :provider AND account_context = :account_context "
    "AND provider_job_id = :provider_job_id AND duplicate_of IS NULL AND owner = :owner"
)

# The latest operation of a payload still in flight (pollwarden.job_identity: one payload in flight is one
# job): submitting (held for a person too) or waiting; the principal's own (issue 19: principals never see
# each other's operations). Served by operations_by_fingerprint.
SELECT_PAYLOAD_IN_FLIGHT = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE request_fingerprint = :request_fingerprint AND owner = :owner "
    "AND status IN ('submitting', 'waiting') AND submit_payload_json IS NOT NULL AND duplicate_of IS NULL "
    "ORDER BY created_at DESC, operation_id LIMIT 1"
)

# The gate's RESERVE as one statement, guarded by the same conditions (pollwarden.stop's, and the
# version the gate read); proven to agree with `gate.may_reserve` (test_stop_policy_agrees_with_sql).
RESERVE = (
    "UPDATE operations SET status_requests_used = status_requests_used + 1, fleet_slot_at = NULL, "
    "lease_owner = :owner, lease_expires_at = :lease_expires_at, version = version + 1, updated_at = :now "
    "WHERE operation_id = :operation_id AND version = :version AND status = 'waiting' "
    f"AND {deadline_open_sql(':now')} AND :now >= next_check_at AND {BUDGET_LEFT_SQL} "
    f"AND (lease_owner IS NULL OR lease_expires_at <= :now) RETURNING {OPERATION_ROW}"
)

# Fair shares (issue 19): the future fleet slots one principal holds for a provider, and the
# check that waits for the earliest of them instead of booking one more.
PRINCIPAL_BOOKED_SLOTS = (
    "SELECT count(*), min(fleet_slot_at) FROM operations WHERE provider = :provider AND owner = :owner "
    "AND fleet_slot_at > :now AND status = 'waiting' AND operation_id <> :operation_id"
)
COUNT_ACTIVE_OF_OWNER = (
    "SELECT count(*) FROM operations WHERE owner = ? AND status IN ('waiting', 'submitting')"
)
COUNT_CREATED_SINCE_BY_OWNER = "SELECT count(*) FROM operations WHERE owner = ? AND created_at > ?"

# One refused call (not_yet or stopped). The version guard: the operation is still as the gate read it
# (every change but this counter bumps the version), so only the counters need returning.
COUNT_REFUSAL = (
    "UPDATE operations SET refused_count = refused_count + 1, refused_outcome = :outcome, "
    "refused_first_at = COALESCE(refused_first_at, :at), refused_last_at = :at "
    "WHERE operation_id = :operation_id AND version = :version "
    "AND (refused_outcome IS NULL OR refused_outcome = :outcome) "
    f"RETURNING {', '.join(REFUSAL_COLUMNS)}"
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


@cache
def update_operation(columns: tuple[str, ...]) -> str:
    """`UPDATE … SET <columns>` guarded by the version read (`rows.writable` columns only); parameters
    are named `c_<column>`, `version`, `at` and `operation_id`. A row back means the guard held."""
    sets = "".join(f"{c} = :c_{c}, " for c in columns)
    return (
        f"UPDATE operations SET {sets}version = version + 1, updated_at = :at "
        "WHERE operation_id = :operation_id AND version = :version RETURNING 1"
    )


# -- fleet pacing ----------------------------------------------------------------------------------

SELECT_FLEET_TAT = "SELECT tat FROM fleet_buckets WHERE provider = ?"
UPSERT_FLEET_TAT = "INSERT INTO fleet_buckets (provider, tat) VALUES (?, ?) ON CONFLICT(provider) DO UPDATE SET tat = excluded.tat"

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
# The job's waiting operations, which a webhook may wake (`plans.may_wake` decides which).
WAITING_ON_JOB = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE provider = :provider AND provider_job_id = :job_id "
    "AND status = 'waiting' ORDER BY operation_id"
)
