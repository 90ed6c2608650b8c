"""Every SQL statement both engines run, written once, with named parameters (``:name``).

SQLite runs them as they are; the PostgreSQL engine translates the parameters
to psycopg's ``%(name)s`` (`postgres.sql.dialect`). A statement whose text
must differ between the dialects (an upsert, a lock, a JSON list) is written
in its engine's own `sql` module, beside the ones only that engine runs. A
write that must not race is guarded here, in its WHERE clause.
"""

from __future__ import annotations

from functools import cache

from pollwarden.core.records import APPROVAL_COLUMNS, FOLLOWUP_COLUMNS, OPERATION_COLUMNS
from pollwarden.rules.stop import BUDGET_LEFT_SQL, deadline_open_sql
from pollwarden.store.rows import NEW_OPERATION_COLUMNS, REFUSAL_COLUMNS

# -- operations ------------------------------------------------------------------------------------

# What a read of an operation returns on both engines: the record, then its refusal counters.
OPERATION_ROW = ", ".join((*OPERATION_COLUMNS, *REFUSAL_COLUMNS))

SELECT_OPERATION = f"SELECT {OPERATION_ROW} FROM operations WHERE operation_id = :operation_id"

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


COUNT_OPERATIONS = "SELECT count(*) FROM operations"

# The operations of one request fingerprint (one payload to one provider account), newest first.
LIST_BY_FINGERPRINT = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE request_fingerprint = :fingerprint "
    "ORDER BY created_at DESC, operation_id LIMIT :limit"
)
COUNT_ACTIVE_OF_OWNER = (
    "SELECT count(*) FROM operations WHERE owner = :owner AND status IN ('waiting', 'submitting')"
)
COUNT_CREATED_SINCE_BY_OWNER = "SELECT count(*) FROM operations WHERE owner = :owner AND created_at > :since"

NEW_OPERATION_VALUES = ", ".join(f":{c}" for c in NEW_OPERATION_COLUMNS)
# Nothing inserted when the id, or the job (the partial UNIQUE index: one job, one budget), is taken.
INSERT_OPERATION = (
    f"INSERT INTO operations ({', '.join(NEW_OPERATION_COLUMNS)}) VALUES ({NEW_OPERATION_VALUES}) "
    f"ON CONFLICT DO NOTHING RETURNING {OPERATION_ROW}"
)

# The operation that holds a job (one job, one budget: pollwarden.rules.job_identity), whichever principal
# started it (issue 30: the provider sees one caller and one job; another principal is told only that
# the job is tracked). Served by the partial UNIQUE index operations_one_per_job, whose condition this
# WHERE repeats (and which makes a second holder impossible).
SELECT_JOB_OWNER = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE provider = :provider AND account_context = :account_context "
    "AND provider_job_id = :provider_job_id AND duplicate_of IS NULL"
)

# The latest operation of a payload still in flight (pollwarden.rules.job_identity: one payload in flight is one
# job): submitting (held for a person too) or waiting; the principal's own. Served by operations_by_fingerprint.
SELECT_PAYLOAD_IN_FLIGHT = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE request_fingerprint = :request_fingerprint AND owner = :owner "
    "AND status IN ('submitting', 'waiting') AND submit_payload_json IS NOT NULL AND duplicate_of IS NULL "
    "ORDER BY created_at DESC, operation_id LIMIT 1"
)

# The gate's RESERVE as one statement, guarded by the same conditions (pollwarden.rules.stop's, and the
# version the gate read); proven to agree with `gate.may_reserve` (test_stop_policy_agrees_with_sql).
# `request_sent_at` is the reservation's time until the answer records when the request left: a request
# in flight counts as served when it was reserved (`OTHER_PRINCIPAL_FIRST`).
RESERVE = (
    "UPDATE operations SET status_requests_used = status_requests_used + 1, fleet_slot_at = NULL, "
    "request_sent_at = :now, "
    "lease_owner = :owner, lease_expires_at = :lease_expires_at, version = version + 1, updated_at = :now "
    "WHERE operation_id = :operation_id AND version = :version AND status = 'waiting' "
    f"AND {deadline_open_sql(':now')} AND :now >= next_check_at AND :now >= coalesce(not_before_at, :now) "
    f"AND {BUDGET_LEFT_SQL} "
    f"AND (lease_owner IS NULL OR lease_expires_at <= :now) RETURNING {OPERATION_ROW}"
)

