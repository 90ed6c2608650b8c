"""Fair shares between principals: active operations, starts per minute, and each provider's [fleet] pace.

The fairness rule: while a provider's shared pace is used up, one principal holds at most
`fleet_slots` booked slots of it; its other due checks wait for the earliest of them without
taking anything from the pace. So another principal's check books the next free slot behind at
most that many of the first's: with 1, two busy principals alternate, whatever their numbers of
operations. Measured here on the controller's fake clock, in the order the fake provider saw
the requests.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from harness import make_harness, view, write_table
from pollwarden.access.auth import TokenFileVerifier
from pollwarden.access.ownership import stored_id
from pollwarden.access.principals import Principal, PrincipalLimits
from pollwarden.surface.server import controller_factory
from tests.integration.test_http_auth import AGENT, add_token, served
from tests.integration.test_owners_and_scopes import answer_text, start_args
from tests.support.auth_helpers import bearer_client
from tests.support.fake_provider import FakeProvider, pending

pytestmark = pytest.mark.anyio

FLEET: dict[str, Any] = {
    "schedule": {"base_delay_seconds": 0.05, "max_delay_seconds": 0.1},
    "fleet": {"max_requests_per_second": 1, "burst": 1},
}
ALICE_OPS = 8
BOB_OPS = 2
ROUNDS = 40


async def _share_of_requests(tmp_path: Path, fake: FakeProvider, fleet_slots: int | None) -> list[str]:
    """Drive alice's 8 and bob's 2 always-due operations for 40 s of fake time; who each request was for."""
    jobs = {
        f"{who}-{tag}-{i}": who
        for who, n in (("alice", ALICE_OPS), ("bob", BOB_OPS))
        for i in range(n)
        for tag in [str(fleet_slots)]
    }
    for job in jobs:
        fake.script(job, [pending("running")])
    h = make_harness(tmp_path, fake, table=FLEET)
    write_table(h.tables_dir, h.table)
    config = replace(h.config(), limits=PrincipalLimits(fleet_slots=fleet_slots))
    factory = controller_factory(config, clock=h.clock, rng=h.rng, environ=h.environ)
    principals = {name: Principal(name, authenticated=True) for name in ("alice", "bob")}
    async with factory() as controller:
        stored: list[str] = []
        for job, who in jobs.items():
            principal = principals[who]
            await controller.start_operation(
                provider="acme",
                operation_id=job,
                provider_job_id=job,
                max_status_requests=200,
                owner=who,
                stored_id=partial(stored_id, principal),
            )
            stored.append(stored_id(principal, job))
        h.clock.advance(1.0)
        for _ in range(ROUNDS):
            for pk in stored:  # alice's operations always ask first
                await controller.check_status(pk)
            h.clock.advance(1.0)
    sent = [e for e in fake.log() if e["route"] == "status" and e["job_id"] in jobs]
    return [jobs[str(e["job_id"])] for e in sorted(sent, key=lambda e: e["seq"])]


async def test_with_one_slot_per_principal_two_busy_principals_alternate_on_a_shared_pace(
    tmp_path: Path, fake: FakeProvider
) -> None:
    order = await _share_of_requests(tmp_path / "fair", fake, fleet_slots=1)
    assert ROUNDS - 2 <= len(order) <= ROUNDS + 1  # the pace (1 a second) holds either way
    # A slot whose time has come still counts as held until it is used (issue 29: never more than
    # the share). When one of a principal's requests leaves, its next slot goes to its operation
    # waiting longest, and a principal served more recently leaves room the pace has now to the
    # other: after alice's first two, they alternate ("aab" before, 16 of 40 for bob; now 19).
    assert order.count("bob") >= len(order) // 2 - 1
    pattern = "".join(w[0] for w in order)
    assert "aa" not in pattern[2:], pattern


async def test_without_the_limit_the_principal_with_more_operations_takes_most_of_the_pace(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # The control: the same drive without a share gives bob only his fraction of the operations.
    order = await _share_of_requests(tmp_path / "unfair", fake, fleet_slots=None)
    assert order.count("bob") <= len(order) * 0.3


async def test_active_operations_and_starts_per_minute_are_bounded_per_principal(
    tmp_path: Path, fake: FakeProvider
) -> None:
    path = tmp_path / "tokens"
    tokens = {name: add_token(path, name, AGENT) for name in ("alice", "bob")}
    for i in range(6):
        fake.script(f"limit-{i}", [pending("running")])
    h = make_harness(tmp_path, fake)
    limits = PrincipalLimits(max_active=2, max_starts_per_minute=3)
    async with served(h, lambda _: TokenFileVerifier(path), limits=limits) as s:
        async with bearer_client(s.url, tokens["alice"]) as alice:
            view(await alice.call_tool("start_operation", start_args("a0", "limit-0")))
            view(await alice.call_tool("start_operation", start_args("a1", "limit-1")))
            third = await alice.call_tool("start_operation", start_args("a2", "limit-2"))
            assert third.is_error
            assert "already has 2 active operations" in answer_text(third)
            # The same id again is answered with its record, limit or not.
            view(await alice.call_tool("start_operation", start_args("a0", "limit-0")))
        async with bearer_client(s.url, tokens["bob"]) as bob:
            # alice's share is hers: bob starts his own, up to his own limits.
            view(await bob.call_tool("start_operation", start_args("b0", "limit-3")))
            view(await bob.call_tool("start_operation", start_args("b1", "limit-4")))


async def test_starts_per_minute_are_counted_on_the_controllers_clock(
    tmp_path: Path, fake: FakeProvider
) -> None:
    path = tmp_path / "tokens"
    token = add_token(path, "carol", AGENT)
    for i in range(4):
        fake.script(f"rate-{i}", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with (
        served(h, lambda _: TokenFileVerifier(path), limits=PrincipalLimits(max_starts_per_minute=2)) as s,
        bearer_client(s.url, token) as carol,
    ):
        view(await carol.call_tool("start_operation", start_args("c0", "rate-0")))
        view(await carol.call_tool("start_operation", start_args("c1", "rate-1")))
        refused = await carol.call_tool("start_operation", start_args("c2", "rate-2"))
        assert refused.is_error
        assert "started 2 operations in the last minute" in answer_text(refused)
        h.clock.advance(61)
        view(await carol.call_tool("start_operation", start_args("c2", "rate-2")))


async def _requests_per_operation(tmp_path: Path, fake: FakeProvider, *, late_every: int) -> dict[str, int]:
    """One principal's 4 always-due operations on one slot: three agents ask every half second, the
    fourth only every `late_every`-th time (an agent whose sleep has jitter); requests per operation."""
    jobs = [f"carol-{i}" for i in range(4)]
    for job in jobs:
        fake.script(job, [pending("running")])
    h = make_harness(tmp_path, fake, table=FLEET)
    write_table(h.tables_dir, h.table)
    config = replace(h.config(), limits=PrincipalLimits(fleet_slots=1))
    factory = controller_factory(config, clock=h.clock, rng=h.rng, environ=h.environ)
    carol = Principal("carol", authenticated=True)
    async with factory() as controller:
        stored: list[str] = []
        for job in jobs:
            await controller.start_operation(
                provider="acme",
                operation_id=job,
                provider_job_id=job,
                max_status_requests=200,
                owner="carol",
                stored_id=partial(stored_id, carol),
            )
            stored.append(stored_id(carol, job))
        h.clock.advance(1.0)
        for round_ in range(2 * ROUNDS):
            for i, pk in enumerate(stored):
                if i < 3 or round_ % late_every == late_every - 1:
                    await controller.check_status(pk)
            h.clock.advance(0.5)
    sent = [e["job_id"] for e in fake.log() if e["route"] == "status" and e["job_id"] in jobs]
    return {job: sent.count(job) for job in jobs}


async def test_a_principals_one_slot_goes_to_its_operation_waiting_longest_so_a_late_agent_gets_its_turn(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # Issue 29: the slot went to whichever agent asked first once it was free, and the agent that
    # always came a little later never had it. Oldest-waiting first: each gets about a quarter.
    per_operation = await _requests_per_operation(tmp_path / "late", fake, late_every=3)
    total = sum(per_operation.values())
    # The pace (1 a second, burst 1) is never exceeded; its room is kept for the late agent's slot
    # until it comes, so a little of it goes unused (measured 35 of 40).
    assert ROUNDS * 0.85 <= total <= ROUNDS + 1
    assert min(per_operation.values()) >= total // 5, per_operation  # measured 9, 9, 9, 8
