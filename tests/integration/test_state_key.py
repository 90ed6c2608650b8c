"""Several HTTP instances on one database: an approval asked through one is answered through another.

In the 2026-07-28 era an elicitation is answered by the client retrying the
call with the sealed request state; behind one address (or after a restart)
that retry may reach another instance. With POLLWARDEN_STATE_KEY shared by the
instances the other instance accepts the answer; without a shared key it
cannot, and nothing is decided.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitRequestParams, ElicitResult

from harness import Harness, db_rows, make_harness, view, write_table
from tests.integration.test_restart_and_transports import FAST, free_port, wait_until_listening
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is sealed request state across instances (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.one_engine]

KEY = "k" * 40


@contextmanager
def instance(h: Harness, port: int, key: str | None, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`pollwarden serve --transport http` on the harness's database, with the state key (or none)."""
    write_table(h.tables_dir, h.table)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}
    if key is not None:
        env["POLLWARDEN_STATE_KEY"] = key
    db = h.database.dsn or str(h.database.path)
    args = ["-m", "pollwarden", "serve", "--db", db, "--providers", str(h.tables_dir)]
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, *args, "--transport", "http", "--port", str(port)], stderr=err, env=env
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


class Alternating(httpx2.AsyncBaseTransport):
    """One address in front of two instances: each request_extension call goes to the next instance."""

    def __init__(self, ports: tuple[int, int]) -> None:
        self.ports = ports
        self.inner = httpx2.AsyncHTTPTransport()
        self.extension_calls: list[int] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        port = self.ports[0]
        try:
            message: Any = json.loads(body) if body else {}
        except ValueError:
            message = {}
        tool = message.get("params", {}).get("name") if isinstance(message, dict) else None
        if (
            isinstance(message, dict)
            and message.get("method") == "tools/call"
            and tool == "request_extension"
        ):
            port = self.ports[len(self.extension_calls) % 2]
            self.extension_calls.append(port)
        url = request.url.copy_with(port=port)
        headers = dict(request.headers)
        headers["host"] = f"127.0.0.1:{port}"
        routed = httpx2.Request(
            request.method, url, headers=headers, content=body, extensions=request.extensions
        )
        return await self.inner.handle_async_request(routed)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Person:
    """Approves, and remembers every question."""

    def __init__(self) -> None:
        self.questions: list[str] = []

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.questions.append(params.message)
        return ElicitResult(action="accept", content={"decision": "approve"})


@asynccontextmanager
async def behind_one_address(router: Alternating, person: Person) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(transport=router, timeout=60) as http:
        transport = streamable_http_client("http://127.0.0.1:1/mcp", http_client=http)
        async with Client(transport, elicitation_callback=person) as client:
            yield client


async def _escalated(client: Client, job: str) -> None:
    args = {"provider": "acme", "operation_id": f"op-{job}", "provider_job_id": job, "max_status_requests": 1}
    view(await client.call_tool("start_operation", args))
    for _ in range(2):
        last = view(await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 5}))
    assert last["stop_reason"] == "request_budget_exhausted"


async def _run(tmp_path: Path, fake: FakeProvider, keys: tuple[str | None, str | None], job: str) -> Any:
    fake.script(job, [pending("running")])
    h = make_harness(tmp_path, fake, table=FAST)
    ports = (free_port(), free_port())
    with (
        instance(h, ports[0], keys[0], tmp_path / "a.log") as a,
        instance(h, ports[1], keys[1], tmp_path / "b.log") as b,
    ):
        await wait_until_listening(a, ports[0], tmp_path / "a.log")
        await wait_until_listening(b, ports[1], tmp_path / "b.log")
        router = Alternating(ports)
        person = Person()
        with anyio.fail_after(60):
            async with behind_one_address(router, person) as client:
                await _escalated(client, job)
                args = {
                    "operation_id": f"op-{job}",
                    "extra_seconds": 600,
                    "extra_status_requests": 2,
                    "reason": "the export is large",
                }
                try:
                    result: Any = await client.call_tool("request_extension", args)
                except Exception as exc:  # the SDK raises when the retry's state is refused
                    result = exc
        return h, router, person, result


async def test_an_approval_asked_through_one_instance_is_answered_through_another_with_a_shared_key(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h, router, person, result = await _run(tmp_path, fake, (KEY, KEY), "shared")

    assert router.extension_calls[:2] == list(router.ports)  # asked on one, answered on the other
    assert len(person.questions) == 1
    decided = view(result)
    assert decided["decision"] == "approved"
    assert decided["operation"]["max_status_requests"] == 3
    kinds = [
        r["kind"] for r in db_rows(h.database, "SELECT kind FROM audit WHERE operation_id = ?", "op-shared")
    ]
    assert "extension_approved" in kinds


async def test_without_a_shared_key_the_answer_through_another_instance_is_refused_and_nothing_is_granted(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h, router, _, result = await _run(tmp_path, fake, (KEY, "x" * 40), "apart")

    assert router.extension_calls[:2] == list(router.ports)
    assert isinstance(result, Exception) or result.is_error or view(result)["decision"] != "approved"
    kinds = [
        r["kind"] for r in db_rows(h.database, "SELECT kind FROM audit WHERE operation_id = ?", "op-apart")
    ]
    assert "extension_approved" not in kinds
    [row] = db_rows(
        h.database, "SELECT max_status_requests FROM operations WHERE operation_id = ?", "op-apart"
    )
    assert row["max_status_requests"] == 1
