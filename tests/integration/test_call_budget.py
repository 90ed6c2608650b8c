"""A whole check_status call fits inside a client's default request timeout.

The TypeScript SDK gives up on a request after 60 s, and progress notifications
do not extend that by default. A call's wait, one provider request (capped by
its total timeout) and a margin for the database work stay within 55 s: a
call never starts a request that could not finish in time, it answers not_yet.

The pure checks are tests/unit/test_call_budget.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import check, full_delays, make_harness, track
from pollwarden.core.timefmt import parse_iso
from pollwarden.provider_io.provider_http import HttpLimits
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is a call's time budget (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


async def test_a_check_whose_allowed_time_is_past_what_the_call_may_wait_waits_then_answers_not_yet(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("far", [pending("running")])
    schedule = {"schedule": {"base_delay_seconds": 40, "max_delay_seconds": 120}}
    h = make_harness(tmp_path, fake, table=schedule, rng=full_delays())  # the first check 40 s away
    async with h.client() as client:
        await track(client, "far")
        asked = h.clock.now()
        answer = await check(client, "far", wait=30)
        # Waiting 40 s and then sending a request of up to 20 s would run past the client's timeout: the call
        # waits its 30 s (a wake-up could still bring the check forward), sends nothing, answers not_yet.
        assert answer["outcome"] == "not_yet"
        assert h.clock.now() == pytest.approx(asked + 30)
        assert answer["retry_after_seconds"] == pytest.approx(10)
        assert parse_iso(answer["next_check_at"]) == pytest.approx(asked + 40)
        assert fake.status_requests("far") == []
        # Coming back, the call waits the rest and sends.
        polled = await check(client, "far", wait=30)
        assert polled["outcome"] == "polled"
        assert h.clock.now() == pytest.approx(asked + 40)
    assert len(fake.status_requests("far")) == 1


async def test_a_longer_request_cap_leaves_less_of_the_call_for_waiting(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("near", [pending("running")])
    limits = HttpLimits(total_timeout_seconds=40)  # 10 s of waiting + 40 s + the 5 s margin fill the 55 s
    h = make_harness(
        tmp_path,
        fake,
        table={"schedule": {"base_delay_seconds": 40, "max_delay_seconds": 120}},
        http_limits=limits,
        rng=full_delays(),
    )
    async with h.client() as client:
        await track(client, "near")
        asked = h.clock.now()
        early = await check(client, "near", wait=30)
        assert early["outcome"] == "not_yet"
        assert h.clock.now() == pytest.approx(asked + 10)
        h.clock.advance(25)
        polled = await check(client, "near", wait=30)
    assert polled["outcome"] == "polled"
    assert len(fake.status_requests("near")) == 1
