"""One job, one budget: what makes two operations the same job, and what happens then.

A **job** is (provider table name, account context, provider job id). The
account context is the table's origin and the name of its credential variable
(`account_context_of`), recorded on the operation when it starts. Budgets,
deadlines and counters belong to the job: at most one operation holds it
(a partial UNIQUE index in the store, written in one `BEGIN IMMEDIATE`
transaction, so two processes starting the same job at once get one
operation).

* `start_operation` with a new `operation_id` for a job that already has an
  operation — in **any** status: waiting (a second budget would double the
  first), escalated (a new operation would be the way around the person who
  must decide), finished (the job's answer is final; a resubmission is a new
  job) — creates nothing. It answers with the existing operation's view
  (its id, status, stop reason, allowed actions) and `requested_operation_id`
  set to the id that was asked for.
* One payload in flight is one job. A submission (`submit=…`) whose request
  fingerprint (provider, account context, payload) belongs to an operation
  still in flight — `submitting` (held for a person too) or `waiting` — creates
  nothing under a new `operation_id` and sends nothing: it is answered with that
  operation, as for a tracked job. The lookup and the insert are one
  transaction (SQLite's `BEGIN IMMEDIATE`; on PostgreSQL under an advisory lock
  on the fingerprint), so two processes submitting one payload at once make one
  operation and one provider submission. Once that operation ended, the same
  payload is a new job: after a success it is sent as usual, after a failure,
  cancel, expiry or escalation only once a person approves (`resubmission`).
* A submission has no job id until the provider answers with one. If that id
  is already another operation's, the submission adopts nothing: it is
  recorded as `duplicate_of` that operation and stops with
  `job_already_tracked` (nothing more is sent for it); the caller is answered
  with the other operation.
* Operations recorded before this rule (schema 6) that shared a job keep
  their records; the earliest created keeps the job, the others are marked
  `duplicate_of` it and stop at their next check with `job_already_tracked`.
* The expected terminal state (the table's success states when the operation
  was recorded) is part of the operation's contract: an end answer is taken at
  the table's word only while the table still says the same
  (`terminal_state_mismatch`); otherwise the operation stops for a person.
* The only ways to more requests for a job stay the existing ones:
  `request_extension` through a person, or an operator's `reopen` after a
  refusal (authorization_denied, integration_failure, account_context_changed).

Pure functions; the store and the controller call them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pollwarden.access.ownership import owner_of
from pollwarden.core.canonical import canonical_json
from pollwarden.core.timefmt import iso
from pollwarden.core.untrusted import quoted
from pollwarden.core.vocabulary import Category, Status, StopReason
from pollwarden.rules.schedule import not_before

if TYPE_CHECKING:
    from pollwarden.core.records import OperationRecord
    from pollwarden_providers.table import ProviderTable

# Stops an operator may reopen once the cause is fixed: the provider refused the
# caller or the integration, or the account changed. Until then nothing is sent for
# the job under any operation id; `pollwarden reopen` is audited.
REOPENABLE: frozenset[StopReason] = frozenset(
    {
        StopReason.AUTHORIZATION_DENIED,
        StopReason.INTEGRATION_FAILURE,
        StopReason.ACCOUNT_CONTEXT_CHANGED,
    }
)

_ANONYMOUS = "anonymous"


def account_context(origin: str, credential_env: str | None) -> str:
    """The recorded form of an account context: `<origin> as $<VARIABLE>` (or `as anonymous`)."""
    return f"{origin} as {'$' + credential_env if credential_env else _ANONYMOUS}"


def account_context_of(table: ProviderTable) -> str:
    """Which provider account the server acts as: the origin and the credential's variable name."""
    return account_context(table.origin, table.auth.env if table.auth else None)


def fingerprint(provider: str, account_context: str, payload: object) -> str:
    """SHA-256 of the canonical JSON of provider, account context and payload."""
    canonical = canonical_json({"provider": provider, "account": account_context, "payload": payload})
    return hashlib.sha256(canonical.encode()).hexdigest()


def account_parts(context: str) -> tuple[str, str | None]:
    """(origin, credential variable name or None) of a recorded account context."""
    origin, _, who = context.rpartition(" as ")
    if not origin:
        return context, None
    return origin, who[1:] if who.startswith("$") else None


