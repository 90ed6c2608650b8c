"""A waiting agent really waits (issue 30, item 2).

With `wait_seconds`, check_status holds the call up to that long even when the
next allowed check is further away: it re-reads the record each round, so a
wake-up (a verified webhook moving the next check to now, in any process on the
database) is seen within half a second and the one request goes out; otherwise
the call answers not_yet when its wait ends. No lease is held while it waits.
All on the harness's fake clock: nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from harness import db_rows, make_harness, track, view
from pollwarden.core.clock import FakeClock
from pollwarden.store import open_store
from tests.support.fake_provider import FakeProvider, pending, succeeded

# SQLite only: the subject is the waiting call's loop (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]
# Every check after the first is a minute away: a poll hint the fake provider sends with each answer.
RUNNING_FOR_A_MINUTE = pending("running", poll_after_seconds=60)


class WakingClock(FakeClock):
    """A fake clock that runs `action` once, the first time a sleep carries it to `at` or past it."""

    def __init__(self) -> None:
        super().__init__()
        self.at = float("inf")
        self.action: Callable[[], Awaitable[None]] | None = None
        self.fired_at: float | None = None

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds)
        if self.action is not None and self.fired_at is None and self.t >= self.at:
            self.fired_at = self.t
            await self.action()


async def polled_once(client: Any, job: str) -> dict[str, Any]:
    """Track `job` and make its first check: the provider asks to be polled again in 60 s."""
    await track(client, job)
    first = view(await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 30}))
    assert (first["outcome"], first["delay_source"]) == ("polled", "provider_poll_hint")
    assert first["retry_after_seconds"] == pytest.approx(60)
    return first


@pytest.mark.parametrize("era", ERAS)
async def test_a_wait_shorter_than_the_next_check_holds_the_call_for_the_whole_wait_then_answers_not_yet(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("hold", [RUNNING_FOR_A_MINUTE])
    h = make_harness(tmp_path, fake)
    progress: list[tuple[float, float | None, tuple[Any, ...]]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        [row] = db_rows(h.db_path, "SELECT lease_owner, lease_expires_at FROM operations")
        progress.append((done, total, (row["lease_owner"], row["lease_expires_at"])))

    async with h.client(**era) as client:
        await polled_once(client, "hold")
        asked = h.clock.now()
        answer = view(
            await client.call_tool(
                "check_status", {"operation_id": "op-hold", "wait_seconds": 25}, progress_callback=on_progress
            )
        )
    assert answer["outcome"] == "not_yet"
    assert h.clock.now() == pytest.approx(asked + 25)  # it waited the whole 25 s, not 0.01 s
    assert answer["retry_after_seconds"] == pytest.approx(35)
    assert len(fake.status_requests("hold")) == 1  # nothing sent while waiting
    assert progress, "a waiting call reports progress"
    assert all(total == 25 for _, total, _ in progress)
    assert all(lease == (None, None) for *_, lease in progress)  # no lease held while waiting


@pytest.mark.parametrize("era", ERAS)
async def test_a_wake_up_during_the_wait_is_seen_within_half_a_second_and_the_check_is_made(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("wake", [RUNNING_FOR_A_MINUTE, succeeded()])
    clock = WakingClock()
    h = make_harness(tmp_path, fake, clock=clock)
    async with h.client(**era) as client:
        await polled_once(client, "wake")
        asked = clock.now()

        async def webhook_arrives() -> None:
            # What the webhook receiver does for a verified event, from another connection to the database.
            async with open_store(h.database) as other:
                await other.wake(
                    provider="acme",
                    job_id="wake",
                    event_id="evt_1",
                    event_type="job.completed",
                    now=clock.now(),
                    remember_seconds=600,
                )

        clock.at, clock.action = asked + 10, webhook_arrives
        answer = view(await client.call_tool("check_status", {"operation_id": "op-wake", "wait_seconds": 25}))
    assert clock.fired_at is not None
    assert (answer["outcome"], answer["status"]) == ("polled", "succeeded")
    sent_at = answer["request_sent_at"]
    assert sent_at is not None
    assert clock.fired_at <= clock.now() <= clock.fired_at + 0.5  # seen within half a second of the wake
    assert len(fake.status_requests("wake")) == 2


async def test_without_a_wake_up_a_wait_reaching_the_allowed_time_sends_then(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("due", [pending("running", poll_after_seconds=20), succeeded()])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "due")
        view(await client.call_tool("check_status", {"operation_id": "op-due", "wait_seconds": 30}))
        asked = h.clock.now()
        answer = view(await client.call_tool("check_status", {"operation_id": "op-due", "wait_seconds": 30}))
    assert (answer["outcome"], answer["status"]) == ("polled", "succeeded")
    assert h.clock.now() == pytest.approx(asked + 20)
