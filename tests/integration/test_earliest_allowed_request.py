"""The provider's earliest allowed time holds on every path (issue 30, items 1 and 11), end to end.

Found by trying it: a 503 with `Retry-After: 3` while the local backoff was 8–16 s, then a signed
webhook 1 s later, and the next status request went out 1.1 s after the 503. The wake decided from
the stored delay reason, not from the provider's instruction. And after a status request timed out,
the next went out after the local backoff alone while the provider was still working on the first.
Real fake provider, real signed webhooks, the injected clock, both engines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import check, db_rows, full_delays, make_harness, track, view
from pollwarden.provider_io.provider_http import HttpLimits
from tests.integration.test_approvals import Person
from tests.integration.test_webhooks import STANDARD, post, receiving, standard_post
from tests.support.fake_provider import FakeProvider, http, pending, succeeded

pytestmark = pytest.mark.anyio

# A local backoff of 8–16 s after the first answer (base 8, attempt 1).
SLOW_BACKOFF = {**STANDARD, "schedule": {"base_delay_seconds": 8, "max_delay_seconds": 120}}


def sent_times(h: object, operation_id: str) -> tuple[float, float]:
    [row] = db_rows(
        h.db_path,  # type: ignore[attr-defined]
        "SELECT request_sent_at, not_before_at FROM operations WHERE operation_id = ?",
        operation_id,
    )
    return float(row["request_sent_at"]), float(row["not_before_at"])


async def test_a_webhook_after_a_503_with_a_short_retry_after_never_brings_the_next_request_before_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("ra3", [http(503, headers={"Retry-After": "3"}), succeeded()])
    h = make_harness(tmp_path, fake, table=SLOW_BACKOFF)
    async with h.client() as client, receiving(h) as (hooks, _):
        await track(client, "ra3")
        first = await check(client, "ra3", wait=20)
        answered = h.clock.now()
        # The local backoff decides the schedule (8–16 s); the provider's 3 s is kept beside it.
        assert (first["outcome"], first["delay_source"]) == ("polled", "local_backoff")
        assert first["retry_after_seconds"] >= 8
        h.clock.advance(1)
        answer = await post(hooks, *standard_post("ra3", event_id="evt_ra3", at=h.clock.now()))
        assert answer.json()["outcome"] == "woken"  # brought forward, to the provider's minimum
        woken = await check(client, "ra3")
        assert woken["outcome"] == "not_yet"
        assert woken["retry_after_seconds"] == pytest.approx(2.0)
        assert len(fake.status_requests("ra3")) == 1
        done = await check(client, "ra3", wait=5)
        assert (done["outcome"], done["status"]) == ("polled", "succeeded")
    sent, not_before = sent_times(h, "op-ra3")
    assert not_before == pytest.approx(answered + 3)
    assert sent >= answered + 3
    assert len(fake.status_requests("ra3")) == 2


async def test_a_status_request_that_timed_out_holds_the_next_one_back_by_its_length_even_for_a_webhook(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # The provider takes 0.5 s; the server gives up after 0.2 s without a byte, the provider still at work.
    fake.script("slow", [pending().replace(delay_seconds=0.5), succeeded()])
    h = make_harness(
        tmp_path, fake, table=STANDARD, rng=full_delays(), http_limits=HttpLimits(read_timeout_seconds=0.2)
    )
    async with h.client() as client, receiving(h) as (hooks, _):
        await track(client, "slow")
        timed_out = await check(client, "slow", wait=20)
        answered = h.clock.now()
        assert (timed_out["outcome"], timed_out["transport_failures_used"]) == ("polled", 1)
        # The local backoff after the first answer (10 s at full jitter), on top of the timeout's 0.2 s.
        assert timed_out["retry_after_seconds"] == pytest.approx(10.2)
        answer = await post(hooks, *standard_post("slow", event_id="evt_slow", at=h.clock.now()))
        assert answer.json()["outcome"] == "woken"
        early = await check(client, "slow")
        assert early["outcome"] == "not_yet"
        assert early["retry_after_seconds"] == pytest.approx(0.2)
        done = await check(client, "slow", wait=1)
        assert done["status"] == "succeeded"
    sent, not_before = sent_times(h, "op-slow")
    assert not_before == pytest.approx(answered + 0.2)
    assert sent >= answered + 0.2


async def test_an_approved_extension_after_a_retry_after_waits_for_it_on_the_real_server(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("ext", [http(503, headers={"Retry-After": "90"}), succeeded()])
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=Person("accept", {"decision": "approve"})) as client:
        await track(client, "ext", max_status_requests=1)
        stopped = await check(client, "ext", wait=20)
        answered = h.clock.now()
        assert stopped["stop_reason"] == "request_budget_exhausted"
        granted = view(
            await client.call_tool(
                "request_extension",
                {
                    "operation_id": "op-ext",
                    "extra_seconds": 600,
                    "extra_status_requests": 2,
                    "reason": "more",
                },
            )
        )
        assert granted["decision"] == "approved"
        assert granted["operation"]["delay_source"] == "provider_retry_after"
        early = await check(client, "ext")
        assert early["outcome"] == "not_yet"
        h.clock.advance(90)
        done = await check(client, "ext")
        assert done["status"] == "succeeded"
    sent, _ = sent_times(h, "op-ext")
    assert sent >= answered + 90