def expected_terminal_state_of(table: ProviderTable) -> str:
    """The recorded form of the expected terminal state: the table's success states, comma-separated."""
    return ",".join(table.states_of(Category.SUCCEEDED))


def terminal_state_mismatch(
    expected: str, table: ProviderTable, state: str, category: Category
) -> str | None:
    """Why an answer in `state` may not be read by the table's current categories, or None.

    `expected` is what the operation recorded when it started. While the table
    still lists exactly those success states, its reading stands. Once they
    changed, a success state the operation did not expect is no success, and
    an expected one the table now files elsewhere is no failure: either way
    the job's end is not reported at the edited table's word; a person looks.
    """
    if expected == expected_terminal_state_of(table):
        return None
    recorded = [s for s in expected.split(",") if s]
    if category == Category.SUCCEEDED and state not in recorded:
        what = f"the {table.name} table now counts {quoted(state)} as success"
    elif category != Category.SUCCEEDED and state in recorded:
        what = (
            f"{quoted(state)} was the expected success, but the {table.name} table now files it as {category}"
        )
    else:
        return None
    return (
        f"unexpected terminal state: {what}; the operation was recorded expecting "
        f"{', '.join(quoted(s) for s in recorded)}. The table's success states changed since it started, so "
        "this answer is not taken as a success or a failure. A person checks the job at the provider and "
        "restores the table, then an operator reopens this operation"
    )


# A submission in one of these is still in flight: its payload is one job until it ends.
PAYLOAD_IN_FLIGHT: frozenset[Status] = frozenset({Status.SUBMITTING, Status.WAITING})


def payload_in_flight(
    records: Iterable[OperationRecord], *, exclude: str | None, owner: str = "local"
) -> OperationRecord | None:
    """The newest submission among `records` (one payload's, newest first) still in flight, but `exclude`.

    Only `owner`'s count (another principal's operations do not exist for it). The stores'
    SELECT_PAYLOAD_IN_FLIGHT states the same condition in SQL.
    """
    for record in records:
        if (
            record.operation_id != exclude
            and record.owner == owner
            and record.status in PAYLOAD_IN_FLIGHT
            and record.submit_payload_json is not None
            and record.duplicate_of is None
        ):
            return record
    return None


def payload_in_flight_message(owner: OperationRecord, requested_operation_id: str) -> str:
    """What the agent is told when it submits a payload another operation has in flight."""
    state = owner.status
    if owner.held_for_approval:
        state = f"{state}: its resubmission waits for a person's approval"
    return (
        f"This payload is already in flight as operation {quoted(owner.operation_id)} ({state}); no operation "
        f"{quoted(requested_operation_id)} was created and nothing was sent: one payload in flight is one job, "
        f"with one budget. Use operation_id {quoted(owner.operation_id)}: call get_operation or check_status on "
        "it, and only the allowed_actions listed here. The same payload becomes a new job only after that "
        "operation ends (after a failure, cancel, expiry or escalation, once a person approves it)."
    )


# What a principal is told about a job another principal's operation holds: that it is tracked, and who may
# share it — never that operation's id, state or budget.
TRACKED_BY_ANOTHER_PRINCIPAL = (
    "this job is already tracked on this server under another principal; a job has one budget and one "
    "lease whoever asks (the provider sees one caller and one job), so no operation was created here and "
    "nothing is sent for it under this principal. An operator may share that operation with you"
)


def tracked_by_another_principal(requested_operation_id: str) -> str:
    """The refusal a principal gets when it starts a job another principal's operation holds."""
    return f"No operation {quoted(requested_operation_id)} was created: {TRACKED_BY_ANOTHER_PRINCIPAL}."


def already_tracked_message(owner: OperationRecord, requested_operation_id: str) -> str:
    """What the agent is told when it starts a job another operation already holds."""
    state = owner.status if owner.stop_reason is None else f"{owner.status}: {owner.stop_reason}"
    return (
        f"This job is already tracked as operation {quoted(owner.operation_id)} ({state}); no operation "
        f"{quoted(requested_operation_id)} was created and no new budget or deadline was granted: a job has "
        f"one budget, whatever the operation id. Use operation_id {quoted(owner.operation_id)}: call "
        "get_operation or check_status on it, and only the allowed_actions listed here."
    )


