"""SSE resumption never crosses sessions: one principal's tool results never reach another's stream.

The SDK names a stream by the JSON-RPC request id, so two sessions whose requests share an id (the
2025-11-25 clients count 1, 2, 3, ...) used to write into one stream of one shared store: a replay with
one session's `Last-Event-ID` sent the other session's results. Here two principals (token file) call
with colliding ids over real HTTP on 127.0.0.1, and each replay holds its own session's events only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp_types import JSONRPCMessage, JSONRPCNotification, JSONRPCResponse

from harness import Harness, make_harness, write_table
from pollwarden.access.auth import AuthOptions, TokenFileVerifier, auth_settings
from pollwarden.surface.event_store import SessionEventStores
from pollwarden.surface.http_serve import HttpOptions, transport_security
from pollwarden.surface.server import PollwardenServer, build_server, controller_factory
from tests.integration.test_http_auth import AGENT, add_token
from tests.support.auth_helpers import bearer_client, serving
from tests.support.fake_provider import FakeProvider, pending
from tests.support.ports import free_port

# SQLite only: the subject is SSE resumption (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

LEGACY = "2025-11-25"
COLLIDING_ID = 4242


@dataclass
class Team:
    url: str
    server: PollwardenServer
    alice: str
    bob: str


@asynccontextmanager
async def team_server(
    h: Harness, tmp_path: Path, *, sessions_per_principal: int | None = None
) -> AsyncGenerator[Team]:
    tokens = tmp_path / "tokens"
    alice, bob = add_token(tokens, "alice", AGENT), add_token(tokens, "bob", AGENT)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    write_table(h.tables_dir, h.table)
    factory = controller_factory(h.config(), clock=h.clock, rng=h.rng, environ=h.environ)
    server = build_server(
        factory, auth=auth_settings(AuthOptions(), resource_url=url), token_verifier=TokenFileVerifier(tokens)
    )
    assert isinstance(server, PollwardenServer)
    if sessions_per_principal is not None:
        server.sessions_per_principal = sessions_per_principal
    app = server.streamable_http_app(transport_security=transport_security(HttpOptions(port=port)))
    async with serving(app, port):
        yield Team(url=url, server=server, alice=alice, bob=bob)


class LegacySession:
    """A raw 2025-11-25 session over HTTP with a bearer token, SSE answers kept with their event ids."""

    def __init__(self, http: httpx2.AsyncClient, url: str, token: str) -> None:
        self.http = http
        self.url = url
        self.headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
        }

    async def open(self) -> None:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": LEGACY,
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
        answer = await self.http.post(self.url, json=body, headers=self.headers)
        assert answer.status_code == 200, answer.text
        self.headers = {
            **self.headers,
            "mcp-session-id": answer.headers["mcp-session-id"],
            "mcp-protocol-version": LEGACY,
        }
        await self.http.post(
            self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=self.headers
        )

    async def call(self, request_id: int, tool: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """The SSE events of one tools/call (the priming event first, the answer last)."""
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
        async with self.http.stream("POST", self.url, json=body, headers=self.headers) as answer:
            assert answer.status_code == 200
            return await sse_events(answer)

    @asynccontextmanager
    async def replay(self, last_event_id: str) -> AsyncGenerator[httpx2.Response]:
        headers = {**self.headers, "Accept": "text/event-stream", "last-event-id": last_event_id}
        async with self.http.stream("GET", self.url, headers=headers) as resumed:
            yield resumed

    async def end(self) -> None:
        await self.http.delete(self.url, headers=self.headers)


async def sse_events(
    response: httpx2.Response | AsyncIterator[str], until_id: int | None = None
) -> list[dict[str, Any]]:
    """Every SSE event (id and parsed data) until the stream ends, or until the answer to `until_id`
    (given an iterator of the response's lines, a later call goes on where this one stopped)."""
    lines = response.aiter_lines() if isinstance(response, httpx2.Response) else response
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async for line in lines:
        if line.startswith("id:"):
            current["id"] = line[3:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            current["data"] = json.loads(data) if data else None
        elif line == "" and current:
            events.append(current)
            data = current.get("data")
            current = {}
            if until_id is not None and isinstance(data, dict) and data.get("id") == until_id:
                break
    return events


def mentions(events: list[dict[str, Any]], text: str) -> bool:
    return any(text in json.dumps(e.get("data")) for e in events)


def started(h: Harness, operation_id: str) -> dict[str, Any]:
    return {"provider": h.table["name"], "operation_id": operation_id, "provider_job_id": operation_id}


async def test_a_replay_of_a_sessions_own_stream_never_carries_another_principals_answer_to_the_same_id(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("alice-secret-job", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with team_server(h, tmp_path) as team, httpx2.AsyncClient(timeout=20) as http:
        bob, alice = LegacySession(http, team.url, team.bob), LegacySession(http, team.url, team.alice)
        await bob.open()
        await alice.open()
        bobs = await bob.call(COLLIDING_ID, "list_operations", {})
        priming = bobs[0]["id"]
        await alice.call(2, "start_operation", started(h, "alice-secret-job"))
        alices = await alice.call(COLLIDING_ID, "get_operation", {"operation_id": "alice-secret-job"})
        assert mentions(alices, "alice-secret-job")
        with anyio.fail_after(15):
            async with bob.replay(priming) as resumed:
                assert resumed.status_code == 200
                lines = resumed.aiter_lines()
                replayed = await sse_events(lines, until_id=COLLIDING_ID)
                assert replayed[-1]["data"]["result"] == bobs[-1]["data"]["result"]  # his own answer
                await bob.end()  # ends the live stream: everything the replay had to send is here
                replayed += await sse_events(lines)
    assert not mentions(replayed, "alice-secret-job")


@pytest.mark.parametrize("alices_era", ["legacy", "2026-07-28"])
async def test_a_replay_with_another_sessions_event_id_sends_nothing(
    tmp_path: Path, fake: FakeProvider, alices_era: str
) -> None:
    fake.script("alice-secret-job", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with team_server(h, tmp_path) as team, httpx2.AsyncClient(timeout=20) as http:
        bob = LegacySession(http, team.url, team.bob)
        await bob.open()
        await bob.call(COLLIDING_ID, "list_operations", {})
        if alices_era == "legacy":
            alice = LegacySession(http, team.url, team.alice)
            await alice.open()
            await alice.call(2, "start_operation", started(h, "alice-secret-job"))
            alices = await alice.call(COLLIDING_ID, "get_operation", {"operation_id": "alice-secret-job"})
            event_ids = [e["id"] for e in alices if "id" in e]
        else:
            # The 2026-07-28 era keeps no events at all: nothing of alice's is there to replay.
            async with bearer_client(team.url, team.alice) as client:
                await client.call_tool("start_operation", started(h, "alice-secret-job"))
                await client.call_tool("get_operation", {"operation_id": "alice-secret-job"})
            event_ids = ["1-unknown"]
        for event_id in event_ids:
            with anyio.fail_after(10):
                async with bob.replay(event_id) as resumed:
                    replayed = await sse_events(resumed)  # an unknown id: the stream ends at once
            assert not mentions(replayed, "alice-secret-job")
            assert not any(e.get("data") for e in replayed)


async def test_a_sessions_events_are_dropped_when_it_ends(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake)
    async with team_server(h, tmp_path) as team, httpx2.AsyncClient(timeout=20) as http:
        bob, alice = LegacySession(http, team.url, team.bob), LegacySession(http, team.url, team.alice)
        await bob.open()
        await alice.open()
        await bob.call(COLLIDING_ID, "list_operations", {})
        await alice.call(COLLIDING_ID, "list_operations", {})
        stores = team.server.event_stores
        assert stores is not None
        assert stores.sessions() == 2
        await bob.end()
        assert stores.sessions() == 1
        await alice.end()
        assert stores.sessions() == 0
        assert stores.size == 0


async def test_one_principal_holds_at_most_its_share_of_open_sessions_and_others_still_get_theirs(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    async with (
        team_server(h, tmp_path, sessions_per_principal=2) as team,
        httpx2.AsyncClient(timeout=20) as http,
    ):
        bobs = [LegacySession(http, team.url, team.bob) for _ in range(2)]
        for session in bobs:
            await session.open()
        one_more = LegacySession(http, team.url, team.bob)
        with pytest.raises(AssertionError, match="Too many open sessions"):
            await one_more.open()
        alice = LegacySession(http, team.url, team.alice)
        await alice.open()  # bob's sessions take nothing from alice
        await bobs[0].end()
        await one_more.open()  # an ended session makes room again


# -- the stores themselves -------------------------------------------------------------------------------


def note(n: int, padding: int = 0) -> JSONRPCMessage:
    return JSONRPCNotification(jsonrpc="2.0", method=f"notifications/n{n}", params={"pad": "x" * padding})


async def replayed_ids(stores: SessionEventStores, session: str, last: str) -> list[str] | None:
    sent: list[str] = []

    async def send(event: Any) -> None:
        sent.append(event.event_id)

    return sent if await stores.replay(session, last, send) is not None else None


async def test_two_sessions_with_one_stream_id_each_replay_only_their_own_events() -> None:
    stores = SessionEventStores()
    bob, alice = stores.for_session("bob-session"), stores.for_session("alice-session")
    bobs_priming = await bob.store_event("4242", None)
    bobs = [await bob.store_event("4242", note(1))]
    alices_priming = await alice.store_event("4242", None)
    await alice.store_event("4242", JSONRPCResponse(jsonrpc="2.0", id=4242, result={"secret": "alice"}))
    bobs.append(await bob.store_event("4242", note(2)))
    assert await replayed_ids(stores, "bob-session", bobs_priming) == bobs
    assert await replayed_ids(stores, "bob-session", alices_priming) is None  # alice's id is unknown to bob
    sent: list[str] = []

    async def send(event: Any) -> None:
        sent.append(event.event_id)

    assert await bob.replay_events_after(alices_priming, send) is None
    assert await alice.replay_events_after(alices_priming, send) == "4242"
    assert len(sent) == 1


async def test_the_stores_stay_bounded_by_events_streams_and_bytes() -> None:
    stores = SessionEventStores(max_events=3, max_streams=2, max_session_bytes=2_000, max_bytes=3_000)
    one = stores.for_session("one")
    priming = await one.store_event("s1", None)
    ids = [await one.store_event("s1", note(n)) for n in range(1, 3)]
    assert await replayed_ids(stores, "one", priming) == ids  # the priming event itself is never replayed
    assert await replayed_ids(stores, "one", "1-not-an-id") is None
    # ids cannot be guessed: change the last character (to one it is not: 1 in 64 ids end in "x")
    guessed = ids[0][:-1] + ("y" if ids[0].endswith("x") else "x")
    assert await replayed_ids(stores, "one", guessed) is None
    for n in range(3, 8):
        await one.store_event("s1", note(n))
    assert await replayed_ids(stores, "one", priming) is None  # dropped: each stream keeps 3
    await one.store_event("s2", note(8))
    kept = await one.store_event("s3", note(9))
    assert len(stores._sessions["one"].streams) == 2  # pyright: ignore[reportPrivateUsage]
    # A session over its bytes loses its oldest events first, never the newest.
    for n in range(10, 20):
        await one.store_event("s3", note(n, padding=300))
    assert stores._sessions["one"].size <= 2_000  # pyright: ignore[reportPrivateUsage]
    assert await replayed_ids(stores, "one", kept) is None
    # All sessions together stay under max_bytes; the least recently written go first.
    two = stores.for_session("two")
    for n in range(5):
        await two.store_event("t", note(n, padding=300))
    assert stores.size <= 3_000
    assert stores.size == sum(s.size for s in stores._sessions.values())  # pyright: ignore[reportPrivateUsage]
    stores.drop("one")
    stores.drop("two")
    assert stores.size == 0
