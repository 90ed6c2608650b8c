"""The SQLite schema, as named steps frozen in the order they first shipped.

A step is never edited once released: a database at user_version N has run
steps 1..N exactly as written here, and the next start runs the rest. Nothing
is imported from live modules (a step that read its DDL from, say, the audit
module would change silently with it). Steps 1-3 are the DDL of the first
releases, copied verbatim; step 4 rebuilds `operations` with CHECK constraints
spelling out the vocabulary (`pollwarden.core.vocabulary`; a test compares the two),
names the refusal counters for what they count, and adds the indexes that keep
listing and scanning flat at 100,000 operations; step 6 rebuilds it again for
two new stop reasons and makes a job belong to one operation.

Steps run in number order, but a step may ship after a higher one did (step 8
after 9): the `schema_steps` table records which steps ran, and
`pollwarden.store.migrations` says which are still to run.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from pollwarden.core.errors import StoreError
from pollwarden.store.migrations import pending


@dataclass(frozen=True)
class Migration:
    """One frozen schema step."""

    number: int
    name: str
    script: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "operations, approvals and the audit chain",
        """
    CREATE TABLE operations (
        operation_id TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        provider_job_id TEXT,
        account_context TEXT NOT NULL,
        request_fingerprint TEXT NOT NULL,
        idempotency_key TEXT,
        expected_terminal_state TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN
            ('submitting','waiting','succeeded','failed','cancelled','expired','escalated')),
        stop_reason TEXT,
        stop_detail TEXT,
        state TEXT,
        category TEXT,
        started_at REAL NOT NULL,
        deadline_at REAL NOT NULL,
        business_deadline_at REAL,
        max_status_requests INTEGER NOT NULL CHECK (max_status_requests > 0),
        max_transport_failures INTEGER NOT NULL CHECK (max_transport_failures > 0),
        max_rate_limited INTEGER NOT NULL CHECK (max_rate_limited > 0),
        status_requests_used INTEGER NOT NULL DEFAULT 0,
        transport_failures_used INTEGER NOT NULL DEFAULT 0,
        rate_limited_used INTEGER NOT NULL DEFAULT 0,
        polls_completed INTEGER NOT NULL DEFAULT 0,
        next_check_at REAL NOT NULL,
        delay_source TEXT NOT NULL,
        retry_after_seconds REAL,
        last_http_status INTEGER,
        last_http_at REAL,
        provider_request_id TEXT,
        provider_expires_at REAL,
        error TEXT,
        result_json TEXT,
        lease_owner TEXT,
        lease_expires_at REAL,
        not_yet_count INTEGER NOT NULL DEFAULT 0,
        not_yet_first_at REAL,
        not_yet_last_at REAL,
        extensions_used INTEGER NOT NULL DEFAULT 0,
        stopped_at REAL,
        submit_payload_json TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        CHECK (status_requests_used <= max_status_requests)
    );
    CREATE INDEX operations_by_status ON operations(status, next_check_at);
    CREATE TABLE approvals (
        approval_id TEXT PRIMARY KEY,
        operation_id TEXT NOT NULL REFERENCES operations(operation_id),
        kind TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending','approved','denied','expired','void','applied')),
        request_json TEXT NOT NULL,
        bound_version INTEGER NOT NULL,
        asked_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        decided_at REAL,
        decided_by TEXT,
        note TEXT
    );
    CREATE INDEX approvals_by_operation ON approvals(operation_id, status);
    """
        + """
CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY,
  operation_id TEXT NOT NULL,
  at TEXT NOT NULL,
  kind TEXT NOT NULL,
  payload TEXT NOT NULL,
  prev_hash TEXT NOT NULL,
  hash TEXT NOT NULL,
  keyed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS audit_by_operation ON audit(operation_id, seq);
