"""The receiver app `pollwarden webhooks` serves (with /metrics, /healthz, /readyz) on 127.0.0.1, for tests."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

import anyio
import httpx2
import uvicorn

from harness import Harness
from pollwarden.ops.health import ops_routes
from pollwarden.provider_io.webhooks import WebhookReceiver, receiver_app
from pollwarden.store import open_store
from pollwarden.surface.http_serve import HttpOptions, transport_security
from pollwarden_providers import load_tables
from tests.support.live import write_table


@asynccontextmanager
async def receiver_on_loopback(h: Harness) -> AsyncGenerator[httpx2.AsyncClient]:
    """The app `pollwarden webhooks` serves (with /metrics, /healthz, /readyz), on 127.0.0.1."""
    write_table(h.tables_dir, h.table)
    tables = load_tables([h.tables_dir])
    receiver = WebhookReceiver(tables=tables, clock=h.clock, environ={})
    security = transport_security(HttpOptions())
    ops = ops_routes(lambda: receiver.store, tables, security, clock=h.clock)
    app = receiver_app(receiver, security, lambda: open_store(h.database), ops)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for this
                await anyio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            try:
                yield client
            finally:
                server.should_exit = True
