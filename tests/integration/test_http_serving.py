"""Streamable HTTP keeps DNS-rebinding protection on every host, and slow clients cannot hold the server.

All servers here listen on loopback addresses only; the slow-client run is bounded in connections and time.

The pure checks are tests/unit/test_http_serving.py.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client import Client

from harness import make_harness
from tests.integration.test_restart_and_transports import (
    FAST,
    child_process,
    free_port,
    serve_args,
    wait_until_listening,
)
from tests.support.fake_provider import FakeProvider
from tests.support.live import pollwarden_cli

# SQLite only: the subject is HTTP serving (Host checks, slow clients) (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "rebinding-test", "version": "0"},
    },
}


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_serve_refuses_allow_non_loopback_without_allowed_hosts_before_touching_anything(
    tmp_path: Path,
) -> None:
    done = pollwarden_cli(
        "serve",
        "--transport",
        "http",
        "--host",
        "0.0.0.0",
        "--allow-non-loopback",
        "--db",
        str(tmp_path / "x.db"),
    )
    assert done.code == 2
    assert "--allow-non-loopback needs the names clients use to reach this server" in done.stderr
    assert not (tmp_path / "x.db").exists()


async def _post(url: str, **headers: str) -> int:
    async with httpx2.AsyncClient(timeout=10) as client:
        response = await client.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **headers})
        return response.status_code


async def test_a_server_on_another_loopback_address_checks_host_and_origin(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=FAST)
    port = free_port()
    log = tmp_path / "http.log"
    args = serve_args(h, "--transport", "http", "--host", "127.0.0.2", "--port", str(port))
    with child_process(args, log) as proc:
        await wait_until_listening(proc, port, log, host="127.0.0.2")
        url = f"http://127.0.0.2:{port}/mcp"
        assert await _post(url, Host="evil.example") == 421
        assert await _post(url, Host=f"evil.example:{port}") == 421
        assert await _post(url, Origin="http://evil.example") == 403
        assert await _post(url) == 200
        async with Client(url) as client:
            assert (await client.call_tool("list_operations", {})).structured_content == {
                "operations": [],
                "count": 0,
            }


async def test_an_allowed_host_is_answered_and_any_other_refused(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake, table=FAST)
    port = free_port()
    log = tmp_path / "http.log"
    args = serve_args(h, "--transport", "http", "--port", str(port), "--allowed-host", "pollwarden.test")
    with child_process(args, log) as proc:
        await wait_until_listening(proc, port, log)
        url = f"http://127.0.0.1:{port}/mcp"
        assert await _post(url, Host=f"pollwarden.test:{port}") == 200
        assert await _post(url, Host=f"other.test:{port}") == 421


SLOW_CONNECTIONS = 24


LIMIT = 8


REQUEST_TIMEOUT = 1.0


def _open_slow_connections(port: int) -> list[socket.socket]:
    """Idle connections, half-sent headers, and a body that never finishes: bounded in number."""
    partial_body = (
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"jsonrpc":'
    )
    sockets: list[socket.socket] = []
    for index in range(SLOW_CONNECTIONS):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if index % 3 == 1:
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
        elif index % 3 == 2:
            sock.sendall(partial_body)  # body never finished
        sockets.append(sock)
    return sockets


def _closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """True when the server closes `sock` before `deadline` (reads until EOF or reset)."""
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            if sock.recv(4096) == b"":
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


async def test_idle_and_trickling_connections_are_closed_and_never_hold_the_server(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=FAST)
    port = free_port()
    log = tmp_path / "http.log"
    args = serve_args(
        h,
        "--transport",
        "http",
        "--port",
        str(port),
        "--max-connections",
        str(LIMIT),
        "--request-timeout",
        str(REQUEST_TIMEOUT),
    )
    with child_process(args, log) as proc:
        await wait_until_listening(proc, port, log)
        opened = time.monotonic()
        sockets = await anyio.to_thread.run_sync(_open_slow_connections, port)
        try:
            # Beyond the limit a request is answered at once (503), not left hanging.
            started = time.monotonic()
            assert await _post(f"http://127.0.0.1:{port}/mcp") == 503
            assert time.monotonic() - started < REQUEST_TIMEOUT
            deadline = opened + REQUEST_TIMEOUT + 5.0
            closed = [await anyio.to_thread.run_sync(_closed_by_server, sock, deadline) for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        assert all(closed), f"{closed.count(False)} of {SLOW_CONNECTIONS} slow connections were left open"
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            listed: Any = (await client.call_tool("list_operations", {})).structured_content
            assert listed["count"] == 0
    assert "no complete request within 1 s" in log.read_text()
