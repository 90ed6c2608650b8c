"""The check procedure on SQLite: the gate's verdict written before the request, in one hop.

`begin_check` loads the operation, lets the pure gate (`pollwarden.rules.gate`)
decide, and writes what it decided, guarded in SQL by the version it read
(optimistic: another process that changed the operation in between makes the
guard fail, and the decision is taken again under the write lock).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pollwarden.core.records import CheckStart
from pollwarden.store import plans
from pollwarden.store.sqlite import executor
from pollwarden.store.sqlite.connection import Session
from pollwarden.store.sqlite.executor import StaleRow
from pollwarden.store.transactions import check, gate
from pollwarden_providers.table_limits import FleetSpec


def begin_check(
    session: Session,
    operation_id: str,
    *,
    now: float,
    wait_until: float,
    owner: str,
    lease_seconds: float,
    fleets: Mapping[str, FleetSpec | None],
    apply_approvals: bool,
    key: bytes | None,
    clock: Callable[[], float] | None = None,
    accounts: Mapping[str, str] | None = None,
    needs_person: frozenset[str] = frozenset(),
    fleet_slots: int | None = None,
) -> CheckStart | None:
    """Decide one round of check_status and write what it decided; None when there is no such operation.

    With `clock`, the time every write is guarded and paced by is read again
    once the write lock is held: BEGIN may wait for another process, and a
    fleet slot must be taken when the request really leaves, not before.
    """
    conn = session.conn
    current = executor.fetch(conn, operation_id)  # a snapshot read, outside any transaction
    if current is None:
        return None
    ask = (wait_until, fleets, apply_approvals, accounts, needs_person)
    fleet = fleets.get(current.record.provider)
    decision = executor.run_flow(conn, gate(current.record, now, *ask), None, key)
    if not decision.writes:
        return CheckStart(current.record, decision)
    try:
        with session.transaction(durable=not plans.quiet_refusal(current.refusals, decision)):
            now = clock() if clock is not None else now
            flow = check(current, decision, now, owner, lease_seconds, fleet, fleet_slots)
            return executor.run_flow(conn, flow, None, key, durable=session.durable, fresh=False)
    except StaleRow:
        pass
    # Another process moved first: decide again with the write lock held, where nothing can change.
    with session.transaction(durable=True):
        now = clock() if clock is not None else now
        current = executor.must_fetch(conn, operation_id)
        decision = executor.run_flow(conn, gate(current.record, now, *ask), None, key)
        if not decision.writes:
            return CheckStart(current.record, decision)
        flow = check(current, decision, now, owner, lease_seconds, fleet, fleet_slots)
        return executor.run_flow(conn, flow, None, key)