# A provider's shared [fleet] pace (`pollwarden.rules.fleet_pace`): its row's two clocks.
SELECT_PACE = "SELECT tat, sent_tat FROM fleet_buckets WHERE provider = :provider"

# A fleet slot still held at `:held_since` (`fleet_pace.slot_held`): its own time, or where it was moved
# (its agent came after it and waits for the sends' clock: `fleet_pace.moved_slot`), is after it.
SLOT_HELD_SQL = (
    "(fleet_slot_at > :held_since OR (fleet_slot_at IS NOT NULL AND delay_source = 'fleet_pacing' "
    "AND next_check_at > :held_since))"
)

# No lease held at :now: none, or one that expired (its process died mid-request; the gate reads a
# missing expiry as expired too). It is recovered when the operation next reserves.
LEASE_FREE_SQL = "(lease_owner IS NULL OR coalesce(lease_expires_at, 0) <= :now)"

# An operation waiting for the pace without a slot, its agent still coming (`share_wait`'s waiting): told
# to wait for the pace until within the hold (`:due_by`; one told to come back later, its server's turn
# at the pace row busy, is not waiting yet), or due by its own schedule within the hold (its agent may
# come a little after: its own jitter, a slower path) and free to send then, as the gate's RESERVE would
# have it (budget left, deadline open, no provider Retry-After), with no request in flight.
WAITING_FOR_PACE_SQL = (
    f"status = 'waiting' AND {LEASE_FREE_SQL} AND fleet_slot_at IS NULL AND next_check_at >= :held_since "
    "AND ((delay_source = 'fleet_pacing' AND next_check_at <= :due_by) OR (next_check_at <= :now "
    f"AND :now >= coalesce(not_before_at, :now) AND {deadline_open_sql(':now')} AND {BUDGET_LEFT_SQL}))"
)

# Fair shares (issue 19): the fleet slots one principal's other operations hold for a provider (still
# held: after `held_since`), the earliest, and how many of them wait for the pace without a slot, their
# agents still coming, since a request older than `served_at` (issue 29: oldest-waiting first). Read with
# the provider's pace taken first (SQLite's write lock, PostgreSQL's locked pace row).
PRINCIPAL_BOOKED_SLOTS = (
    f"SELECT coalesce(sum(CASE WHEN {SLOT_HELD_SQL} THEN 1 ELSE 0 END), 0), "
    f"min(CASE WHEN {SLOT_HELD_SQL} THEN fleet_slot_at END), "
    f"coalesce(sum(CASE WHEN {WAITING_FOR_PACE_SQL} "
    "AND coalesce(request_sent_at, created_at) < :served_at THEN 1 ELSE 0 END), 0) "
    "FROM operations WHERE provider = :provider AND owner = :owner "
    "AND status = 'waiting' AND operation_id <> :operation_id"
)

# Fair shares (issue 29): the principal's other operation that has waited longest for the pace (id, and
# when its last request left), to be handed the principal's next slot (`fleet_pace.hands_slot`).
OLDEST_WAITING_SIBLING = (
    "SELECT operation_id, coalesce(request_sent_at, created_at) FROM operations "
    f"WHERE provider = :provider AND owner = :owner AND operation_id <> :operation_id AND {WAITING_FOR_PACE_SQL} "
    "ORDER BY 2, operation_id LIMIT 1"
)

