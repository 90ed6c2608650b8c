"""Clients that give up: a cancelled call never leaves a transaction open, and an answer that arrived is kept.

A tool call can be cancelled at any point (a client timeout, `notifications/cancelled`).
Every transaction still ends, and once the status request has been sent its
answer is recorded even though the caller is gone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx2
import pytest

from harness import check, make_harness, track
from pollwarden.audit.chain import read_rows
from pollwarden.surface.server import controller_factory
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import audit_verify, read_record

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", ["legacy", "stateless"])
@pytest.mark.sqlite_only  # SQLite's write lock; PostgreSQL's lock_timeout: test_postgres_faults.py
async def test_a_call_cancelled_while_another_process_holds_the_lock_leaves_no_transaction_open(
    tmp_path: Path, fake: FakeProvider, mode: str
) -> None:
    fake.script("locked", [pending("running")])
    h = make_harness(tmp_path, fake)
    client_mode = {"mode": "legacy"} if mode == "legacy" else {}
    async with h.client(**client_mode) as client:
        await track(client, "locked")
        h.clock.advance(10)  # the first check is allowed
        before = read_record(h.db_path, "op-locked")
        holder = sqlite3.connect(h.db_path, isolation_level=None, timeout=10)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        agent = anyio.CancelScope()

        async def agent_call() -> None:
            with agent:
                await client.call_tool("check_status", {"operation_id": "op-locked"})

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent_call)
                await anyio.wait_all_tasks_blocked()  # the call is waiting for the lock
                agent.cancel()  # the agent gives up (client timeout, notifications/cancelled)
                await anyio.wait_all_tasks_blocked()
                holder.execute("ROLLBACK")  # then the other process lets go
        finally:
            holder.close()
        assert agent.cancelled_caught

        # Nothing was half-written: the cancelled call counted nothing and holds no lease.
        assert read_record(h.db_path, "op-locked") == before
        assert fake.status_requests("locked") == []
        # The same server keeps working, and counts from where it was.
        polled = await check(client, "locked")
        assert polled["outcome"] == "polled"
        assert polled["status_requests_used"] == 1 == len(fake.status_requests("locked"))

    # A second server on the same file is not locked out by a transaction left open.
    fake.script("second", [pending("running")])
    async with h.client() as second:
        assert (await track(second, "second"))["status"] == "waiting"
        h.clock.advance(10)
        assert (await check(second, "second"))["outcome"] == "polled"
    assert audit_verify(h.db_path).code == 0


class _CancelAfterAnswer(httpx2.AsyncBaseTransport):
    """A real transport that, once the provider's answer to a status request arrived, cancels the caller."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self.cancel: Callable[[], None] | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if self.cancel is not None and request.method == "GET":
            self.cancel()
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_check_cancelled_after_the_provider_answered_still_records_the_answer(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("answered", [pending("queued")])
    h = make_harness(tmp_path, fake)
    transport = _CancelAfterAnswer()
    h.server()  # writes the provider table the factory loads
    factory = controller_factory(h.config(), clock=h.clock, rng=h.rng, transport=transport)
    async with factory() as controller:
        await controller.start_operation(
            provider="acme", operation_id="op-answered", provider_job_id="answered"
        )
        h.clock.advance(10)
        with anyio.CancelScope() as scope:
            transport.cancel = scope.cancel  # the client gives up right after the GET
            await controller.check_status("op-answered")
        assert scope.cancel_called
        transport.cancel = None

        # The request was sent once, and what it answered is recorded: counters, state, audit row.
        assert len(fake.status_requests("answered")) == 1
        record = read_record(h.db_path, "op-answered")
        assert record is not None
        assert (record["status_requests_used"], record["polls_completed"]) == (1, 1)
        assert (record["state"], record["last_http_status"], record["lease_owner"]) == ("queued", 200, None)
        assert [row.kind for row in read_rows(h.db_path, "op-answered")] == ["tracking", "polled"]
        # The agent sees it on its next call.
        seen = (await controller.get_operation("op-answered")).model_dump()
        assert (seen["state"], seen["status_requests_used"]) == ("queued", 1)
