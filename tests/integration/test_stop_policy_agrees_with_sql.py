"""One stop policy: the store's SQL guards state exactly the conditions `pollwarden.rules.stop` decides by.

For drawn records and times (edges included: a time equal to a deadline, the
last status request), each engine's real database, migrated by the store,
answers the guard's conditions for the stored row; they must be the pure
predicates' answer, and the reservation (the gate's RESERVE statement) must
take the lease exactly when `gate.may_reserve` says it may.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import database_in, operation_record
from pollwarden.core.records import OPERATION_COLUMNS, OperationRecord
from pollwarden.core.vocabulary import Status, StopReason
from pollwarden.rules import stop
from pollwarden.rules.gate import may_reserve
from pollwarden.store import DatabaseLocation, open_store, statements
from pollwarden.store.postgres import sql as postgres_sql

pytestmark = pytest.mark.both_engines

T = 1000.0
# Times around the deadlines and the next check, so that equality is drawn often.
offsets = st.sampled_from([-1.0, -0.001, 0.0, 0.001, 1.0]) | st.floats(min_value=-3000, max_value=3000)


@st.composite
def rows(draw: st.DrawFn) -> tuple[OperationRecord, float]:
    """A stored operation (waiting or not, leased or not, any budget use) and the time it is looked at."""
    budget = draw(st.integers(min_value=1, max_value=5))
    deadline = T + draw(st.floats(min_value=0, max_value=3000))
    leased = draw(st.booleans())
    record = operation_record(
        status=draw(st.sampled_from([Status.WAITING, Status.WAITING, Status.ESCALATED])),
        stop_reason=None,
        stopped_at=None,
        deadline_at=deadline,
        business_deadline_at=draw(st.none() | offsets.map(lambda d: deadline + d)),
        max_status_requests=budget,
        status_requests_used=draw(st.integers(min_value=0, max_value=budget)),
        next_check_at=T + draw(st.floats(min_value=0, max_value=3000)),
        lease_owner="other" if leased else None,
        lease_expires_at=T + draw(st.floats(min_value=0, max_value=3000)) if leased else None,
    )
    if record.status == Status.ESCALATED:
        record = operation_record(**{**record.__dict__, "stop_reason": StopReason.DEADLINE_EXCEEDED})
    anchor = draw(st.sampled_from([deadline, record.effective_deadline, record.next_check_at, T]))
    return record, anchor + draw(offsets)


class Database:
    """One connection to the test's migrated database, in the engine's parameter style."""

    def __init__(self, location: DatabaseLocation) -> None:
        self.postgres = not location.is_sqlite
        if self.postgres:
            import psycopg

            self.conn: Any = psycopg.connect(location.dsn, autocommit=True)
        else:
            self.conn = sqlite3.connect(location.path, isolation_level=None)
        self.reserve = postgres_sql.dialect(statements.RESERVE) if self.postgres else statements.RESERVE

    def param(self, name: str) -> str:
        return f"%({name})s" if self.postgres else f":{name}"

    def store(self, record: OperationRecord) -> None:
        """Replace the one stored operation with `record`."""
        self.conn.execute("DELETE FROM operations")
        names = ", ".join(OPERATION_COLUMNS)
        values = ", ".join(self.param(c) for c in OPERATION_COLUMNS)
        row = dict(zip(OPERATION_COLUMNS, astuple(record), strict=True))
        self.conn.execute(f"INSERT INTO operations ({names}) VALUES ({values})", row)

    def one(self, statement: str, params: dict[str, object]) -> Any:
        return self.conn.execute(statement, params).fetchone()


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    location = database_in(tmp_path)

    async def migrate() -> None:
        async with open_store(location):
            pass

    anyio.run(migrate)
    db = Database(location)
    try:
        yield db
    finally:
        db.conn.close()


EXAMPLES = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@EXAMPLES
@given(drawn=rows())
def test_the_sql_guards_deadline_and_budget_conditions_are_the_stop_predicates(
    database: Database, drawn: tuple[OperationRecord, float]
) -> None:
    record, now = drawn
    database.store(record)
    now_param = database.param("now")
    conditions = f"SELECT ({stop.deadline_open_sql(now_param)}), ({stop.BUDGET_LEFT_SQL}) FROM operations"
    deadline_open, budget_left = database.one(conditions, {"now": now})
    assert bool(deadline_open) == (not stop.reaches_deadline(record, now))
    assert bool(deadline_open) == (stop.deadline_passed(record, now, before="this check") is None)
    assert bool(budget_left) == (stop.budget_used(record) is None)


@EXAMPLES
@given(drawn=rows())
def test_the_reservation_takes_the_lease_exactly_when_the_gate_may_reserve(
    database: Database, drawn: tuple[OperationRecord, float]
) -> None:
    record, now = drawn
    database.store(record)
    params: dict[str, object] = {
        "owner": "me",
        "lease_expires_at": now + 30,
        "now": now,
        "operation_id": record.operation_id,
        "version": record.version,
    }
    reserved = database.one(database.reserve, params) is not None
    assert reserved == may_reserve(record, now)