# Fair shares (issue 29): whether another principal waits for the pace (an operation of it, its agent
# still coming) whose waiting operations' last request is older than this principal's (`share_send`);
# a request in flight counts as served when it was reserved (RESERVE), as the simulation has it.
# The row read is the first of them: the operation waiting longest of the principal served least
# recently, its principal, and the slots that principal holds (`share_on_send`'s `other_booked`).
# Each principal's last request is found once (`served`), so the read stays one pass over the
# provider's waiting operations however many wait.
OTHER_PRINCIPAL_FIRST = (
    "WITH served AS (SELECT owner, coalesce(max(request_sent_at), -1) AS served_at FROM operations "
    "WHERE provider = :provider AND status = 'waiting' GROUP BY owner), "
    "leader AS (SELECT w.operation_id, w.owner FROM operations w JOIN served s ON s.owner = w.owner "
    f"WHERE w.provider = :provider AND w.owner <> :owner AND {WAITING_FOR_PACE_SQL} "
    "AND s.served_at < coalesce((SELECT m.served_at FROM served m WHERE m.owner = :owner), -1) "
    "ORDER BY s.served_at, coalesce(w.request_sent_at, w.created_at), w.operation_id LIMIT 1) "
    "SELECT l.operation_id, l.owner, (SELECT count(*) FROM operations h WHERE h.provider = :provider "
    f"AND h.owner = l.owner AND h.status = 'waiting' AND {SLOT_HELD_SQL}) FROM leader l"
)

# The principal's next slot handed to its oldest waiting operation (`plans.HandSlot`), if it still waits.
HAND_SLOT_GUARD = (
    f"provider = :provider AND owner = :owner AND operation_id = :sibling AND {WAITING_FOR_PACE_SQL}"
)
HAND_SLOT_SET = "fleet_slot_at = :slot_at, version = version + 1, updated_at = :at"
# The second hand-off of one request (its sibling's, after the principal that comes first): only if the
# first took, else its slot would leave the first's unbooked, and that principal's turn lost.
HAND_SLOT_AFTER_GUARD = (
    f"{HAND_SLOT_GUARD} AND EXISTS (SELECT 1 FROM operations a WHERE a.operation_id = :after "
    "AND a.fleet_slot_at = :after_slot_at)"
)

# The other operations' held fleet slots whose time has come (from `held_since` to before `before`) and
# that are not used yet: the sends' clock keeps room for them (`fleet_pace.pace_verdict`'s `owed`).
PROVIDER_OWED_SLOTS = (
    "SELECT count(*) FROM operations WHERE provider = :provider AND status = 'waiting' "
    f"AND {LEASE_FREE_SQL} AND fleet_slot_at < :before "
    "AND (fleet_slot_at >= :held_since OR (delay_source = 'fleet_pacing' AND next_check_at >= :held_since)) "
    "AND operation_id <> :operation_id"
)

# Every operation with refused calls not yet summarised, in id order (locked so, on PostgreSQL).
PENDING_REFUSALS = f"SELECT {OPERATION_ROW} FROM operations WHERE refused_count > 0 ORDER BY operation_id"
ANY_PENDING_REFUSALS_OF = "SELECT 1 FROM operations WHERE operation_id = :operation_id AND refused_count > 0"
RESET_REFUSALS = (
    "UPDATE operations SET refused_count = 0, refused_outcome = NULL, refused_first_at = NULL, "
    "refused_last_at = NULL WHERE operation_id = :operation_id"
)

# -- approvals -------------------------------------------------------------------------------------

