"""The check procedure on SQLite: the gate's verdict written before the request, in one hop.

`begin_check` loads the operation, lets the pure gate (`pollwarden.rules.gate`)
decide, and writes what it decided, guarded in SQL by the version it read
(optimistic: another process that changed the operation in between makes the
guard fail, and the decision is taken again under the write lock).
"""

from __future__ import annotations

from pollwarden.core.records import CheckStart
from pollwarden.store import plans
from pollwarden.store.sqlite import executor
from pollwarden.store.sqlite.connection import Session
from pollwarden.store.sqlite.executor import StaleRow
from pollwarden.store.transactions import CheckCall, gate


def begin_check(session: Session, *, call: CheckCall, key: bytes | None) -> CheckStart | None:
    """Decide one round of check_status and write what it decided; None when there is no such operation.

    With `clock`, the time every write is guarded and paced by is read again
    once the write lock is held: BEGIN may wait for another process, and a
    fleet slot must be taken when the request really leaves, not before.
    """
    conn = session.conn
    operation_id, now, ask = call.operation_id, call.now, call.asks
    current = executor.fetch(conn, operation_id)  # a snapshot read, outside any transaction
    if current is None:
        return None
    decision = executor.run_flow(conn, gate(current.record, now, *ask), None, key)
    if not decision.writes:
        return CheckStart(current.record, decision)
    try:
        with session.transaction(durable=not plans.quiet_refusal(current.refusals, decision)):
            now = call.time(now)
            # BEGIN may have waited past a deadline or an allowed time: what is written is the verdict at
            # the time it is guarded and paced by (its times, such as a busy lease's retry, read then);
            # a verdict of another kind is decided again on the locked path.
            again = executor.run_flow(conn, gate(current.record, now, *ask), None, key)
            if (again.kind, again.stop_reason) != (decision.kind, decision.stop_reason):
                raise StaleRow(f"operation {operation_id!r}: the verdict changed while BEGIN waited")
            decision = again
            flow = call.check_flow(current, decision, now)
            return executor.run_flow(conn, flow, None, key, durable=session.durable, fresh=False)
    except StaleRow:
        pass
    # Another process moved first, or the time did: decide again with the write lock held.
    with session.transaction(durable=True):
        now = call.time(now)
        current = executor.must_fetch(conn, operation_id)
        decision = executor.run_flow(conn, gate(current.record, now, *ask), None, key)
        if not decision.writes:
            return CheckStart(current.record, decision)
        flow = call.check_flow(current, decision, now)
        return executor.run_flow(conn, flow, None, key)