""",
    ),
    # [fleet] pacing shared by every process: one GCRA clock per provider,
    # and the slot booked for an operation that had to wait for one.
    Migration(
        2,
        "fleet pacing",
        """
    CREATE TABLE fleet_buckets (
        provider TEXT PRIMARY KEY,
        tat REAL NOT NULL
    );
    ALTER TABLE operations ADD COLUMN fleet_slot_at REAL;
    """,
    ),
    # follow-up operations (fetch_result, cancel), each with its own record
    Migration(
        3,
        "follow-ups",
        """
    CREATE TABLE followups (
        followup_id TEXT PRIMARY KEY,
        operation_id TEXT NOT NULL REFERENCES operations(operation_id),
        kind TEXT NOT NULL CHECK (kind IN ('fetch_result', 'cancel')),
        status TEXT NOT NULL CHECK (status IN ('done', 'refused', 'sent', 'failed', 'ambiguous')),
        approval_id TEXT,
        requested_at REAL NOT NULL,
        finished_at REAL,
        http_status INTEGER,
        answer TEXT,
        note TEXT
    );
    CREATE INDEX followups_by_operation ON followups(operation_id, requested_at);
    """,
    ),
    # The vocabulary as CHECK constraints (SQLite adds them only by rebuilding the
    # table); refused calls of either kind (not_yet, stopped) counted under one name
    # with their kind; indexes for list_operations and the refusal flush.
    Migration(
        4,
        "vocabulary constraints, refusal counters, list indexes",
        """
    CREATE TABLE operations_v4 (
        operation_id TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        provider_job_id TEXT,
        account_context TEXT NOT NULL,
        request_fingerprint TEXT NOT NULL,
        idempotency_key TEXT,
        expected_terminal_state TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN
            ('submitting','waiting','succeeded','failed','cancelled','expired','escalated')),
        stop_reason TEXT CHECK (stop_reason IN
            ('succeeded','provider_failure','cancelled','expired','deadline_exceeded',
             'request_budget_exhausted','delivery_ambiguous','rate_limited','unknown_state',
             'awaiting_review','authorization_denied','integration_failure')),
        stop_detail TEXT,
        state TEXT,
        category TEXT CHECK (category IN
            ('pending','succeeded','failed','cancelled','expired','awaiting_review','unknown')),
        started_at REAL NOT NULL,
        deadline_at REAL NOT NULL,
        business_deadline_at REAL,
        max_status_requests INTEGER NOT NULL CHECK (max_status_requests > 0),
        max_transport_failures INTEGER NOT NULL CHECK (max_transport_failures > 0),
        max_rate_limited INTEGER NOT NULL CHECK (max_rate_limited > 0),
        status_requests_used INTEGER NOT NULL DEFAULT 0,
        transport_failures_used INTEGER NOT NULL DEFAULT 0,
        rate_limited_used INTEGER NOT NULL DEFAULT 0,
        polls_completed INTEGER NOT NULL DEFAULT 0,
        next_check_at REAL NOT NULL,
        delay_source TEXT NOT NULL CHECK (delay_source IN
            ('local_backoff','provider_retry_after','provider_poll_hint','manual_extension','fleet_pacing')),
        retry_after_seconds REAL,
        last_http_status INTEGER,
        last_http_at REAL,
        provider_request_id TEXT,
        provider_expires_at REAL,
        error TEXT,
        result_json TEXT,
        lease_owner TEXT,
        lease_expires_at REAL,
        refused_count INTEGER NOT NULL DEFAULT 0 CHECK (refused_count >= 0),
        refused_outcome TEXT CHECK (refused_outcome IN ('not_yet','stopped')),
        refused_first_at REAL,
        refused_last_at REAL,
        extensions_used INTEGER NOT NULL DEFAULT 0,
        stopped_at REAL,
        submit_payload_json TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        fleet_slot_at REAL,
        CHECK (status_requests_used <= max_status_requests),
        CHECK ((refused_count = 0) = (refused_outcome IS NULL))
    );
    INSERT INTO operations_v4 (
        operation_id, provider, provider_job_id, account_context, request_fingerprint, idempotency_key,
        expected_terminal_state, status, stop_reason, stop_detail, state, category, started_at,
        deadline_at, business_deadline_at, max_status_requests, max_transport_failures,
        max_rate_limited, status_requests_used, transport_failures_used, rate_limited_used,
        polls_completed, next_check_at, delay_source, retry_after_seconds, last_http_status,
        last_http_at, provider_request_id, provider_expires_at, error, result_json, lease_owner,
        lease_expires_at, refused_count, refused_outcome, refused_first_at, refused_last_at,
        extensions_used, stopped_at, submit_payload_json, created_at, updated_at, version, fleet_slot_at
    )
    SELECT
        operation_id, provider, provider_job_id, account_context, request_fingerprint, idempotency_key,
        expected_terminal_state, status, stop_reason, stop_detail, state, category, started_at,
        deadline_at, business_deadline_at, max_status_requests, max_transport_failures,
        max_rate_limited, status_requests_used, transport_failures_used, rate_limited_used,
        polls_completed, next_check_at, delay_source, retry_after_seconds, last_http_status,
        last_http_at, provider_request_id, provider_expires_at, error, result_json, lease_owner,
        lease_expires_at, not_yet_count,
        CASE WHEN not_yet_count = 0 THEN NULL WHEN status = 'waiting' THEN 'not_yet' ELSE 'stopped' END,
        not_yet_first_at, not_yet_last_at,
        extensions_used, stopped_at, submit_payload_json, created_at, updated_at, version, fleet_slot_at
    FROM operations;
    DROP TABLE operations;
    ALTER TABLE operations_v4 RENAME TO operations;
    CREATE INDEX operations_by_created ON operations(created_at DESC, operation_id);
    CREATE INDEX operations_by_status ON operations(status, created_at DESC, operation_id);
    CREATE INDEX operations_by_provider ON operations(provider, created_at DESC, operation_id);
    CREATE INDEX operations_with_refusals ON operations(operation_id) WHERE refused_count > 0;
    CREATE INDEX approvals_by_status ON approvals(status, asked_at);
    """,
    ),
    # How an operator's decision was authenticated (tty, operator-key:<id>) and its signature,
    # so the controller can check it again before applying it.
    Migration(
        5,
        "approval decision method and signature",
        """
    ALTER TABLE approvals ADD COLUMN decided_method TEXT;
    ALTER TABLE approvals ADD COLUMN decision_signature TEXT;
    """,
    ),
    # One job, one budget (pollwarden.rules.job_identity): at most one operation holds a job
    # (provider, account context, provider job id), enforced by a partial UNIQUE index.
    # Files that already hold several operations for one job keep them all: the earliest
    # created (then the smallest id) keeps the job, the others are marked `duplicate_of` it
    # (excluded from the index) and stop at their next check with nothing sent. Two new
    # stop reasons need the CHECK constraint rebuilt; `request_sent_at` keeps when the
    # last status request was sent.
    Migration(
        6,
        "one operation per job, account context and duplicate stops, request time",
        """
    CREATE TABLE operations_v6 (
        operation_id TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        provider_job_id TEXT,
        account_context TEXT NOT NULL,
        request_fingerprint TEXT NOT NULL,
        idempotency_key TEXT,
        expected_terminal_state TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN
            ('submitting','waiting','succeeded','failed','cancelled','expired','escalated')),
        stop_reason TEXT CHECK (stop_reason IN
            ('succeeded','provider_failure','cancelled','expired','deadline_exceeded',
             'request_budget_exhausted','delivery_ambiguous','rate_limited','unknown_state',
             'awaiting_review','authorization_denied','integration_failure',
             'account_context_changed','job_already_tracked')),
        stop_detail TEXT,
        state TEXT,
        category TEXT CHECK (category IN
            ('pending','succeeded','failed','cancelled','expired','awaiting_review','unknown')),
        started_at REAL NOT NULL,
        deadline_at REAL NOT NULL,
        business_deadline_at REAL,
        max_status_requests INTEGER NOT NULL CHECK (max_status_requests > 0),
        max_transport_failures INTEGER NOT NULL CHECK (max_transport_failures > 0),
        max_rate_limited INTEGER NOT NULL CHECK (max_rate_limited > 0),
        status_requests_used INTEGER NOT NULL DEFAULT 0,
        transport_failures_used INTEGER NOT NULL DEFAULT 0,
        rate_limited_used INTEGER NOT NULL DEFAULT 0,
        polls_completed INTEGER NOT NULL DEFAULT 0,
        next_check_at REAL NOT NULL,
        delay_source TEXT NOT NULL CHECK (delay_source IN
            ('local_backoff','provider_retry_after','provider_poll_hint','manual_extension','fleet_pacing')),
        retry_after_seconds REAL,
        last_http_status INTEGER,
        last_http_at REAL,
        provider_request_id TEXT,
        provider_expires_at REAL,
        error TEXT,
        result_json TEXT,
        lease_owner TEXT,
        lease_expires_at REAL,
        refused_count INTEGER NOT NULL DEFAULT 0 CHECK (refused_count >= 0),
        refused_outcome TEXT CHECK (refused_outcome IN ('not_yet','stopped')),
        refused_first_at REAL,
        refused_last_at REAL,
        extensions_used INTEGER NOT NULL DEFAULT 0,
        stopped_at REAL,
        submit_payload_json TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        fleet_slot_at REAL,
        duplicate_of TEXT,
        request_sent_at REAL,
        CHECK (status_requests_used <= max_status_requests),
        CHECK ((refused_count = 0) = (refused_outcome IS NULL)),
        CHECK (duplicate_of IS NULL OR duplicate_of <> operation_id)
    );
    INSERT INTO operations_v6 (
        operation_id, provider, provider_job_id, account_context, request_fingerprint, idempotency_key,
        expected_terminal_state, status, stop_reason, stop_detail, state, category, started_at,
        deadline_at, business_deadline_at, max_status_requests, max_transport_failures,
        max_rate_limited, status_requests_used, transport_failures_used, rate_limited_used,
        polls_completed, next_check_at, delay_source, retry_after_seconds, last_http_status,
        last_http_at, provider_request_id, provider_expires_at, error, result_json, lease_owner,
        lease_expires_at, refused_count, refused_outcome, refused_first_at, refused_last_at,
        extensions_used, stopped_at, submit_payload_json, created_at, updated_at, version, fleet_slot_at
    )
    SELECT
        operation_id, provider, provider_job_id, account_context, request_fingerprint, idempotency_key,
        expected_terminal_state, status, stop_reason, stop_detail, state, category, started_at,
        deadline_at, business_deadline_at, max_status_requests, max_transport_failures,
        max_rate_limited, status_requests_used, transport_failures_used, rate_limited_used,
        polls_completed, next_check_at, delay_source, retry_after_seconds, last_http_status,
        last_http_at, provider_request_id, provider_expires_at, error, result_json, lease_owner,
        lease_expires_at, refused_count, refused_outcome, refused_first_at, refused_last_at,
        extensions_used, stopped_at, submit_payload_json, created_at, updated_at, version, fleet_slot_at
    FROM operations;
    DROP TABLE operations;
    ALTER TABLE operations_v6 RENAME TO operations;
    CREATE INDEX operations_by_created ON operations(created_at DESC, operation_id);
    CREATE INDEX operations_by_status ON operations(status, created_at DESC, operation_id);
    CREATE INDEX operations_by_provider ON operations(provider, created_at DESC, operation_id);
    CREATE INDEX operations_with_refusals ON operations(operation_id) WHERE refused_count > 0;
    CREATE INDEX operations_dedupe_v6 ON operations(
        provider, account_context, provider_job_id, created_at, operation_id);
    UPDATE operations SET duplicate_of = (
        SELECT o2.operation_id FROM operations AS o2
        WHERE o2.provider = operations.provider AND o2.account_context = operations.account_context
          AND o2.provider_job_id = operations.provider_job_id
        ORDER BY o2.created_at, o2.operation_id LIMIT 1)
    WHERE provider_job_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM operations AS o3
        WHERE o3.provider = operations.provider AND o3.account_context = operations.account_context
          AND o3.provider_job_id = operations.provider_job_id
          AND (o3.created_at < operations.created_at
               OR (o3.created_at = operations.created_at AND o3.operation_id < operations.operation_id)));
    DROP INDEX operations_dedupe_v6;
    CREATE UNIQUE INDEX operations_one_per_job ON operations(provider, account_context, provider_job_id)
        WHERE provider_job_id IS NOT NULL AND duplicate_of IS NULL;
    """,
    ),
    # A payload submitted again after its earlier operation ended or escalated is held until a
    # person approves (resubmission_of names that operation; resubmission_approved_by who approved);
    # the earlier operations of a payload are found by its fingerprint.
    Migration(
        7,
        "resubmissions held for a person",
        """
    ALTER TABLE operations ADD COLUMN resubmission_of TEXT;
    ALTER TABLE operations ADD COLUMN resubmission_approved_by TEXT;
    CREATE INDEX operations_by_fingerprint ON operations(request_fingerprint, created_at DESC);
    """,
    ),
    # Issue 19: every operation belongs to a principal (stdio and earlier rows: the local user).
    # Per-principal ids are kept unique by the stored id itself (`pollwarden.access.ownership`); one job,
    # one budget holds per principal, since no principal may see another's operation.
    Migration(
        8,
        "operation owners",
        """
    ALTER TABLE operations ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
    CREATE INDEX operations_by_owner ON operations(owner, created_at DESC, operation_id);
    DROP INDEX operations_one_per_job;
    CREATE UNIQUE INDEX operations_one_per_job ON operations(provider, account_context, provider_job_id, owner)
        WHERE provider_job_id IS NOT NULL AND duplicate_of IS NULL;
    """,
    ),
    # Signed provider webhooks (issue 21): the event ids seen (a replay is acknowledged and
    # ignored; rows older than the replay window are pruned), the time a webhook last brought
    # an operation's next check forward (a column of its own, so `delay_source` keeps its CHECK
    # without a table rebuild), and the lookup from a provider's job id to its operations.
    Migration(
        9,
        "webhook events and wake-ups",
        """
    CREATE TABLE webhook_events (
        provider TEXT NOT NULL,
        event_id TEXT NOT NULL,
        received_at REAL NOT NULL,
        PRIMARY KEY (provider, event_id)
    );
    CREATE INDEX webhook_events_by_age ON webhook_events(received_at);
    ALTER TABLE operations ADD COLUMN woken_at REAL;
    CREATE INDEX operations_by_provider_job ON operations(provider, provider_job_id);
    """,
    ),
    # When the submission request was sent, kept beside the status requests' request_sent_at.
    Migration(
        12,
        "submission request time",
        """
    ALTER TABLE operations ADD COLUMN submit_sent_at REAL;
    """,
    ),
    # Issue 30: the earliest a status request may go out, a fact of its own (a webhook, an approval or a
    # reopen never schedules one before it), filled from the last answer's Retry-After where one was kept;
    # and one job, one budget across principals: where several principals' operations held one job, the
    # earliest keeps it and the others become its duplicates (they stop at their next check, sending nothing).
    Migration(
        14,
        "the earliest allowed request",
        """
    ALTER TABLE operations ADD COLUMN not_before_at REAL;
    UPDATE operations SET not_before_at = last_http_at + retry_after_seconds
        WHERE last_http_at IS NOT NULL AND retry_after_seconds IS NOT NULL;
    UPDATE operations SET duplicate_of = (
        SELECT o.operation_id FROM operations o WHERE o.provider = operations.provider
        AND o.account_context = operations.account_context AND o.provider_job_id = operations.provider_job_id
        AND o.duplicate_of IS NULL ORDER BY o.created_at, o.operation_id LIMIT 1)
    WHERE provider_job_id IS NOT NULL AND duplicate_of IS NULL AND operation_id <> (
        SELECT o.operation_id FROM operations o WHERE o.provider = operations.provider
        AND o.account_context = operations.account_context AND o.provider_job_id = operations.provider_job_id
        AND o.duplicate_of IS NULL ORDER BY o.created_at, o.operation_id LIMIT 1);
    DROP INDEX operations_one_per_job;
    CREATE UNIQUE INDEX operations_one_per_job ON operations(provider, account_context, provider_job_id)
        WHERE provider_job_id IS NOT NULL AND duplicate_of IS NULL;
    """,
    ),
    # Issue 31: the approval policy of the database, one row every process reads
    # (`pollwarden.access.approval_policy`); the default requires nothing and counts every channel.
    Migration(
        15,
        "approval policy",
        """
    CREATE TABLE approval_policy (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        require_operator_key INTEGER NOT NULL DEFAULT 0,
        channels TEXT NOT NULL DEFAULT 'elicitation,tool-confirmation,app,operator',
        operator_keys TEXT NOT NULL DEFAULT '',
        updated_at REAL,
        updated_by TEXT
    );
    INSERT INTO approval_policy (id) VALUES (1);
    """,
    ),
    # Issue 29: the pace row keeps a second clock, of the requests that really left
    # (`pollwarden.rules.fleet_pace`); NULL until the first request after this step.
    Migration(
        16,
        "fleet pace: the sends' clock",
        """
    ALTER TABLE fleet_buckets ADD COLUMN sent_tat REAL;
    """,
    ),
    # Issue 34: a metrics scrape sums the refused calls already summarized in the audit; this
    # index holds only the summary rows, so the scrape never reads the whole chain.
    Migration(
        18,
        "audit refusal summaries index",
        """
    CREATE INDEX audit_refusal_summaries ON audit(kind, operation_id)
        WHERE kind IN ('not_yet_summary', 'stopped_summary');
    """,
    ),
)

LATEST = max(step.number for step in MIGRATIONS)

# The steps a database ran, by number (`pollwarden.store.migrations`: a step may ship late).
STEPS_TABLE = "CREATE TABLE IF NOT EXISTS schema_steps (number INTEGER PRIMARY KEY)"


def schema_version(conn: sqlite3.Connection) -> int:
    """The database's `user_version`: the highest step it has run (`schema_steps` says which ones)."""
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: sqlite3.Connection) -> None:
    """Run the steps the database has not run yet, all in one `BEGIN IMMEDIATE` transaction.

    Several processes may start at once on one file: the transaction serializes
    them and each reads the version under the lock. It is taken even when
    nothing is to run, so a database another process keeps locked is reported
    when a server or an operator command starts, not at its first write.
    Foreign keys are off while the steps run (step 4 rebuilds a referenced
    table) and checked after.
    """
    conn.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction: set it before
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(conn)
            if current > LATEST:
                raise StoreError(
                    f"the database is at schema version {current}, newer than this pollwarden knows "
                    f"({LATEST}); upgrade pollwarden, or point --db at another file"
                )
            recorded = _recorded(conn)
            numbers = [step.number for step in MIGRATIONS]
            todo = pending(numbers, version=current, recorded=recorded)
            conn.execute(STEPS_TABLE)
            if recorded is None:  # the record starts with what the database ran before it kept one
                ran = [(n,) for n in numbers if n not in todo]
                conn.executemany("INSERT INTO schema_steps (number) VALUES (?)", ran)
            for step in sorted((s for s in MIGRATIONS if s.number in todo), key=lambda s: s.number):
                for statement in split_sql(step.script):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_steps (number) VALUES (?)", (step.number,))
                conn.execute(f"PRAGMA user_version = {max(step.number, schema_version(conn))}")
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise StoreError(f"migration left rows without their operation: {broken[:5]}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.execute("PRAGMA foreign_keys = ON")


def _recorded(conn: sqlite3.Connection) -> set[int] | None:
    """The step numbers this database recorded running, or None before it kept a record (never empty)."""
    if (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_steps'").fetchone()
        is None
    ):
        return None
    return {int(row[0]) for row in conn.execute("SELECT number FROM schema_steps")} or None


def up_to_date(conn: sqlite3.Connection) -> bool:
    """Whether the database has run every step this pollwarden knows (late ones included)."""
    recorded = _recorded(conn)
    numbers = [s.number for s in MIGRATIONS]
    return not pending(numbers, version=schema_version(conn), recorded=recorded)


def split_sql(script: str) -> list[str]:
    """The statements of a script, one by one (`executescript` would COMMIT the caller's transaction)."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        stripped = line.split("--", 1)[0] if "--" in line else line
        buffer += stripped
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements


def audit_table_v1() -> str:
    """The audit table and its index as step 1 created them (for tools that build only the chain)."""
    return MIGRATIONS[0].script[MIGRATIONS[0].script.index("CREATE TABLE IF NOT EXISTS audit") :]
