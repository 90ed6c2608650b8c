"""Every SQL statement the PostgreSQL engine runs, by name (psycopg's %(name)s parameters).

Writes are computed from a row this transaction locked (`… FOR UPDATE`), so
the decision and the write see the same row; each write still states its
guard (the version it read) and the engine checks it held. The reservation and
the count of a refused call, when nothing else is written with them, are one
guarded `UPDATE … RETURNING` each, committed in the same trip.
"""

from __future__ import annotations

from functools import cache

from pollwarden.audit_entry import REFUSALS_PER_SUMMARY
from pollwarden.records import APPROVAL_COLUMNS, FOLLOWUP_COLUMNS, OPERATION_COLUMNS
from pollwarden.stop import BUDGET_LEFT_SQL, deadline_open_sql
from pollwarden.store.rows import CHAIN_COLUMNS, MUTABLE_COLUMNS, NEW_OPERATION_COLUMNS, REFUSAL_COLUMNS

OPERATION_ROW = ", ".join((*OPERATION_COLUMNS, *REFUSAL_COLUMNS, *CHAIN_COLUMNS))

SELECT_OPERATION = f"SELECT {OPERATION_ROW} FROM operations WHERE operation_id = %(operation_id)s"
LOCK_OPERATION = SELECT_OPERATION + " FOR UPDATE"
LOCK_PENDING_REFUSALS = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE refused_count > 0 ORDER BY operation_id FOR UPDATE"
)
# Ordered by the partial index's key, so the plan walks that index (a few entries) whatever the
# statistics say; without the order a stale estimate of many refusals makes it a scan of every row.
ANY_PENDING_REFUSALS = "SELECT 1 FROM operations WHERE refused_count > 0 ORDER BY operation_id LIMIT 1"
ANY_PENDING_REFUSALS_OF = (
    "SELECT 1 FROM operations WHERE operation_id = %(operation_id)s AND refused_count > 0"
)

_LIST = (
    f"SELECT {OPERATION_ROW} FROM operations {{where}} ORDER BY created_at DESC, operation_id LIMIT %(limit)s"
)
_LIST_FILTERS = {
    "status": "status = %(status)s",
    "provider": "provider = %(provider)s",
    "owner": "owner = %(owner)s",
}


@cache
def list_operations(*filters: str) -> str:
    """The listing with these filters (names from `_LIST_FILTERS`, in that order)."""
    where = " AND ".join(_LIST_FILTERS[f] for f in filters)
    return _LIST.format(where=f"WHERE {where}" if where else "")


COUNT_OPERATIONS = "SELECT count(*) FROM operations"
LIST_BY_FINGERPRINT = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE request_fingerprint = %(fingerprint)s "
    "ORDER BY created_at DESC, operation_id LIMIT %(limit)s"
)

INSERT_OPERATION = (
    f"INSERT INTO operations ({', '.join(NEW_OPERATION_COLUMNS)}) "
    f"VALUES ({', '.join(f'%({c})s' for c in NEW_OPERATION_COLUMNS)}) "
    f"ON CONFLICT DO NOTHING RETURNING {OPERATION_ROW}"  # the id, or the job (one job, one budget)
)

# A new operation and its first audit row (a row of the one chain) in one statement, for a start that
# submits nothing on an unkeyed chain: the head is locked first (as every start locks it before its
# row: no deadlock on the job's unique index), the row hashed here — the message `audit.row_hash`
# hashes, its JSON escaped by Python (`audit.hashed_middle`) — and the operation records its chain.
# Nothing is inserted when the id or the job is taken, or the chain is keyed: the caller goes the
# locked way, which says which.
OPEN_OPERATION = (
    "WITH head AS (SELECT seq, hash FROM audit_head WHERE one AND NOT keyed FOR UPDATE), "
    "linked AS (SELECT seq + 1 AS position, hash AS prev_hash, encode(sha256(convert_to("
    "'[' || (seq + 1)::text || %(middle)s || '\"' || hash || '\"]', 'UTF8')), 'hex') AS hash FROM head), "
    f"opened AS (INSERT INTO operations ({', '.join(NEW_OPERATION_COLUMNS)}, audit_rows, audit_hash) "
    f"SELECT {', '.join(f'%({c})s' for c in NEW_OPERATION_COLUMNS)}, 1, linked.hash FROM linked "
    f"ON CONFLICT DO NOTHING RETURNING {OPERATION_ROW}), "
    "first_row AS (INSERT INTO audit (position, link, operation_id, at, kind, payload, prev_hash, hash, keyed) "
    "SELECT linked.position, 'chain', %(operation_id)s, %(at)s, %(kind)s, %(payload)s, linked.prev_hash, "
    "linked.hash, false FROM linked WHERE EXISTS (SELECT 1 FROM opened) RETURNING position, hash), "
    "moved AS (UPDATE audit_head SET seq = first_row.position, hash = first_row.hash FROM first_row "
    "WHERE audit_head.one RETURNING 1) "
    "SELECT * FROM opened"
)

