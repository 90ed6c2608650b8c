"""Jitter through the whole server, with real (seeded) draws: spread out, floored, and exactly the draws made.

A server that never jitters (or always waits the full raw delay) fails here:
the first checks of a batch of operations and the delays of one operation's
polls must be spread inside [0.5·raw, raw] and equal the seeded sequence.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness import HARNESS_SEED, Harness, make_harness, view
from pollwarden.core.timefmt import parse_iso
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is the jitter draws (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

SEED = 20250418
BASE = 5.0  # the harness table's base_delay_seconds (max 120)


async def first_check_delays(h: Harness, prefix: str, count: int) -> list[float]:
    """Start `count` operations at once; how long after the start each one's first check is allowed."""
    t0 = h.clock.now()
    async with h.client() as client:
        return [
            parse_iso(
                view(
                    await client.call_tool(
                        "start_operation",
                        {
                            "provider": "acme",
                            "operation_id": f"op-{prefix}-{i}",
                            "provider_job_id": f"{prefix}-{i}",
                        },
                    )
                )["next_check_at"]
            )
            - t0
            for i in range(count)
        ]


async def test_first_checks_of_many_operations_are_spread_by_the_seeded_draws(
    tmp_path: Path, fake: FakeProvider
) -> None:
    firsts = await first_check_delays(make_harness(tmp_path, fake, rng=random.Random(SEED)), "spread", 20)
    replay = random.Random(SEED)
    expected = [BASE * (0.5 + 0.5 * replay.random()) for _ in range(20)]
    assert firsts == pytest.approx(expected, abs=0.001)  # the view's times are in milliseconds
    assert all(BASE / 2 <= delay <= BASE for delay in firsts)
    assert max(firsts) - min(firsts) > BASE / 4  # spread out, not bunched at one value
    assert len({round(delay, 3) for delay in firsts}) >= 15  # not one repeated value
    assert sum(delay < BASE * 0.75 for delay in firsts) >= 3  # draws in the lower half too


async def test_every_harness_server_jitters_unless_a_test_chooses_its_draws(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # No random source given: the harness's seeded one.
    firsts = await first_check_delays(make_harness(tmp_path, fake), "default", 8)
    replay = random.Random(HARNESS_SEED)
    assert firsts == pytest.approx([BASE * (0.5 + 0.5 * replay.random()) for _ in range(8)], abs=0.001)
    assert len({round(delay, 3) for delay in firsts}) == 8  # never one value at its maximum


async def test_the_delays_between_one_operations_polls_are_the_seeded_jittered_backoff(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("walk", [pending("running")])
    h = make_harness(tmp_path, fake, rng=random.Random(SEED))
    polled_at: list[float] = []
    async with h.client() as client:
        args = {"provider": "acme", "operation_id": "op-walk", "provider_job_id": "walk"}
        t0 = h.clock.now()
        view(await client.call_tool("start_operation", args))
        for _ in range(6):
            next_at = parse_iso(
                view(await client.call_tool("get_operation", {"operation_id": "op-walk"}))["next_check_at"]
            )
            h.clock.t = max(h.clock.now(), next_at - 1)
            v = view(await client.call_tool("check_status", {"operation_id": "op-walk", "wait_seconds": 30}))
            assert v["outcome"] == "polled"
            polled_at.append(h.clock.now())
    delays = [b - a for a, b in zip([t0, *polled_at], polled_at, strict=False)]
    replay = random.Random(SEED)
    raws = [min(120.0, BASE * 2**attempt) for attempt in range(6)]
    expected = [raw * (0.5 + 0.5 * replay.random()) for raw in raws]
    assert delays == pytest.approx(expected, abs=0.002)
    for delay, raw in zip(delays, raws, strict=True):
        assert raw / 2 <= delay <= raw
    assert any(
        delay < raw * 0.9 for delay, raw in zip(delays, raws, strict=True)
    )  # not the maximum each time
