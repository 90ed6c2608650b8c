"""The SQL only the PostgreSQL engine runs, by name, and the dialect it runs the shared statements in.

The statements both engines run are `pollwarden.store.statements` (named
``:name`` parameters); `dialect` gives their PostgreSQL text (psycopg's
``%(name)s``, and an operation row read with its own audit chain's head), and
every statement goes through it on its way to the server (`connection`).
Writes are computed from a row this transaction locked (`… FOR UPDATE`), so
the decision and the write see the same row; each write still states its
guard (the version it read) and the engine checks it held. The reservation and
the count of a refused call, when nothing else is written with them, are one
guarded `UPDATE … RETURNING` each, committed in the same trip.
"""

from __future__ import annotations

import re
from functools import cache

from pollwarden.audit.entry import REFUSALS_PER_SUMMARY
from pollwarden.store import statements
from pollwarden.store.rows import CHAIN_COLUMNS, MUTABLE_COLUMNS, NEW_OPERATION_COLUMNS, REFUSAL_COLUMNS

# An operation row as this engine reads it: the shared one, then its own audit chain's head.
OPERATION_ROW = f"{statements.OPERATION_ROW}, {', '.join(CHAIN_COLUMNS)}"
_SHARED_ROW = re.compile(re.escape(statements.OPERATION_ROW) + "(?!, audit_rows)")
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@cache
def dialect(statement: str) -> str:
    """A statement as PostgreSQL runs it: ``:name`` parameters as ``%(name)s`` (a ``::`` cast is kept),
    and the shared operation row with this engine's chain columns."""
    return _NAMED.sub(r"%(\1)s", _SHARED_ROW.sub(OPERATION_ROW, statement))


LOCK_OPERATION = dialect(statements.SELECT_OPERATION) + " FOR UPDATE"
# The same when no other transaction holds it (else no row, at once).
LOCK_OPERATION_IF_FREE = LOCK_OPERATION + " SKIP LOCKED"

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

# One payload in flight is one job (pollwarden.rules.job_identity). Submissions of one payload take this
# transaction-scoped lock before they look for an operation of it in flight and insert, so two
# processes starting it at once make one operation. The two-key form keeps it apart from the
# migration lock's one-key space; the first key is "poll".
LOCK_PAYLOAD = "SELECT pg_advisory_xact_lock(1886350444, hashtext(%(request_fingerprint)s))"
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
# The counters after a refused call counted on the locked row (a summary row may have been written).
SET_REFUSALS = (
    "UPDATE operations SET refused_count = %(count)s, refused_outcome = %(outcome)s, "
    "refused_first_at = %(first_at)s, refused_last_at = %(last_at)s WHERE operation_id = %(operation_id)s"
)

_WRITABLE = tuple(sorted(MUTABLE_COLUMNS))


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
LOCK_FLEET_ROW = "SELECT tat, sent_tat FROM fleet_buckets WHERE provider = %(provider)s FOR UPDATE"
SET_FLEET_TAT = (
    "UPDATE fleet_buckets SET tat = %(tat)s, sent_tat = %(sent_tat)s WHERE provider = %(provider)s"
)


# The hand-off (`plans.HandSlot`) in one statement: a sibling whose row another transaction holds (its
# own check, waiting for this pace row) is skipped, never waited for, and the pace row moves only
# when the slot was handed.
def _hand_slot(guard: str) -> str:
    return dialect(
        "WITH handed AS (UPDATE operations SET "
        f"{statements.HAND_SLOT_SET} WHERE operation_id = (SELECT operation_id FROM operations "
        f"WHERE {guard} FOR UPDATE SKIP LOCKED) RETURNING 1) "
        "UPDATE fleet_buckets SET tat = :tat WHERE provider = :provider AND EXISTS (SELECT 1 FROM handed)"
    )


HAND_SLOT = _hand_slot(statements.HAND_SLOT_GUARD)
HAND_SLOT_AFTER = _hand_slot(statements.HAND_SLOT_AFTER_GUARD)

# -- the audit: the one chain's head row, and the rows (pollwarden.audit.verify) ----------------------

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