APPROVAL_ROW = ", ".join(APPROVAL_COLUMNS)
SELECT_APPROVAL = f"SELECT {APPROVAL_ROW} FROM approvals WHERE approval_id = :approval_id"
_LIST_APPROVALS = f"SELECT {APPROVAL_ROW} FROM approvals {{where}} ORDER BY asked_at DESC"
LIST_APPROVALS = _LIST_APPROVALS.format(where="")
LIST_APPROVALS_BY_STATUS = _LIST_APPROVALS.format(where="WHERE status = :status")
LIST_APPROVALS_OF = _LIST_APPROVALS.format(where="WHERE operation_id = :operation_id")
LIST_APPROVALS_OF_BY_STATUS = _LIST_APPROVALS.format(
    where="WHERE operation_id = :operation_id AND status = :status"
)
# An extension decision an operator took (or a question nobody answered in time) waits to be applied.
HAS_DUE_EXTENSION_APPROVALS = (
    "SELECT 1 FROM approvals WHERE operation_id = :operation_id AND kind IN ('extension', 'reopen') "
    "AND (status IN ('approved', 'denied') OR (status = 'pending' AND expires_at <= :now)) LIMIT 1"
)
FIND_PENDING_APPROVAL = (
    f"SELECT {APPROVAL_ROW} FROM approvals WHERE operation_id = :operation_id AND kind = :kind "
    "AND bound_version = :version AND request_json = :request_json AND status = 'pending' AND expires_at > :at"
)
INSERT_APPROVAL = (
    "INSERT INTO approvals (approval_id, operation_id, kind, status, request_json, bound_version, asked_at, "
    "expires_at) VALUES (:approval_id, :operation_id, :kind, 'pending', :request_json, :version, :at, "
    f":expires_at) RETURNING {APPROVAL_ROW}"
)
DECIDE_APPROVAL = (
    "UPDATE approvals SET status = :status, decided_at = :at, decided_by = :by, decided_method = :method, "
    f"decision_signature = :signature WHERE approval_id = :approval_id AND status = 'pending' RETURNING {APPROVAL_ROW}"
)
# Guarded: only from the statuses the target may follow (vocabulary.APPROVAL_CLOSABLE_FROM: at most three,
# the rest NULL), so a late or concurrent close never turns `applied` into `void`, nor `approved` into `expired`.
CLOSE_APPROVAL = (
    "UPDATE approvals SET status = :status, note = :note, decided_at = COALESCE(decided_at, :at) "
    f"WHERE approval_id = :approval_id AND status IN (:from_0, :from_1, :from_2) RETURNING {APPROVAL_ROW}"
)
MARK_APPROVAL_APPLIED = (
    "UPDATE approvals SET status = 'applied', note = 'applied' WHERE approval_id = :approval_id"
)
MARK_APPROVAL_USED = "UPDATE approvals SET status = 'applied', note = :note WHERE approval_id = :approval_id AND status = 'approved'"

# -- follow-ups ------------------------------------------------------------------------------------

FOLLOWUP_ROW = ", ".join(FOLLOWUP_COLUMNS)
INSERT_FOLLOWUP = (
    f"INSERT INTO followups ({FOLLOWUP_ROW}) VALUES ({', '.join(f':{c}' for c in FOLLOWUP_COLUMNS)})"
)

# -- webhook wake-ups (issue 21) -------------------------------------------------------------------

KNOWS_JOB = "SELECT 1 FROM operations WHERE provider = :provider AND provider_job_id = :job_id LIMIT 1"
PRUNE_WEBHOOK_EVENTS = "DELETE FROM webhook_events WHERE provider = :provider AND received_at < :before"
# Insert-or-ignore: a row back means the event id is new.
REMEMBER_WEBHOOK_EVENT = (
    "INSERT INTO webhook_events (provider, event_id, received_at) VALUES (:provider, :event_id, :now) "
    "ON CONFLICT (provider, event_id) DO NOTHING RETURNING event_id"
)
# The job's waiting operations, in id order, which a webhook may wake (`plans.may_wake` decides which).
WAITING_ON_JOB = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE provider = :provider AND provider_job_id = :job_id "
    "AND status = 'waiting' ORDER BY operation_id"
)
# Ordered by the partial index's key, so PostgreSQL's plan walks that index (a few entries) whatever the
# statistics say; without the order a stale estimate of many refusals makes it a scan of every row.
ANY_PENDING_REFUSALS = "SELECT 1 FROM operations WHERE refused_count > 0 ORDER BY operation_id LIMIT 1"

# -- the approval policy (`pollwarden.access.approval_policy`): one row, raised without a read in between -----

APPROVAL_POLICY = "SELECT require_operator_key, channels, operator_keys FROM approval_policy WHERE id = 1"
WRITE_APPROVAL_POLICY = (
    "UPDATE approval_policy SET require_operator_key = :require, channels = :channels, "
    "operator_keys = :keys, updated_at = :at, updated_by = :by "
    "WHERE id = 1 AND (NOT require_operator_key OR NOT :only_raising) RETURNING id"
)