# The operation that holds a job (one job, one budget: pollwarden.job_identity) for one principal
# (issue 19: principals never see each other's operations); the partial UNIQUE index
# operations_one_per_job serves it and makes a second holder impossible.
SELECT_JOB_OWNER = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE provider = %(provider)s "
    "AND account_context = %(account_context)s AND provider_job_id = %(provider_job_id)s "
    "AND duplicate_of IS NULL AND owner = %(owner)s"
)

# Fair shares (issue 19): the future fleet slots one principal holds for a provider (read with the
# provider's pace row locked, which every booking takes first).
PRINCIPAL_BOOKED_SLOTS = (
    "SELECT count(*), min(fleet_slot_at) FROM operations WHERE provider = %(provider)s "
    "AND owner = %(owner)s AND fleet_slot_at > %(now)s AND status = 'waiting' "
    "AND operation_id <> %(operation_id)s"
)
COUNT_ACTIVE_OF_OWNER = (
    "SELECT count(*) FROM operations WHERE owner = %(owner)s AND status IN ('waiting', 'submitting')"
)
COUNT_CREATED_SINCE_BY_OWNER = (
    "SELECT count(*) FROM operations WHERE owner = %(owner)s AND created_at > %(since)s"
)

# One payload in flight is one job (pollwarden.job_identity). Submissions of one payload take this
# transaction-scoped lock before they look for an operation of it in flight and insert, so two
# processes starting it at once make one operation. The two-key form keeps it apart from the
# migration lock's one-key space; the first key is "poll".
LOCK_PAYLOAD = "SELECT pg_advisory_xact_lock(1886350444, hashtext(%(request_fingerprint)s))"
SELECT_PAYLOAD_IN_FLIGHT = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE request_fingerprint = %(request_fingerprint)s "
    "AND owner = %(owner)s "
    "AND status IN ('submitting', 'waiting') AND submit_payload_json IS NOT NULL AND duplicate_of IS NULL "
    "ORDER BY created_at DESC, operation_id LIMIT 1"
)

# The reservation as one statement: the gate's conditions again (pollwarden.stop's), and the version it read.
RESERVE = (
    "UPDATE operations SET status_requests_used = status_requests_used + 1, fleet_slot_at = NULL, "
    "lease_owner = %(owner)s, lease_expires_at = %(lease_expires_at)s, version = version + 1, "
    "updated_at = %(now)s "
    "WHERE operation_id = %(operation_id)s AND version = %(version)s AND status = 'waiting' "
    f"AND {deadline_open_sql('%(now)s')} AND %(now)s >= next_check_at AND {BUDGET_LEFT_SQL} "
    f"AND (lease_owner IS NULL OR lease_expires_at <= %(now)s) RETURNING {OPERATION_ROW}"
)

