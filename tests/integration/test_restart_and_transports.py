"""Restarts keep the counters; the server speaks stdio and streamable HTTP; waiting, reads and resources.

Subprocess tests run the real `pollwarden serve` (system clock) against the fake
provider on 127.0.0.1, with a provider table of tiny delays so a real wait is a
few milliseconds. In-process tests use the fake clock.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, TextResourceContents

from harness import Harness, db_rows, error_text, full_delays, make_harness, view, write_table
from pollwarden.core.clock import FakeClock
from pollwarden.rules.schedule import wait_bound
from tests.support.fake_provider import FakeProvider, http, pending, succeeded
from tests.support.ports import free_port

# SQLite only: the subject is the transports; tests marked both_engines are the restarts' (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]
# Real subprocesses use the system clock: tiny delays keep a real wait to milliseconds.
FAST: dict[str, Any] = {"schedule": {"base_delay_seconds": 0.05, "max_delay_seconds": 0.2}}
CORE_TOOLS = {"start_operation", "check_status", "request_extension", "get_operation", "list_operations"}
VIEW_FIELDS = {
    "operation_id",
    "outcome",
    "status",
    "stop_reason",
    "allowed_actions",
    "escalation",
    "next_check_at",
}
STARTUP_SECONDS = 20.0


async def start(client: Any, job_id: str, **extra: Any) -> dict[str, Any]:
    args = {"provider": "acme", "operation_id": f"op-{job_id}", "provider_job_id": job_id, **extra}
    return view(await client.call_tool("start_operation", args))


async def check(client: Any, job_id: str, wait: float = 0, **kwargs: Any) -> dict[str, Any]:
    args = {"operation_id": f"op-{job_id}", "wait_seconds": wait}
    return view(await client.call_tool("check_status", args, **kwargs))


async def get(client: Any, job_id: str) -> dict[str, Any]:
    return view(await client.call_tool("get_operation", {"operation_id": f"op-{job_id}"}))


def serve_args(h: Harness, *extra: str) -> list[str]:
    """`python -m pollwarden serve` on the harness's database and table directory."""
    write_table(h.tables_dir, h.table)
    return ["-m", "pollwarden", "serve", "--db", str(h.db_path), "--providers", str(h.tables_dir), *extra]


def child_env() -> dict[str, str]:
    """The test's environment without pollwarden settings that could redirect the child."""
    return {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}


COUNTERS = (
    "status",
    "state",
    "status_requests_used",
    "max_status_requests",
    "transport_failures_used",
    "rate_limited_used",
    "next_check_at",
    "delay_source",
    "deadline_at",
    "last_http_status",
    "last_http_at",
)


def counters(v: dict[str, Any]) -> dict[str, Any]:
    return {k: v[k] for k in COUNTERS}


# -- restart -------------------------------------------------------------------------------------------


