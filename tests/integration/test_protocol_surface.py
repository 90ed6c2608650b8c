"""The protocol surface is true: what is advertised is served, in both eras and over real transports.

- No `prompts` capability (there are none), and `prompts/*` is "method not found", never code 0.
- A client subscribed to `pollwarden://operations/{id}` is told when the operation's status, state
  or stop reason changes, whichever process sharing the database changed it.
- Streamable HTTP is resumable: a `check_status` whose SSE stream drops mid-wait is resumed with
  `Last-Event-ID` and still delivers its answer.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    ResourceUpdatedNotification,
)

from harness import Harness, make_harness, track, view
from pollwarden.surface.protocol import surface_middleware
from pollwarden.surface.watch import Subscriptions, Watched, changed, parse_uri, watch_key
from tests.integration.test_restart_and_transports import (
    FAST,
    child_env,
    child_process,
    free_port,
    serve_args,
    wait_until_listening,
)
from tests.support.fake_provider import FakeProvider, pending, succeeded

# SQLite only: the subject is the MCP protocol surface (tests/conftest.py).
pytestmark = [
    pytest.mark.one_engine,
    pytest.mark.anyio,
    # resources/subscribe is the 2025-11-25 way; the SDK warns that 2026-07-28 replaced it.
    pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed:UserWarning"),
]

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]
NOTIFIED_WITHIN = 10.0  # seconds: the watcher looks every 0.5 s


# -- what is advertised ------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
async def test_no_prompts_are_advertised_and_asking_for_one_is_method_not_found(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client(**era) as client:
        capabilities = client.server_capabilities
        assert capabilities.prompts is None
        assert capabilities.resources is not None
        assert capabilities.resources.subscribe is True  # and it is delivered: see below
        for ask in (lambda: client.list_prompts(), lambda: client.get_prompt("anything")):
            with pytest.raises(MCPError) as caught:
                await ask()
            assert caught.value.error.code == METHOD_NOT_FOUND  # never 0


async def test_an_unexpected_failure_in_any_handler_is_an_internal_error_not_code_0() -> None:
    async def crashing(ctx: Any) -> Any:
        raise RuntimeError("a defect")

    ctx: Any = ServerRequestContext(
        session=None,  # type: ignore[arg-type]
        lifespan_context=None,
        protocol_version="2025-11-25",
        method="resources/read",
        request_id=7,
    )
    with pytest.raises(MCPError) as caught:
        await surface_middleware(ctx, crashing)
    assert caught.value.error.code == INTERNAL_ERROR
    assert "a defect" not in caught.value.error.message


# -- resource subscriptions: the pure parts --------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """The fields of an operation record the watcher reads."""

    status: str = "waiting"
    state: str | None = "queued"
    stop_reason: str | None = None
    version: int = 1


def record(**changes: Any) -> Row:
    return Row(**changes)


def test_a_resource_uri_names_an_operation_or_its_audit_story() -> None:
    assert parse_uri("pollwarden://operations/op-1") == Watched("op-1", audit=False)
    assert parse_uri("pollwarden://operations/op%201/audit") == Watched("op 1", audit=True)
    assert parse_uri("pollwarden://operations/") is None
    assert parse_uri("file:///etc/passwd") is None


def test_the_operation_resource_changes_with_status_state_or_stop_reason_only() -> None:
    watched = Watched("op-1", audit=False)
    before = watch_key(watched, record())
    assert watch_key(watched, record(version=9)) == before  # a refused early call is not a change
    assert watch_key(watched, record(state="running")) != before
    assert watch_key(watched, record(status="escalated", stop_reason="deadline_exceeded")) != before
    assert watch_key(watched, None) != before
    audit = Watched("op-1", audit=True)
    assert watch_key(audit, record(version=2)) != watch_key(audit, record(version=1))


def test_only_a_uri_seen_before_can_have_changed() -> None:
    assert changed({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == ["b"]


class Records:
    """A reader over records kept in a dict."""

    def __init__(self) -> None:
        self.by_id: dict[str, Row] = {}

    async def get(self, operation_id: str) -> Row | None:
        return self.by_id.get(operation_id)


async def test_the_watcher_tells_each_subscriber_once_per_change_and_drops_a_gone_session() -> None:
    reader = Records()
    reader.by_id["op-1"] = record()
    subs = Subscriptions(max_uris=2)
    uri = "pollwarden://operations/op-1"
    published: list[str] = []
    alive: list[str] = []

    async def publish(u: str) -> None:
        published.append(u)

    async def live_session(u: str) -> bool:
        alive.append(u)
        return True

    async def gone_session(u: str) -> bool:
        return False

    subs.listen([uri])
    subs.subscribe(uri, "live", live_session)
    subs.subscribe(uri, "gone", gone_session)
    await subs.baseline(reader, [uri])
    assert await subs.tick(reader, publish) == []
    reader.by_id["op-1"] = record(state="running")
    assert await subs.tick(reader, publish) == [uri]
    assert await subs.tick(reader, publish) == []  # told once, not on every tick
    assert (published, alive) == ([uri], [uri])
    assert set(subs.senders[uri]) == {"live"}
    assert not subs.room_for(["pollwarden://operations/a", "pollwarden://operations/b"])
    subs.unlisten([uri])
    subs.unsubscribe(uri, "live")
    assert subs.uris() == set()
    assert subs.keys == {}


# -- resource subscriptions through real clients ------------------------------------------------------


@asynccontextmanager
async def subscribed(client: Client, uri: str, era: dict[str, Any], inbox: Inbox) -> AsyncIterator[None]:
    """Subscribe `client` to `uri` in its era's way, for the duration of the block."""
    if era:
        await client.subscribe_resource(uri)  # pyright: ignore[reportDeprecated]
        yield
        await client.unsubscribe_resource(uri)  # pyright: ignore[reportDeprecated]
        return
    async with client.listen(resource_subscriptions=[uri]) as subscription, anyio.create_task_group() as tg:

        async def forward() -> None:
            async for event in subscription:
                inbox.put(getattr(event, "uri", ""))

        tg.start_soon(forward)
        yield
        tg.cancel_scope.cancel()