# One refused call, counted on the operation as the gate read it (version guard), unless a summary row
# is due first (a run of the other outcome pending) or with it (this call completes the run): those go
# the locked way, which writes the row.
# Only a counter nothing budget-related reads: committed without waiting for the disk. The statement is
# its own transaction (autocommit), and sets synchronous_commit off for it alone (set_config, local).
COUNT_REFUSAL = (
    "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)) "
    "UPDATE operations SET refused_count = refused_count + 1, refused_outcome = %(outcome)s, "
    "refused_first_at = COALESCE(refused_first_at, %(at)s), refused_last_at = %(at)s FROM relaxed "
    "WHERE operation_id = %(operation_id)s AND version = %(version)s "
    "AND (refused_outcome IS NULL OR refused_outcome = %(outcome)s) "
    f"AND refused_count < {REFUSALS_PER_SUMMARY - 1} "
    f"RETURNING {', '.join(REFUSAL_COLUMNS)}"
)
RESET_REFUSALS = (
    "UPDATE operations SET refused_count = 0, refused_outcome = NULL, refused_first_at = NULL, "
    "refused_last_at = NULL WHERE operation_id = %(operation_id)s"
)

# The counters after a refused call counted on the locked row (a summary row may have been written).
SET_REFUSALS = (
    "UPDATE operations SET refused_count = %(count)s, refused_outcome = %(outcome)s, "
    "refused_first_at = %(first_at)s, refused_last_at = %(last_at)s WHERE operation_id = %(operation_id)s"
)

_WRITABLE = tuple(sorted(MUTABLE_COLUMNS | {"extensions_used"}))


_RESET = "refused_count = 0, refused_outcome = NULL, refused_first_at = NULL, refused_last_at = NULL, "
_CHAIN = "audit_rows = %(audit_rows)s, audit_hash = %(audit_hash)s, "


@cache
def write_operation(
    columns: tuple[str, ...], reset_refusals: bool, chain_moved: bool, *, unlocked: bool = False
) -> str:
    """`UPDATE operations SET <columns>` guarded by the version read under the row lock.

    Parameters: `c_<column>` for each column, `version` (read), `new_version`, `at`; with
    `chain_moved`, the operation's audit chain after this transaction's rows (`audit_rows`,
    `audit_hash`). `unlocked`: the row was not read under this transaction's lock; the guard also
    states what the write assumes of it (the lease `owner` holds it, no refused calls counted and no
    audit row written since: `rows_before`).
    """
    unknown = [c for c in columns if c not in _WRITABLE]
    if unknown:
        raise ValueError(f"not a field an operation's change may set: {', '.join(unknown)}")
    sets = "".join(f"{c} = %(c_{c})s, " for c in columns)
    sets += (_RESET if reset_refusals else "") + (_CHAIN if chain_moved else "")
    guard = " AND lease_owner = %(owner)s AND refused_count = 0 AND audit_rows = %(rows_before)s"
    return (
        f"UPDATE operations SET {sets}version = %(new_version)s, updated_at = %(at)s "
        "WHERE operation_id = %(operation_id)s AND version = %(version)s" + (guard if unlocked else "")
    )


@cache
def move_chain(reset_refusals: bool) -> str:
    """The operation's audit chain after this transaction's rows, on its locked row (no other change)."""
    sets = (_RESET if reset_refusals else "") + _CHAIN
    return f"UPDATE operations SET {sets.rstrip(', ')} WHERE operation_id = %(operation_id)s"


# -- fleet pacing: the provider's row exists (inserted once) so that it can always be locked ----------

ENSURE_FLEET_ROW = (
    "INSERT INTO fleet_buckets (provider, tat) VALUES (%(provider)s, NULL) ON CONFLICT DO NOTHING"
)
LOCK_FLEET_ROW = "SELECT tat FROM fleet_buckets WHERE provider = %(provider)s FOR UPDATE"
SET_FLEET_TAT = "UPDATE fleet_buckets SET tat = %(tat)s WHERE provider = %(provider)s"

# -- approvals --------------------------------------------------------------------------------------

