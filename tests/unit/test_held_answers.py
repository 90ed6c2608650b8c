"""An answer the database could not record is held and retried until it is recorded, never dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import pytest

from harness import operation_record
from pollwarden.core.clock import FakeClock
from pollwarden.core.errors import StoreError
from pollwarden.core.records import OperationRecord
from pollwarden.flows.held_answers import MAX_RETRY_SECONDS, RETRY_ATTEMPTS, HeldAnswer, HeldAnswers
from pollwarden.store import Store

pytestmark = pytest.mark.anyio


class DownFor:
    """A store whose `apply_answer` fails `failures` times (the database away), then records."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.recorded: list[str] = []

    async def apply_answer(
        self,
        operation_id: str,
        *,
        owner: str,
        changes: Mapping[str, object],
        at: float,
        payload_extra: Mapping[str, object],
    ) -> tuple[OperationRecord, bool]:
        self.calls += 1
        if self.calls <= self.failures:
            raise StoreError("the database is unreachable")
        self.recorded.append(operation_id)
        return operation_record(operation_id=operation_id), True


async def test_an_answer_held_through_an_outage_longer_than_the_doubling_schedule_is_still_recorded() -> None:
    clock = FakeClock(1000.0)
    held = HeldAnswers()
    held.keep(HeldAnswer("op-1", "owner", {"state": "running"}, 999.0, {}))
    store = DownFor(failures=RETRY_ATTEMPTS + 30)  # the database is back about 15 minutes later
    await held.record_in_background(cast(Store, store), clock, "op-1")
    assert store.recorded == ["op-1"]
    assert "op-1" not in held
    assert clock.now() - 1000.0 > RETRY_ATTEMPTS * MAX_RETRY_SECONDS / 2  # it outlived the old ten minutes
