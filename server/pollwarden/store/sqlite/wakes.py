"""A verified provider webhook as one transaction: remember its id, wake the operations it names.

The receiver (`pollwarden.provider_io.webhooks`) has already checked the signature, the
timestamp and the event type; this only decides, under the write lock, whether
the event is new and which waiting operations it may bring forward. A webhook
is a hint: it sets `next_check_at` (and `woken_at`) to now, never before the
operation's `not_before_at`, nothing else.
"""

from __future__ import annotations

from pollwarden.core.records import WakeOutcome, WakeResult
from pollwarden.store import plans, statements
from pollwarden.store.sqlite import executor
from pollwarden.store.sqlite.connection import Session


def wake(
    session: Session,
    *,
    provider: str,
    job_id: str,
    event_id: str,
    event_type: str,
    now: float,
    remember_seconds: float,
    key: bytes | None,
) -> WakeResult:
    """Remember `event_id` and wake `provider`'s waiting operations on `job_id`, in one transaction.

    An unknown job writes nothing (not even the event id). A known event id is
    a replay: nothing changes. Event ids older than `remember_seconds` are
    pruned first (the receiver refuses events older than that anyway).
    """
    conn = session.conn
    if conn.execute(statements.KNOWS_JOB, {"provider": provider, "job_id": job_id}).fetchone() is None:
        return WakeResult(WakeOutcome.UNKNOWN_JOB, ())
    with session.transaction():
        conn.execute(
            statements.PRUNE_WEBHOOK_EVENTS, {"provider": provider, "before": now - remember_seconds}
        )
        if (
            conn.execute(
                statements.REMEMBER_WEBHOOK_EVENT, {"provider": provider, "event_id": event_id, "now": now}
            ).fetchone()
            is None
        ):
            return WakeResult(WakeOutcome.REPLAYED, ())
        woken: list[str] = []
        for row in conn.execute(
            statements.WAITING_ON_JOB, {"provider": provider, "job_id": job_id}
        ).fetchall():
            current = executor.stored(row)
            plan = plans.wake_plan(current.record, now=now, event_id=event_id, event_type=event_type)
            if plan is not None:
                executor.carry_out(conn, current, plan, key)
                woken.append(current.record.operation_id)
        return WakeResult(WakeOutcome.WOKEN if woken else WakeOutcome.NOT_WOKEN, tuple(woken))