APPROVAL_ROW = ", ".join(APPROVAL_COLUMNS)
SELECT_APPROVAL = f"SELECT {APPROVAL_ROW} FROM approvals WHERE approval_id = %(approval_id)s"
LOCK_APPROVAL = SELECT_APPROVAL + " FOR UPDATE"
_LIST_APPROVALS = f"SELECT {APPROVAL_ROW} FROM approvals {{where}} ORDER BY asked_at DESC"
LIST_APPROVALS = _LIST_APPROVALS.format(where="")
LIST_APPROVALS_BY_STATUS = _LIST_APPROVALS.format(where="WHERE status = %(status)s")
LIST_APPROVALS_OF = _LIST_APPROVALS.format(where="WHERE operation_id = %(operation_id)s")
LIST_APPROVALS_OF_BY_STATUS = _LIST_APPROVALS.format(
    where="WHERE operation_id = %(operation_id)s AND status = %(status)s"
)
HAS_DUE_EXTENSION_APPROVALS = (
    "SELECT 1 FROM approvals WHERE operation_id = %(operation_id)s AND kind IN ('extension', 'reopen') "
    "AND (status IN ('approved', 'denied') OR (status = 'pending' AND expires_at <= %(now)s)) LIMIT 1"
)
FIND_PENDING_APPROVAL = (
    f"SELECT {APPROVAL_ROW} FROM approvals WHERE operation_id = %(operation_id)s AND kind = %(kind)s "
    "AND bound_version = %(version)s AND request_json = %(request_json)s AND status = 'pending' "
    "AND expires_at > %(at)s"
)
INSERT_APPROVAL = (
    "INSERT INTO approvals (approval_id, operation_id, kind, status, request_json, bound_version, "
    "asked_at, expires_at) VALUES (%(approval_id)s, %(operation_id)s, %(kind)s, 'pending', "
    f"%(request_json)s, %(version)s, %(at)s, %(expires_at)s) RETURNING {APPROVAL_ROW}"
)
DECIDE_APPROVAL = (
    "UPDATE approvals SET status = %(status)s, decided_at = %(at)s, decided_by = %(by)s, "
    "decided_method = %(method)s, decision_signature = %(signature)s "
    f"WHERE approval_id = %(approval_id)s AND status = 'pending' RETURNING {APPROVAL_ROW}"
)
CLOSE_APPROVAL = (
    "UPDATE approvals SET status = %(status)s, note = %(note)s, decided_at = COALESCE(decided_at, %(at)s) "
    "WHERE approval_id = %(approval_id)s AND status = ANY(%(allowed)s) "
    f"RETURNING {APPROVAL_ROW}"
)
MARK_APPROVAL_APPLIED = (
    "UPDATE approvals SET status = 'applied', note = 'applied' WHERE approval_id = %(approval_id)s"
)
MARK_APPROVAL_USED = (
    "UPDATE approvals SET status = 'applied', note = %(note)s "
    "WHERE approval_id = %(approval_id)s AND status = 'approved'"
)

# -- follow-ups ---------------------------------------------------------------------------------------

FOLLOWUP_ROW = ", ".join(FOLLOWUP_COLUMNS)
INSERT_FOLLOWUP = (
    f"INSERT INTO followups ({FOLLOWUP_ROW}) VALUES ({', '.join(f'%({c})s' for c in FOLLOWUP_COLUMNS)})"
)
LIST_FOLLOWUPS = (
    f"SELECT {FOLLOWUP_ROW} FROM followups WHERE operation_id = %(operation_id)s "
    "ORDER BY requested_at, inserted"
)

# -- webhook wake-ups (issue 21): the same conditions as SQLite's ---------------------------------------

KNOWS_JOB = "SELECT 1 FROM operations WHERE provider = %(provider)s AND provider_job_id = %(job_id)s LIMIT 1"
PRUNE_WEBHOOK_EVENTS = "DELETE FROM webhook_events WHERE provider = %(provider)s AND received_at < %(before)s"
REMEMBER_WEBHOOK_EVENT = (
    "INSERT INTO webhook_events (provider, event_id, received_at) VALUES (%(provider)s, %(event_id)s, %(now)s) "
    "ON CONFLICT (provider, event_id) DO NOTHING RETURNING event_id"
)
# The job's waiting operations, locked in id order, which a webhook may wake (`plans.may_wake` decides).
LOCK_WAITING_ON_JOB = (
    f"SELECT {OPERATION_ROW} FROM operations WHERE provider = %(provider)s AND provider_job_id = %(job_id)s "
    "AND status = 'waiting' ORDER BY operation_id FOR UPDATE"
)

