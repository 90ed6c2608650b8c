"""The PostgreSQL schema, as numbered steps that match the SQLite engine's.

The step numbers are SQLite's `user_version` numbers: a PostgreSQL database at
version N holds what a SQLite file at N holds. Step 5 creates the whole schema
as SQLite had it after its steps 1-5 (the PostgreSQL engine first shipped
then); every later SQLite step gets a step here with the same number, written
as an `ALTER TABLE … ADD COLUMN` or a new table (each table is created in one
place: step 5's CREATE TABLE, or the step that adds it). Steps are frozen once
released, like SQLite's.

Every time is `double precision` epoch seconds written from the controller's
clock (no column defaults to now()); the vocabulary is spelled out as CHECK
constraints, as in SQLite.

Step 13 is PostgreSQL's own (per-operation audit chains); SQLite has no step 13.

Migrations run in one transaction under a transaction-scoped advisory lock,
so several instances starting at once run them exactly once; a database at a
version newer than this code is refused. Steps run in number order, but one
may ship after a higher one did (step 8 after 9): `pollwarden_schema_steps`
records which steps ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from pollwarden.audit.chain import GENESIS_HASH
from pollwarden.core.errors import StoreError
from pollwarden.store.migrations import pending
from pollwarden.store.postgres.connection import Pool


@dataclass(frozen=True)
class Migration:
    """One frozen schema step."""

    number: int
    name: str
    statements: tuple[str, ...]


# Instances migrating one database's pollwarden schema take this transaction-scoped lock: the two-key
# form, "pomi" and the schema's name (the tables live in the first schema of search_path), so two
# pollwarden schemas in one database (a team's and a test's) never wait for each other.
MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(1886350697, hashtext(current_schema()))"

OPERATIONS = """
CREATE TABLE operations (
    operation_id text PRIMARY KEY,
    provider text NOT NULL,
    provider_job_id text,
    account_context text NOT NULL,
    request_fingerprint text NOT NULL,
    idempotency_key text,
    expected_terminal_state text NOT NULL,
    status text NOT NULL CHECK (status IN
        ('submitting','waiting','succeeded','failed','cancelled','expired','escalated')),
    stop_reason text CHECK (stop_reason IN
        ('succeeded','provider_failure','cancelled','expired','deadline_exceeded',
         'request_budget_exhausted','delivery_ambiguous','rate_limited','unknown_state',
         'awaiting_review','authorization_denied','integration_failure')),
    stop_detail text,
    state text,
    category text CHECK (category IN
        ('pending','succeeded','failed','cancelled','expired','awaiting_review','unknown')),
    started_at double precision NOT NULL,
    deadline_at double precision NOT NULL,
    business_deadline_at double precision,
    max_status_requests bigint NOT NULL CHECK (max_status_requests > 0),
    max_transport_failures bigint NOT NULL CHECK (max_transport_failures > 0),
    max_rate_limited bigint NOT NULL CHECK (max_rate_limited > 0),
    status_requests_used bigint NOT NULL DEFAULT 0,
    transport_failures_used bigint NOT NULL DEFAULT 0,
    rate_limited_used bigint NOT NULL DEFAULT 0,
    polls_completed bigint NOT NULL DEFAULT 0,
    next_check_at double precision NOT NULL,
    delay_source text NOT NULL CHECK (delay_source IN
        ('local_backoff','provider_retry_after','provider_poll_hint','manual_extension','fleet_pacing')),
    retry_after_seconds double precision,
    last_http_status bigint,
    last_http_at double precision,
    provider_request_id text,
    provider_expires_at double precision,
    error text,
    result_json text,
    lease_owner text,
    lease_expires_at double precision,
    refused_count bigint NOT NULL DEFAULT 0 CHECK (refused_count >= 0),
    refused_outcome text CHECK (refused_outcome IN ('not_yet','stopped')),
    refused_first_at double precision,
    refused_last_at double precision,
    extensions_used bigint NOT NULL DEFAULT 0,
    stopped_at double precision,
    submit_payload_json text,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    version bigint NOT NULL DEFAULT 1,
    fleet_slot_at double precision,
    CHECK (status_requests_used <= max_status_requests),
    CHECK ((refused_count = 0) = (refused_outcome IS NULL))
)"""

APPROVALS = """
CREATE TABLE approvals (
    approval_id text PRIMARY KEY,
    operation_id text NOT NULL REFERENCES operations(operation_id),
    kind text NOT NULL,
    status text NOT NULL CHECK (status IN ('pending','approved','denied','expired','void','applied')),
    request_json text NOT NULL,
    bound_version bigint NOT NULL,
    asked_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    decided_at double precision,
    decided_by text,
    note text,
    decided_method text,
    decision_signature text
)"""

# `inserted` keeps insertion order (SQLite's rowid) for listing follow-ups.
FOLLOWUPS = """
CREATE TABLE followups (
    followup_id text PRIMARY KEY,
    operation_id text NOT NULL REFERENCES operations(operation_id),
    kind text NOT NULL CHECK (kind IN ('fetch_result', 'cancel')),
    status text NOT NULL CHECK (status IN ('done', 'refused', 'sent', 'failed', 'ambiguous')),
    approval_id text,
    requested_at double precision NOT NULL,
    finished_at double precision,
    http_status bigint,
    answer text,
    note text,
    inserted bigint GENERATED ALWAYS AS IDENTITY
)"""

AUDIT = """
CREATE TABLE audit (
    seq bigint PRIMARY KEY,
    operation_id text NOT NULL,
    at text NOT NULL,
    kind text NOT NULL,
    payload text NOT NULL,
    prev_hash text NOT NULL,
    hash text NOT NULL,
    keyed boolean NOT NULL DEFAULT false
)"""

# The chain's head in one row: every append locks it (FOR UPDATE), so appends from every process form
# one chain. seq 0 with the genesis hash is the empty chain.
AUDIT_HEAD = f"""
CREATE TABLE audit_head (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    seq bigint NOT NULL,
    hash text NOT NULL,
    keyed boolean NOT NULL
);
INSERT INTO audit_head (one, seq, hash, keyed) VALUES (true, 0, '{GENESIS_HASH}', false)"""

# One GCRA clock per provider; tat is NULL until the first request (the row exists so it can be locked).
FLEET_BUCKETS = """
CREATE TABLE fleet_buckets (
    provider text PRIMARY KEY,
    tat double precision
)"""

# Step 13 (issue 18): an operation's audit rows after its first follow that operation's row before
# them (`pollwarden.audit.verify`), so answers to different operations never wait for one chain's
# head. Every row gets its seq from a sequence (the order of all rows; an operation's rows are
# inserted under its row lock, so their seqs are in its order); `position` is the number hashed
# and `link` which row it follows. Rows before this step keep both NULL: chain rows at their seq.
# Each operation's row records its chain (how many rows, the last hash) and how far a seal named it.
PER_OPERATION_CHAINS = (
    "CREATE SEQUENCE audit_seq AS bigint OWNED BY audit.seq",
    "SELECT setval('audit_seq', COALESCE((SELECT max(seq) FROM audit), 0) + 1, false)",
    "ALTER TABLE audit ALTER COLUMN seq SET DEFAULT nextval('audit_seq')",
    "ALTER TABLE audit ADD COLUMN position bigint",
    "ALTER TABLE audit ADD COLUMN link text CHECK (link IN ('chain', 'operation'))",
    "ALTER TABLE operations ADD COLUMN audit_rows bigint NOT NULL DEFAULT 0",
    "ALTER TABLE operations ADD COLUMN audit_hash text",
    "ALTER TABLE operations ADD COLUMN audit_sealed_rows bigint NOT NULL DEFAULT 0",
    """UPDATE operations AS o SET audit_rows = c.n, audit_hash = c.last, audit_sealed_rows = c.n
       FROM (SELECT operation_id, count(*) AS n, (array_agg(hash ORDER BY seq DESC))[1] AS last
             FROM audit GROUP BY operation_id) AS c
       WHERE c.operation_id = o.operation_id""",
    # An instance of the release before this step, still running, would append rows with no place
    # (its seq from the head, colliding with the sequence or landing out of order): refuse them, loudly.
    """CREATE FUNCTION pollwarden_refuse_unplaced_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         RAISE EXCEPTION 'this database was upgraded to pollwarden schema step 13 (per-operation audit '
           'chains) while this instance of an earlier pollwarden was running; stop it and start the new '
           'pollwarden; nothing was recorded';
       END $$""",
    "CREATE TRIGGER audit_rows_have_a_place BEFORE INSERT ON audit FOR EACH ROW WHEN (NEW.link IS NULL) "
    "EXECUTE FUNCTION pollwarden_refuse_unplaced_audit_row()",
)

_FIRST_RELEASE: tuple[Migration, ...] = (
    Migration(
        5,
        "the schema of SQLite steps 1-5",
        (
            OPERATIONS,
            APPROVALS,
            FOLLOWUPS,
            AUDIT,
            *AUDIT_HEAD.split(";"),
            FLEET_BUCKETS,
            "CREATE INDEX operations_by_created ON operations(created_at DESC, operation_id)",
            "CREATE INDEX operations_by_status ON operations(status, created_at DESC, operation_id)",
            "CREATE INDEX operations_by_provider ON operations(provider, created_at DESC, operation_id)",
            "CREATE INDEX operations_with_refusals ON operations(operation_id) WHERE refused_count > 0",
            "CREATE INDEX approvals_by_operation ON approvals(operation_id, status)",
            "CREATE INDEX approvals_by_status ON approvals(status, asked_at)",
            "CREATE INDEX followups_by_operation ON followups(operation_id, requested_at)",
            "CREATE INDEX audit_by_operation ON audit(operation_id, seq)",
        ),
    ),
)

# SQLite step 6 (one job, one budget): the job's holder is unique among the operations not marked
# `duplicate_of` another; two more stop reasons; when the last status request was sent.
_THROUGH_6: tuple[Migration, ...] = (
    *_FIRST_RELEASE,
    Migration(
        6,
        "one operation per job, account context and duplicate stops, request time",
        (
            "ALTER TABLE operations ADD COLUMN duplicate_of text "
            "CHECK (duplicate_of IS NULL OR duplicate_of <> operation_id)",
            "ALTER TABLE operations ADD COLUMN request_sent_at double precision",
            "ALTER TABLE operations DROP CONSTRAINT operations_stop_reason_check",
            """ALTER TABLE operations ADD CONSTRAINT operations_stop_reason_check CHECK (stop_reason IN
                ('succeeded','provider_failure','cancelled','expired','deadline_exceeded',
                 'request_budget_exhausted','delivery_ambiguous','rate_limited','unknown_state',
                 'awaiting_review','authorization_denied','integration_failure',
                 'account_context_changed','job_already_tracked'))""",
            """UPDATE operations AS o SET duplicate_of = (
                SELECT o2.operation_id FROM operations AS o2
                WHERE o2.provider = o.provider AND o2.account_context = o.account_context
                  AND o2.provider_job_id = o.provider_job_id
                ORDER BY o2.created_at, o2.operation_id LIMIT 1)
            WHERE provider_job_id IS NOT NULL AND EXISTS (
                SELECT 1 FROM operations AS o3
                WHERE o3.provider = o.provider AND o3.account_context = o.account_context
                  AND o3.provider_job_id = o.provider_job_id
                  AND (o3.created_at < o.created_at
                       OR (o3.created_at = o.created_at AND o3.operation_id < o.operation_id)))""",
            "CREATE UNIQUE INDEX operations_one_per_job ON operations(provider, account_context, provider_job_id) "
            "WHERE provider_job_id IS NOT NULL AND duplicate_of IS NULL",
        ),
    ),
)

# Step 14: the operation holding an operation's job (the earliest recorded), in a correlated subquery.
_JOB_HOLDER = (
    "SELECT o.operation_id FROM operations o WHERE o.provider = operations.provider "
    "AND o.account_context = operations.account_context AND o.provider_job_id = operations.provider_job_id "
    "AND o.duplicate_of IS NULL ORDER BY o.created_at, o.operation_id LIMIT 1"
)

# SQLite step 9 (signed provider webhooks): the event ids seen, when a webhook last woke an operation.
MIGRATIONS: tuple[Migration, ...] = (
    *_THROUGH_6,
    # SQLite step 7: a resubmission held until a person approves; a payload's operations by fingerprint.
    Migration(
        7,
        "resubmissions held for a person",
        (
            "ALTER TABLE operations ADD COLUMN resubmission_of text",
            "ALTER TABLE operations ADD COLUMN resubmission_approved_by text",
            "CREATE INDEX operations_by_fingerprint ON operations(request_fingerprint, created_at DESC)",
        ),
    ),
    # SQLite step 8 (issue 19): every operation belongs to a principal; one job, one budget per principal.
    Migration(
        8,
        "operation owners",
        (
            "ALTER TABLE operations ADD COLUMN owner text NOT NULL DEFAULT 'local'",
            "CREATE INDEX operations_by_owner ON operations(owner, created_at DESC, operation_id)",
            "DROP INDEX operations_one_per_job",
            "CREATE UNIQUE INDEX operations_one_per_job ON operations"
            "(provider, account_context, provider_job_id, owner) "
            "WHERE provider_job_id IS NOT NULL AND duplicate_of IS NULL",
        ),
    ),
    Migration(
        9,
        "webhook events and wake-ups",
        (
            """CREATE TABLE webhook_events (
                provider text NOT NULL,
                event_id text NOT NULL,
                received_at double precision NOT NULL,
                PRIMARY KEY (provider, event_id)
            )""",
            "CREATE INDEX webhook_events_by_age ON webhook_events(received_at)",
            "ALTER TABLE operations ADD COLUMN woken_at double precision",
            "CREATE INDEX operations_by_provider_job ON operations(provider, provider_job_id)",
        ),
    ),
    # SQLite step 12: when the submission request was sent.
    Migration(
        12, "submission request time", ("ALTER TABLE operations ADD COLUMN submit_sent_at double precision",)
    ),
    # PostgreSQL's own step 13 (SQLite has none: one writer at a time, its one chain costs nothing).
    Migration(13, "per-operation audit chains under the one chain", PER_OPERATION_CHAINS),
    # SQLite step 14 (issue 30): the earliest a status request may go out; one job, one budget across principals.
    Migration(
        14,
        "the earliest allowed request",
        (
            "ALTER TABLE operations ADD COLUMN not_before_at double precision",
            "UPDATE operations SET not_before_at = last_http_at + retry_after_seconds "
            "WHERE last_http_at IS NOT NULL AND retry_after_seconds IS NOT NULL",
            # One job, one budget across principals: the earliest operation keeps a job, the others become
            # its duplicates (the subquery reads the table as it was before this statement).
            f"UPDATE operations SET duplicate_of = ({_JOB_HOLDER}) WHERE provider_job_id IS NOT NULL "
            f"AND duplicate_of IS NULL AND operation_id <> ({_JOB_HOLDER})",
            "DROP INDEX operations_one_per_job",
            "CREATE UNIQUE INDEX operations_one_per_job ON operations(provider, account_context, provider_job_id) "
            "WHERE provider_job_id IS NOT NULL AND duplicate_of IS NULL",
        ),
    ),
    # SQLite step 15: the approval policy of the database (`pollwarden.access.approval_policy`).
    Migration(
        15,
        "approval policy",
        (
            """CREATE TABLE approval_policy (
                id integer PRIMARY KEY CHECK (id = 1),
                require_operator_key boolean NOT NULL DEFAULT false,
                channels text NOT NULL DEFAULT 'elicitation,tool-confirmation,app,operator',
                operator_keys text NOT NULL DEFAULT '',
                updated_at double precision,
                updated_by text
            )""",
            "INSERT INTO approval_policy (id) VALUES (1)",
        ),
    ),
    # SQLite step 16 (issue 29): the pace row's second clock, of the requests that really left.
    Migration(
        16,
        "fleet pace: the sends' clock",
        ("ALTER TABLE fleet_buckets ADD COLUMN sent_tat double precision",),
    ),
    # Step 18 (issue 34): only the audit's refusal summaries, for the metrics scrape's sum.
    Migration(
        18,
        "audit refusal summaries index",
        (
            "CREATE INDEX audit_refusal_summaries ON audit(kind, operation_id) "
            "WHERE kind IN ('not_yet_summary', 'stopped_summary')",
        ),
    ),
)

LATEST = max(step.number for step in MIGRATIONS)

# The highest step run, and every step run by number (`pollwarden.store.migrations`: a step may ship late).
VERSION_TABLE = "CREATE TABLE IF NOT EXISTS pollwarden_schema (version integer NOT NULL)"
STEPS_TABLE = "CREATE TABLE IF NOT EXISTS pollwarden_schema_steps (number integer PRIMARY KEY)"
STATE_TABLES = (
    "SELECT to_regclass('pollwarden_schema') IS NOT NULL, to_regclass('pollwarden_schema_steps') IS NOT NULL"
)


async def migrate(pool: Pool) -> None:
    """Run the schema steps this database has not run, once, under an advisory lock; refuse a newer schema.

    An up-to-date database is only read (a read-only session, e.g. a standby, can still serve reads);
    otherwise the version is read again under the lock, so instances starting together run each step once.
    Which steps ran is recorded by number (`pollwarden.store.migrations`: a step may ship late).
    """
    numbers = [step.number for step in MIGRATIONS]
    exists = await pool.read_one(STATE_TABLES)
    if exists is not None and exists[0] and exists[1]:
        row = await pool.read_one("SELECT coalesce(max(version), 0) FROM pollwarden_schema")
        current = _checked_version(pool, 0 if row is None else int(row[0]))
        recorded = {int(r[0]) for r in await pool.read("SELECT number FROM pollwarden_schema_steps")}
        if not pending(numbers, version=current, recorded=recorded):
            return
    async with pool.transaction() as tx:
        await tx.queue(MIGRATION_LOCK)
        await tx.queue(VERSION_TABLE)
        await tx.queue(STEPS_TABLE)
        row = await tx.one("SELECT max(version) FROM pollwarden_schema")
        current = _checked_version(pool, 0 if row is None or row[0] is None else int(row[0]))
        # An empty record was made just now: the database kept none before (a kept one is never empty).
        recorded = {int(r[0]) for r in await tx.all("SELECT number FROM pollwarden_schema_steps")} or None
        todo = pending(numbers, version=current, recorded=recorded)
        if recorded is None:  # the record starts with what the database ran before it kept one
            for number in (n for n in numbers if n not in todo):
                await tx.queue("INSERT INTO pollwarden_schema_steps (number) VALUES (%s)", (number,))
        for step in sorted((s for s in MIGRATIONS if s.number in todo), key=lambda s: s.number):
            for statement in step.statements:
                if statement.strip():
                    await tx.queue(statement)
            await tx.queue("INSERT INTO pollwarden_schema_steps (number) VALUES (%s)", (step.number,))
            current = max(current, step.number)
            await tx.queue("DELETE FROM pollwarden_schema")
            await tx.queue("INSERT INTO pollwarden_schema (version) VALUES (%s)", (current,))
        await tx.one("SELECT 1")  # surface a failed step here, inside the transaction


def _checked_version(pool: Pool, current: int) -> int:
    if current > LATEST:
        raise StoreError(
            f"the PostgreSQL database {pool.location.display} is at schema version {current}, newer "
            f"than this pollwarden knows ({LATEST}); upgrade pollwarden, or point --db at "
            "another database"
        )
    return current
