"""A whole check_status call fits inside a client's default request timeout.

The TypeScript SDK gives up on a request after 60 s, and progress notifications
do not extend that by default. A call's wait, one provider request (capped by
its total timeout) and a margin for the database work stay within 55 s: a
call never starts a request that could not finish in time, it answers not_yet.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import check, make_harness, track
from pollwarden.config import MAX_WAIT_SECONDS
from pollwarden.provider_http import HttpLimits
from pollwarden.schedule import (
    CALL_BUDGET_SECONDS,
    CALL_MARGIN_SECONDS,
    CLIENT_REQUEST_TIMEOUT_SECONDS,
    wait_bound,
)
from pollwarden.timefmt import parse_iso
from tests.support.fake_provider import FakeProvider, pending

pytestmark = pytest.mark.anyio

DEFAULT_REQUEST_TIMEOUT = HttpLimits().total_timeout_seconds


def test_the_call_budget_leaves_a_margin_under_the_clients_default_timeout() -> None:
    assert CALL_BUDGET_SECONDS + CALL_MARGIN_SECONDS <= CLIENT_REQUEST_TIMEOUT_SECONDS
    # With the default 20 s request cap a call waits at most 30 s, even when asked for 50.
    assert (
        wait_bound(MAX_WAIT_SECONDS, max_wait=MAX_WAIT_SECONDS, request_timeout=DEFAULT_REQUEST_TIMEOUT) == 30
    )


@given(
    requested=st.floats(min_value=0, max_value=MAX_WAIT_SECONDS),
    request_timeout=st.floats(min_value=0, max_value=120),
)
def test_wait_plus_request_timeout_plus_margin_never_exceeds_the_call_budget(
    requested: float, request_timeout: float
) -> None:
    bound = wait_bound(requested, max_wait=MAX_WAIT_SECONDS, request_timeout=request_timeout)
    assert 0 <= bound <= requested
    if request_timeout + CALL_MARGIN_SECONDS <= CALL_BUDGET_SECONDS:
        assert bound + request_timeout + CALL_MARGIN_SECONDS <= CALL_BUDGET_SECONDS + 1e-9
        # What fits is never cut: the bound only shortens a wait that would not fit.
        if requested + request_timeout + CALL_MARGIN_SECONDS <= CALL_BUDGET_SECONDS:
            assert bound == requested
    else:
        assert bound == 0  # no room to wait at all: the call sends at once or answers not_yet


async def test_a_check_whose_allowed_time_is_past_what_the_call_may_wait_answers_not_yet_at_once(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("far", [pending("running")])
    h = make_harness(tmp_path, fake, table={"schedule": {"base_delay_seconds": 40, "max_delay_seconds": 120}})
    async with h.client() as client:
        await track(client, "far")
        asked = h.clock.now()
        answer = await check(client, "far", wait=50)
        # Waiting 40 s and then sending a request of up to 20 s would run past the client's timeout.
        assert answer["outcome"] == "not_yet"
        assert h.clock.now() == asked  # it did not wait in vain
        assert answer["retry_after_seconds"] == pytest.approx(40)
        assert parse_iso(answer["next_check_at"]) == pytest.approx(asked + 40)
        assert fake.status_requests("far") == []
        # Coming back inside the bound, the call waits for the allowed time and sends.
        h.clock.advance(15)
        polled = await check(client, "far", wait=50)
        assert polled["outcome"] == "polled"
        assert h.clock.now() == pytest.approx(asked + 40)
    assert len(fake.status_requests("far")) == 1


async def test_a_shorter_request_cap_leaves_more_of_the_call_for_waiting(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("near", [pending("running")])
    limits = HttpLimits(total_timeout_seconds=5)  # 40 s of waiting + 5 s + the margin fits in 55 s
    h = make_harness(
        tmp_path,
        fake,
        table={"schedule": {"base_delay_seconds": 40, "max_delay_seconds": 120}},
        http_limits=limits,
    )
    async with h.client() as client:
        await track(client, "near")
        polled = await check(client, "near", wait=50)
    assert polled["outcome"] == "polled"
    assert len(fake.status_requests("near")) == 1