# -- the audit: the one chain's head row, and the rows (pollwarden.audit_verify) ----------------------

# A chain row (an operation's first, a seal, the re-key) locks the head, is linked and hashed here (the
# key never leaves the process), and moves the head: chain rows from every process form one chain.
# Every statement finds the head by its key (`one`): the planner then reads its one live version through
# the index, where a scan reads every page of dead versions a busy minute left (131 pages after 100,000
# starts, read twice by each start and once by each answer).
READ_AUDIT_HEAD = "SELECT seq, hash, keyed FROM audit_head WHERE one"
LOCK_AUDIT_HEAD = READ_AUDIT_HEAD + " FOR UPDATE"
SET_AUDIT_HEAD = "UPDATE audit_head SET seq = %(seq)s, hash = %(hash)s, keyed = %(keyed)s WHERE one"
_AUDIT_COLUMNS = "position, link, operation_id, at, kind, payload, prev_hash, hash, keyed"
_AUDIT_VALUES = "%(position)s, %(link)s, %(operation_id)s, %(at)s, %(kind)s, %(payload)s, %(prev_hash)s, %(hash)s, %(keyed)s"
INSERT_CHAIN_ROW = f"INSERT INTO audit ({_AUDIT_COLUMNS}) VALUES ({_AUDIT_VALUES})"

# An operation row follows its operation's last row (on the row this transaction locked or guards),
# without the head's lock; it is keyed exactly when the chain is (a keyed server never extends an
# unkeyed chain, nor the reverse): read without a lock, a guard that fails divides by zero.
INSERT_OPERATION_ROW = (
    f"WITH linked AS (INSERT INTO audit ({_AUDIT_COLUMNS}) SELECT {_AUDIT_VALUES} FROM audit_head "
    "WHERE one AND keyed = %(keyed)s RETURNING 1) SELECT 1 / count(*) FROM linked"
)

# The answer to this process's own reservation as one statement, committed by itself (autocommit): the
# write guarded as `write_operation(…, unlocked=True)` states, and its row in the operation's chain,
# inserted only if the write held (and keyed exactly as the chain is); else it divides by zero.
_ANSWER_ROW = ", ".join(f"%(a_{c.strip()})s" for c in _AUDIT_COLUMNS.split(","))


@cache
def answer_statement(columns: tuple[str, ...]) -> str:
    """The one-statement answer writing `columns` (parameters: `write_operation`'s, and the audit row's
    columns prefixed `a_`)."""
    update = write_operation(columns, False, True, unlocked=True)
    return (
        f"WITH written AS ({update} RETURNING 1), linked AS (INSERT INTO audit ({_AUDIT_COLUMNS}) "
        f"SELECT {_ANSWER_ROW} FROM audit_head, written WHERE audit_head.one AND audit_head.keyed = %(a_keyed)s "
        "RETURNING 1) "
        "SELECT 1 / count(*) FROM linked"
    )


# A seal: the operations whose chain moved since the last seal, named with its head, up to `batch` of
# them after the id `after` (a seal holds the head: a bounded batch keeps it short). Their rows are
# locked for the seal's one transaction (so none of their rows falls between what the seal read and
# the seal), in id order, as every transaction that locks several operations locks them. A chain of
# one row needs no seal: that row, the operation's first, is itself in the one chain, so 100,000 new
# operations are not 100,000 names in the next seal.
SEAL_OPERATIONS = (
    "WITH moved AS (SELECT operation_id FROM operations WHERE audit_rows > audit_sealed_rows "
    "AND audit_rows > 1 AND operation_id > %(after)s ORDER BY operation_id LIMIT %(batch)s FOR UPDATE) "
    "UPDATE operations AS o SET audit_sealed_rows = o.audit_rows FROM moved "
    "WHERE o.operation_id = moved.operation_id RETURNING o.operation_id, o.audit_rows, o.audit_hash"
)
# The same, read under the re-key's table lock (nothing can append meanwhile): no row lock to wait for.
MOVED_OPERATIONS = (
    "SELECT operation_id, audit_rows, audit_hash FROM operations WHERE audit_rows > audit_sealed_rows"
)