@pytest.mark.both_engines
async def test_a_restart_between_checks_keeps_every_counter_and_the_next_allowed_time(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script(
        "r", [pending("queued"), http(503), http(429, headers={"Retry-After": "30"}), pending("running")]
    )
    clock = FakeClock()
    expected = [(1, 0, 0), (2, 1, 0), (3, 1, 1), (4, 1, 1)]
    before: dict[str, Any] | None = None
    # Every check runs in a new server instance on the same database file.
    for step, (used, transport, limited) in enumerate(expected):
        h = make_harness(tmp_path, fake, clock=clock)
        async with h.client() as client:
            if step == 0:
                await start(client, "r", max_status_requests=4)
            else:
                assert before is not None
                restarted = await get(client, "r")
                assert counters(restarted) == counters(before)
                # A new process does not make an early check allowed.
                assert (await check(client, "r"))["outcome"] == "not_yet"
                clock.advance(10)  # the last delay is 40 s: more than one call waits (CALL_BUDGET_SECONDS)
            v = await check(client, "r", wait=30)
            assert v["outcome"] == "polled"
            assert (v["status_requests_used"], v["transport_failures_used"], v["rate_limited_used"]) == (
                used,
                transport,
                limited,
            )
            before = v
    assert before is not None
    # The budget of 4 counted requests made in four different server instances.
    assert before["stop_reason"] == "request_budget_exhausted"
    async with make_harness(tmp_path, fake, clock=clock).client() as client:
        assert (await check(client, "r", wait=30))["outcome"] == "stopped"
    assert len(fake.status_requests("r")) == 4


@pytest.mark.both_engines
async def test_a_new_process_on_the_same_database_never_resets_the_counters(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("p", [pending("queued"), http(503), pending("running")])
    # The in-process server runs on a fake clock set to real time, so the child's system clock agrees.
    h = make_harness(tmp_path, fake, clock=FakeClock(start=time.time()))
    async with h.client() as client:
        await start(client, "p")
        await check(client, "p", wait=30)
        last = await check(client, "p", wait=30)  # 503: next check 20 s of fake time ahead
    assert (last["status_requests_used"], last["transport_failures_used"]) == (2, 1)

    params = StdioServerParameters(command=sys.executable, args=serve_args(h), env=child_env())
    async with Client(params) as child:
        seen = await get(child, "p")
        assert counters(seen) == counters(last)
        refused = await check(child, "p")
        assert refused["outcome"] == "not_yet"
        assert refused["retry_after_seconds"] > 10
        assert (refused["status_requests_used"], refused["transport_failures_used"]) == (2, 1)
    assert len(fake.status_requests("p")) == 2


# -- stdio and streamable HTTP -------------------------------------------------------------------------


async def assert_tools_are_listed(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) >= CORE_TOOLS
    for name in CORE_TOOLS:
        tool = tools[name]
        assert tool.description, name
        assert len(tool.description) > 20, name
        assert tool.output_schema is not None, name
        assert tool.output_schema.get("type") == "object", name
    for name in ("start_operation", "check_status", "get_operation"):
        schema = tools[name].output_schema
        assert schema is not None
        assert set(schema["properties"]) >= VIEW_FIELDS, name
    listing = tools["list_operations"].output_schema
    assert listing is not None
    assert set(listing["properties"]) >= {"operations", "count"}
    assert tools["check_status"].input_schema["properties"]["wait_seconds"]["maximum"] == 30
    assert tools["get_operation"].annotations is not None
    assert tools["get_operation"].annotations.read_only_hint is True


async def start_then_check(client: Client, job_id: str) -> None:
    started = await start(client, job_id)
    assert (started["status"], started["status_requests_used"]) == ("waiting", 0)
    polled = await check(client, job_id, wait=5)
    assert polled["outcome"] == "polled"
    assert (polled["state"], polled["status_requests_used"]) == ("running", 1)
    assert polled["last_http_status"] == 200


@pytest.mark.parametrize("era", ERAS)
async def test_pollwarden_serve_over_stdio_lists_its_tools_and_runs_start_then_check(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("stdio", [pending("running")])
    h = make_harness(tmp_path, fake, table=FAST)
    params = StdioServerParameters(command=sys.executable, args=serve_args(h), env=child_env())
    async with Client(params, **era) as client:
        assert client.protocol_version == ("2025-11-25" if era else "2026-07-28")
        await assert_tools_are_listed(client)
        await start_then_check(client, "stdio")
    assert len(fake.status_requests("stdio")) == 1


class JsonRpcPipe:
    """Raw JSON-RPC over a child's stdin/stdout; every stdout line must be a JSON-RPC message."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self.proc = proc
        self.stdin = proc.stdin
        self.fd = proc.stdout.fileno()
        self.buffer = b""
        self.messages: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        self.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.stdin.flush()

    def _take_lines(self) -> None:
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            message = json.loads(line)  # anything else on stdout fails here
            assert isinstance(message, dict), line
            assert message.get("jsonrpc") == "2.0", line
            self.messages.append(message)  # type: ignore[arg-type]

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        chunk = os.read(self.fd, 65536)
        self.buffer += chunk
        self._take_lines()
        return bool(chunk)

    def answer(self, request_id: int, timeout: float = STARTUP_SECONDS) -> dict[str, Any]:
        """Read stdout until the response to `request_id` arrives (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in self.messages:
                if message.get("id") == request_id and ("result" in message or "error" in message):
                    return message
            if not self._read(deadline - time.monotonic()):
                break
        raise AssertionError(f"no answer to request {request_id}; got {self.messages}")

    def drain(self) -> None:
        """Read stdout to its end (after stdin is closed and the child exits)."""
        while self._read(5.0):
            if self.proc.poll() is not None and not select.select([self.fd], [], [], 0)[0]:
                break
        assert self.buffer == b"", f"a partial line was left on stdout: {self.buffer!r}"


@contextmanager
def child_process(args: list[str], log: Path, **popen: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A child process whose stderr goes to `log`; stopped by its own handle afterwards."""
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, *args], stderr=err, env=child_env(), **popen)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


# The first check of an operation on this table is allowed 1.5-3 s after its start (jitter draws half
# to all of the delay), so the check below, sent right after start_operation answers, waits and
# reports progress. With FAST's 25-50 ms it is often due already on a loaded machine (pytest-xdist
# workers beside it), and answers without waiting, so without progress.
FIRST_CHECK_WAITS: dict[str, Any] = {"schedule": {"base_delay_seconds": 3.0, "max_delay_seconds": 3.0}}


def test_the_stdio_server_writes_nothing_but_json_rpc_to_stdout(tmp_path: Path, fake: FakeProvider) -> None:
    fake.script("raw", [pending("running")])
    h = make_harness(tmp_path, fake, table=FIRST_CHECK_WAITS)
    args = serve_args(h)
    args.insert(2, "--verbose")  # debug logging: every log line must still go to stderr
    log = tmp_path / "stderr.log"
    with child_process(args, log, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        pipe = JsonRpcPipe(proc)
        pipe.send(
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw-test", "version": "0"},
                },
            }
        )
        assert "result" in pipe.answer(1)
        pipe.send({"method": "notifications/initialized"})
        pipe.send({"id": 2, "method": "tools/list"})
        assert {t["name"] for t in pipe.answer(2)["result"]["tools"]} >= CORE_TOOLS
        start_args = {"provider": "acme", "operation_id": "op-raw", "provider_job_id": "raw"}
        pipe.send(
            {"id": 3, "method": "tools/call", "params": {"name": "start_operation", "arguments": start_args}}
        )
        assert pipe.answer(3)["result"]["structuredContent"]["status"] == "waiting"
        check_params = {
            "name": "check_status",
            "arguments": {"operation_id": "op-raw", "wait_seconds": 5},
            "_meta": {"progressToken": "p-1"},
        }
        pipe.send({"id": 4, "method": "tools/call", "params": check_params})
        assert pipe.answer(4)["result"]["structuredContent"]["outcome"] == "polled"
        proc.stdin.close()  # type: ignore[union-attr]
        assert proc.wait(timeout=10) == 0
        pipe.drain()
    assert {m.get("id") for m in pipe.messages} >= {1, 2, 3, 4}
    progress = [m for m in pipe.messages if m.get("method") == "notifications/progress"]
    assert progress
    assert all(m["params"]["progressToken"] == "p-1" for m in progress)
    assert "pollwarden serving" in log.read_text()
    assert len(fake.status_requests("raw")) == 1


async def wait_until_listening(
    proc: subprocess.Popen[bytes], port: int, log: Path, host: str = "127.0.0.1"
) -> None:
    """Bounded polling for the child's start-up (the only waiting on real time here)."""
    with anyio.fail_after(STARTUP_SECONDS):
        while True:
            if proc.poll() is not None:
                pytest.fail(f"pollwarden serve exited with {proc.returncode}: {log.read_text()}")
            try:
                stream = await anyio.connect_tcp(host, port)
            except OSError:
                await anyio.sleep(0.05)
                continue
            await stream.aclose()
            return


async def test_pollwarden_serve_over_streamable_http_on_127_0_0_1_in_both_eras(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("web-1", [pending("running")])
    fake.script("web-2", [pending("running")])
    h = make_harness(tmp_path, fake, table=FAST)
    port = free_port()
    log = tmp_path / "http.log"
    with child_process(serve_args(h, "--transport", "http", "--port", str(port)), log) as proc:
        await wait_until_listening(proc, port, log)
        url = f"http://127.0.0.1:{port}/mcp"
        async with Client(url) as client:
            assert client.protocol_version == "2026-07-28"
            await assert_tools_are_listed(client)
            await start_then_check(client, "web-1")
        async with Client(url, mode="legacy") as client:
            assert client.protocol_version == "2025-11-25"
            await assert_tools_are_listed(client)
            await start_then_check(client, "web-2")
            listed = view(await client.call_tool("list_operations", {}))
            assert {o["operation_id"] for o in listed["operations"]} == {"op-web-1", "op-web-2"}
    assert f"Uvicorn running on http://127.0.0.1:{port}" in log.read_text()  # loopback by default
    assert len(fake.status_requests("web-1")) == len(fake.status_requests("web-2")) == 1


# -- waiting -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
async def test_wait_seconds_above_the_real_maximum_of_30_is_refused_by_the_schema_and_changes_nothing(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("w", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client(**era) as client:
        await start(client, "w")
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["check_status"].input_schema["properties"]["wait_seconds"]["maximum"] == 30
        for bad in (30.5, 3600, -1):
            result = await client.call_tool("check_status", {"operation_id": "op-w", "wait_seconds": bad})
            text = error_text(result)
            assert "wait_seconds" in text
            assert ("30" in text) if bad > 0 else ("0" in text)
        unchanged = await get(client, "w")
        assert (unchanged["status_requests_used"], unchanged["status"]) == (0, "waiting")
        assert (await check(client, "w", wait=30))["outcome"] == "polled"
    assert len(fake.status_requests("w")) == 1


@pytest.mark.both_engines
@pytest.mark.parametrize("era", ERAS)
async def test_a_waiting_check_sends_progress_and_holds_no_lease_while_it_waits(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("slow", [pending("queued"), pending("running")])
    h = make_harness(tmp_path, fake)
    seen: list[tuple[float, float | None, str | None, tuple[Any, ...], int]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        [row] = db_rows(h.db_path, "SELECT lease_owner, lease_expires_at FROM operations")
        lease = (row["lease_owner"], row["lease_expires_at"])
        seen.append((progress, total, message, tuple(lease), len(fake.status_requests("slow"))))

    async with h.client(**era) as client:
        await start(client, "slow")
        first = await check(client, "slow", wait=30, progress_callback=on_progress)
        assert first["outcome"] == "polled"
        seen.clear()
        # The next check is allowed 10 s later; the server waits in slices of 5 s.
        second = await check(client, "slow", wait=30, progress_callback=on_progress)
        assert (second["outcome"], second["state"]) == ("polled", "running")
    assert len(seen) >= 2
    progresses = [p for p, *_ in seen]
    assert progresses == sorted(progresses)
    # The total is the wait this call may spend: 30 asked, the most a request still fits the call after.
    assert all(total == wait_bound(30, max_wait=30, request_timeout=20) == 30 for _, total, *_ in seen)
    assert all(message and "waiting" in message for _, _, message, *_ in seen)
    # While it waits: no lease in the database and no request in flight.
    assert all(lease == (None, None) for *_, lease, _ in seen)
    assert all(sent == 1 for *_, sent in seen)
    assert len(fake.status_requests("slow")) == 2


async def test_a_check_without_wait_seconds_sends_no_progress_and_answers_not_yet(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("now", [pending("running")])
    h = make_harness(tmp_path, fake)
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with h.client() as client:
        await start(client, "now")
        v = await check(client, "now", progress_callback=on_progress)
        assert v["outcome"] == "not_yet"
    assert seen == []
    assert fake.status_requests("now") == []


# -- read-only tools and resources ---------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
async def test_list_operations_and_get_operation_never_call_the_provider(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("a", [pending("running")])
    fake.script("b", [succeeded()])
    h = make_harness(tmp_path, fake)
    async with h.client(**era) as client:
        await start(client, "a")
        await start(client, "b")
        await check(client, "a", wait=30)
        await check(client, "b", wait=30)
        sent = len(fake.log())
        h.clock.advance(600)  # long past both next allowed checks
        for _ in range(5):
            a = await get(client, "a")
            assert (a["status"], a["status_requests_used"], a["outcome"]) == ("waiting", 1, None)
            everything = view(await client.call_tool("list_operations", {}))
            assert everything["count"] == 2
        waiting = view(await client.call_tool("list_operations", {"status": "waiting"}))
        assert [o["operation_id"] for o in waiting["operations"]] == ["op-a"]
        done = view(await client.call_tool("list_operations", {"status": "succeeded", "provider": "acme"}))
        assert [o["operation_id"] for o in done["operations"]] == ["op-b"]
        assert view(await client.call_tool("list_operations", {"provider": "other"}))["count"] == 0
        assert view(await client.call_tool("list_operations", {"limit": 1}))["count"] == 1
    assert len(fake.log()) == sent


@pytest.mark.parametrize("era", ERAS)
async def test_the_operation_and_audit_resources_return_the_view_and_the_story(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("res", [pending("queued"), http(503, headers={"Retry-After": "120"}), pending("running")])
    h = make_harness(tmp_path, fake, rng=full_delays())  # the story's times: every delay its maximum
    async with h.client(**era) as client:
        await start(client, "res")
        await check(client, "res", wait=30)
        await check(client, "res", wait=30)
        sent = len(fake.log())

        read = await client.read_resource("pollwarden://operations/op-res")
        (content,) = read.contents
        assert isinstance(content, TextResourceContents)
        assert content.mime_type == "application/json"
        as_json = json.loads(content.text)
        assert as_json == await get(client, "res")
        assert (as_json["status_requests_used"], as_json["delay_source"]) == (2, "provider_retry_after")

        audit = await client.read_resource("pollwarden://operations/op-res/audit")
        (story,) = audit.contents
        assert isinstance(story, TextResourceContents)
        assert story.mime_type == "text/plain"
        lines = story.text.splitlines()
        assert lines == [
            "10:20:00 tracking job res, deadline 11:00:00, budget 12",
            "10:20:05 polled, state queued, next poll 10:20:15 from local backoff",
            "10:20:15 received 503, Retry-After 120, next poll 10:22:15 from provider guidance",
        ]
        assert len(fake.log()) == sent  # reading a resource is not a status check

        with pytest.raises(MCPError) as missing:
            await client.read_resource("pollwarden://operations/op-nope")
        assert missing.value.code == INVALID_PARAMS
        assert "op-nope" in str(missing.value)
        assert "list_operations" in str(missing.value)
        with pytest.raises(MCPError) as missing_audit:
            await client.read_resource("pollwarden://operations/op-nope/audit")
        assert missing_audit.value.code == INVALID_PARAMS