class Inbox:
    """The resource URIs a client was told changed, awaitable."""

    def __init__(self) -> None:
        self.uris: list[str] = []
        self._changed = anyio.Event()

    def put(self, uri: str) -> None:
        self.uris.append(uri)
        self._changed.set()

    async def handler(self, message: object) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            self.put(str(message.params.uri))

    async def wait_for(self, uri: str, times: int = 1) -> None:
        """Until `uri` was told `times` times (bounded)."""
        with anyio.fail_after(NOTIFIED_WITHIN):
            while True:
                changed = self._changed = anyio.Event()
                if self.uris.count(uri) >= times:
                    return
                await changed.wait()


@pytest.mark.both_engines
@pytest.mark.parametrize("era", ERAS)
async def test_a_subscribed_client_is_told_when_another_server_on_the_database_changes_the_operation(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("sub", [pending("running"), succeeded()])
    h = make_harness(tmp_path, fake)
    uri = "pollwarden://operations/op-sub"
    inbox = Inbox()
    told = {"message_handler": inbox.handler} if era else {}  # 2026-07-28: events come on the listen stream
    async with h.client(**told, **era) as watcher, h.client() as other:
        await track(other, "sub")
        async with subscribed(watcher, uri, era, inbox):
            # A refused early check changes nothing a subscriber cares about ...
            assert (
                view(await other.call_tool("check_status", {"operation_id": "op-sub"}))["outcome"]
                == "not_yet"
            )
            # ... a state change made through the other server (its own database connection) does.
            polled = view(
                await other.call_tool("check_status", {"operation_id": "op-sub", "wait_seconds": 30})
            )
            assert polled["state"] == "running"
            await inbox.wait_for(uri)
            assert inbox.uris == [uri]
            done = view(await other.call_tool("check_status", {"operation_id": "op-sub", "wait_seconds": 30}))
            assert done["status"] == "succeeded"
            await inbox.wait_for(uri, times=2)
        read = await watcher.read_resource(uri)
    assert json.loads(read.contents[0].text)["status"] == "succeeded"  # type: ignore[union-attr]


@pytest.mark.parametrize("era", ERAS)
async def test_a_client_of_a_real_serve_process_is_told_of_a_change_made_by_another_process(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("proc", [pending("running")])
    h = make_harness(tmp_path, fake, table=FAST)
    uri = "pollwarden://operations/op-proc"
    inbox = Inbox()
    params = StdioServerParameters(command=sys.executable, args=serve_args(h), env=child_env())
    told = {"message_handler": inbox.handler} if era else {}
    with anyio.fail_after(60):
        async with Client(params, **told, **era) as watcher:
            async with h.client() as other:
                await track(other, "proc")
            async with subscribed(watcher, uri, era, inbox):
                async with h.client() as other:  # this test process, the same database file
                    h.clock.advance(1)
                    polled = view(await other.call_tool("check_status", {"operation_id": "op-proc"}))
                    assert polled["state"] == "running"
                await inbox.wait_for(uri)


async def test_subscribing_to_something_that_is_not_an_operation_is_refused(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client(mode="legacy") as client:
        with pytest.raises(MCPError) as caught:
            await client.subscribe_resource("file:///etc/passwd")  # pyright: ignore[reportDeprecated]
    assert caught.value.error.code == INVALID_PARAMS
    assert "pollwarden://operations/{operation_id}" in caught.value.error.message


# -- streamable HTTP resumption -----------------------------------------------------------------------


async def read_sse(
    response: httpx2.Response, until: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """Events of an SSE response (id and parsed data), read until one satisfies `until`."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if line.startswith("id:"):
            current["id"] = line[3:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            current["data"] = json.loads(data) if data else None
        elif line == "":
            if current:
                events.append(current)
                if until(current):
                    return events
            current = {}
    return events


async def test_a_check_status_whose_stream_drops_mid_wait_resumes_with_last_event_id_and_gets_its_answer(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("resume", [pending("running")])
    h: Harness = make_harness(
        tmp_path, fake, table={"schedule": {"base_delay_seconds": 3, "max_delay_seconds": 3}}
    )
    port = free_port()
    log = tmp_path / "http.log"
    url = f"http://127.0.0.1:{port}/mcp"
    base = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    with child_process(serve_args(h, "--transport", "http", "--port", str(port)), log) as proc:
        await wait_until_listening(proc, port, log)
        async with httpx2.AsyncClient(timeout=30) as http:
            init = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "resume-test", "version": "0"},
                },
            }
            answer = await http.post(url, json=init, headers=base)
            session = answer.headers["mcp-session-id"]
            headers = {**base, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
            await http.post(
                url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
            )
            start = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {
                    "name": "start_operation",
                    "arguments": {
                        "provider": "acme",
                        "operation_id": "op-resume",
                        "provider_job_id": "resume",
                    },
                },
            }
            started = await http.post(url, json=start, headers=headers)
            assert started.status_code == 200
            check = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {
                    "name": "check_status",
                    "arguments": {"operation_id": "op-resume", "wait_seconds": 10},
                },
            }
            # The call waits about 3 s for its allowed time; the stream is dropped after its first event.
            async with http.stream("POST", url, json=check, headers=headers) as streaming:
                first = await read_sse(streaming, lambda e: "id" in e)
            last_id = first[-1]["id"]
            assert fake.status_requests("resume") == []  # it dropped before the request went out
            resume_headers = {**headers, "Accept": "text/event-stream", "last-event-id": last_id}
            async with http.stream("GET", url, headers=resume_headers) as resumed:
                assert resumed.status_code == 200
                events = await read_sse(
                    resumed, lambda e: isinstance(e.get("data"), dict) and e["data"].get("id") == 3
                )
    answer_event = events[-1]["data"]
    assert answer_event["result"]["structuredContent"]["outcome"] == "polled"
    assert len(fake.status_requests("resume")) == 1
