"""The SQL only the SQLite engine runs, by name (the rest is `pollwarden.store.statements`, shared).

Its connection's pragmas and transactions, the statements whose SQLite text
differs from PostgreSQL's (an upsert, a JSON list, the audit chain whose
every row is a chain row), and the guarded update a plan's `Update` becomes.
"""

from __future__ import annotations

from functools import cache

from pollwarden.store import statements
from pollwarden.store.rows import REFUSAL_COLUMNS
from pollwarden.store.statements import OPERATION_ROW

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
    f"SELECT {OPERATION_ROW} FROM operations WHERE operation_id = :operation_id AND refused_count > 0"
)


@cache
def update_operation(columns: tuple[str, ...]) -> str:
    """`UPDATE … SET <columns>` guarded by the version read (`executor.writable` columns only); parameters
    are named `c_<column>`, `version`, `at` and `operation_id`. A row back means the guard held."""
    sets = "".join(f"{c} = :c_{c}, " for c in columns)
    return (
        f"UPDATE operations SET {sets}version = version + 1, updated_at = :at "
        "WHERE operation_id = :operation_id AND version = :version RETURNING 1"
    )


# -- fleet pacing ----------------------------------------------------------------------------------

# The hand-off (`plans.HandSlot`); under the write lock, the pace row moves only when a row came back.
HAND_SLOT = f"UPDATE operations SET {statements.HAND_SLOT_SET} WHERE {statements.HAND_SLOT_GUARD} RETURNING 1"
HAND_SLOT_AFTER = (
    f"UPDATE operations SET {statements.HAND_SLOT_SET} WHERE {statements.HAND_SLOT_AFTER_GUARD} RETURNING 1"
)
SET_FLEET_BOOKINGS = (
    "INSERT INTO fleet_buckets (provider, tat) VALUES (:provider, :tat) "
    "ON CONFLICT(provider) DO UPDATE SET tat = excluded.tat"
)

UPSERT_FLEET_TAT = (
    "INSERT INTO fleet_buckets (provider, tat, sent_tat) VALUES (:provider, :tat, :sent_tat) "
    "ON CONFLICT(provider) DO UPDATE SET tat = excluded.tat, sent_tat = excluded.sent_tat"
)


# -- the audit chain: every SQLite row is a chain row, its seq its place ------------------------------

AUDIT_HEAD = "SELECT seq, hash, keyed FROM audit ORDER BY seq DESC LIMIT 1"
INSERT_AUDIT_ROW = (
    "INSERT INTO audit (seq, operation_id, at, kind, payload, prev_hash, hash, keyed) "
    "VALUES (:position, :operation_id, :at, :kind, :payload, :prev_hash, :hash, :keyed)"
)