def duplicate_changes(
    owner_id: str, job_id: str, *, at: float, another_principal: bool = False
) -> dict[str, object]:
    """A submission answered with a job id another operation holds: it stops, adopting nothing.

    `another_principal`: that operation is another principal's, so it is not named (issue 30).
    """
    detail = (
        f"the provider answered with job {quoted(job_id)}, which operation {quoted(owner_id)} already "
        f"tracks; its budget and deadline hold for the job. Nothing is sent under this operation: use "
        f"{quoted(owner_id)}"
    )
    if another_principal:
        detail = f"the provider answered with job {quoted(job_id)}: {TRACKED_BY_ANOTHER_PRINCIPAL}"
    return {
        "status": Status.ESCALATED,
        "stop_reason": StopReason.JOB_ALREADY_TRACKED,
        "stop_detail": detail,
        "duplicate_of": owner_id,
        "stopped_at": at,
        "lease_owner": None,
        "lease_expires_at": None,
    }


def job_holder_shown(record: OperationRecord) -> str | None:
    """The operation holding `record`'s job as its own principal may be told it: None when there is none, or
    it is another principal's (never named to it; an operator reads `duplicate_of` in the store)."""
    if record.duplicate_of is None or owner_of(record.duplicate_of) != record.owner:
        return None
    return record.duplicate_of


def duplicate_detail(record: OperationRecord) -> str:
    """Why an operation marked `duplicate_of` another one stops before sending anything.

    Another principal's holder (schema step 14 marked duplicates across principals) is not named.
    """
    job = quoted(record.provider_job_id or "")
    holder = job_holder_shown(record)
    if holder is None:
        return (
            f"job {job} is held by the earliest operation recorded for it, under another principal; a job has "
            "one budget, so nothing is sent under this one. An operator may share that operation with you"
        )
    return (
        f"operation {quoted(holder)} holds job {job} "
        "(the earliest operation recorded for it); a job has one budget, so nothing is sent under this one"
    )


def account_changed_detail(recorded: str, current: str) -> str:
    """Why a check stopped instead of polling under another account."""
    origin, env = account_parts(recorded)
    now_origin, now_env = account_parts(current)
    return (
        f"the operation was recorded for origin {origin} with credential "
        f"{'$' + env if env else '(none)'}, but the provider table now says origin {now_origin} with "
        f"credential {'$' + now_env if now_env else '(none)'}; nothing is sent under another account. "
        "A person restores the table or the server's environment, then an operator reopens this operation"
    )


def reopen_next_check_at(record: OperationRecord, now: float) -> float:
    """When a reopened operation may send again: now, never before its earliest allowed request (`not_before_at`)."""
    return not_before(now, record.not_before_at)


def reopen_refusal(record: OperationRecord) -> str | None:
    """Why an operator may not reopen this operation, or None."""
    if record.status != Status.ESCALATED or record.stop_reason not in REOPENABLE:
        what = record.stop_reason or record.status
        hint = ""
        if record.status == Status.ESCALATED:
            hint = "; more waiting after this stop goes through request_extension and a person's approval"
        elif record.status == Status.WAITING:
            hint = "; it is still waiting"
        return (
            f"operation {quoted(record.operation_id)} stopped with {what}, which reopen does not apply to "
            f"(only {', '.join(sorted(REOPENABLE))}){hint}. Nothing changed"
        )
    if record.provider_job_id is None:
        return (
            f"operation {quoted(record.operation_id)} has no provider job id (its submission stopped before the "
            "provider named one), so there is nothing to poll; a resubmission is a new operation. Nothing changed"
        )
    if record.duplicate_of is not None:
        return (
            f"operation {quoted(record.operation_id)} is a duplicate of {quoted(record.duplicate_of)}, which holds "
            "the job; reopen that one if it needs it. Nothing changed"
        )
    return None


def reopen_summary(record: OperationRecord) -> list[str]:
    """The facts an operator reads before reopening (untrusted values quoted, one per line)."""
    return [
        f"Reopen operation {quoted(record.operation_id)}?",
        f"Provider: {quoted(record.provider)}, job {quoted(record.provider_job_id or '(none)')}",
        f"Stopped because: {record.stop_reason} at {iso(record.stopped_at)}",
        f"Detail: {quoted(record.stop_detail or '')}",
        f"Status requests: {record.status_requests_used} of {record.max_status_requests}; "
        f"deadline {iso(record.effective_deadline)}",
        "Reopening sends status requests for this job again, inside the same budget and deadline; "
        "fix the cause first (credentials, the provider table, the account).",
    ]
