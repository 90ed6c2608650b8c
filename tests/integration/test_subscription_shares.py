"""Subscriptions per principal (issue 31, item 5): unknown operations refused, shares capped, ended sessions forgotten."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from mcp.client import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from harness import Harness, make_harness, track
from pollwarden.surface.server import build_server, controller_factory
from pollwarden.surface.watch import Subscriptions
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is subscriptions (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


def uri(job: str) -> str:
    return f"pollwarden://operations/op-{job}"


def served_with(h: Harness, subscriptions: Subscriptions) -> Any:
    from harness import write_table

    write_table(h.tables_dir, h.table)
    return build_server(
        controller_factory(h.config(), clock=h.clock, rng=h.rng, environ=h.environ),
        subscriptions=subscriptions,
    )


async def listen_once(client: Client, watched: str) -> None:
    async with client.listen(resource_subscriptions=[watched]) as stream:
        async for _ in stream:
            break


async def test_subscribing_to_an_unknown_operation_is_refused_in_both_eras(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    subscriptions = Subscriptions()
    server = served_with(h, subscriptions)
    async with Client(server, mode="legacy") as legacy:
        with pytest.raises(MCPError) as caught:
            await legacy.subscribe_resource(uri("nobody"))  # pyright: ignore[reportDeprecated]
    assert caught.value.error.code == INVALID_PARAMS
    assert "no operation 'op-nobody'" in caught.value.error.message
    async with Client(server) as modern:
        with pytest.raises(MCPError, match="no operation 'op-nobody'"):
            await listen_once(modern, uri("nobody"))
    assert subscriptions.uris() == set()


async def test_a_session_and_a_principal_hold_at_most_their_share_and_an_ended_session_frees_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    for job in ("a", "b", "c", "d"):
        fake.script(job, [pending("running")])
    h = make_harness(tmp_path, fake)
    subscriptions = Subscriptions(max_per_session=2, max_per_principal=3)
    server = served_with(h, subscriptions)
    async with Client(server, mode="legacy") as first:
        for job in ("a", "b", "c", "d"):
            await track(first, job)
        await first.subscribe_resource(uri("a"))  # pyright: ignore[reportDeprecated]
        await first.subscribe_resource(uri("b"))  # pyright: ignore[reportDeprecated]
        with pytest.raises(MCPError, match="one session may watch at most 2"):
            await first.subscribe_resource(uri("c"))  # pyright: ignore[reportDeprecated]
        async with Client(server, mode="legacy") as second:
            await second.subscribe_resource(uri("c"))  # pyright: ignore[reportDeprecated]
            with pytest.raises(MCPError, match="one principal may watch at most 3"):
                await second.subscribe_resource(uri("d"))  # pyright: ignore[reportDeprecated]
    del first, second
    gc.collect()
    async with Client(server, mode="legacy") as third:  # both sessions ended without unsubscribing
        await third.subscribe_resource(uri("d"))  # pyright: ignore[reportDeprecated]
        assert subscriptions.uris() == {uri("d")}
        assert subscriptions.held == {"local": 1}
