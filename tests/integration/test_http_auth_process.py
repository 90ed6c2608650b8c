"""`pollwarden serve --transport http --auth-tokens FILE` as a real process on 127.0.0.1.

The other auth tests serve the app in the test's own event loop; this one runs
the command a newcomer runs, with tokens `pollwarden tokens add` made, and talks
to it with plain HTTP and the SDK's real Client.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from harness import make_harness, view
from tests.integration.test_http_auth import AGENT, post_initialize
from tests.integration.test_restart_and_transports import (
    child_process,
    free_port,
    serve_args,
    wait_until_listening,
)
from tests.support.auth_helpers import bearer_client
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import pollwarden_cli

# SQLite only: the subject is serve's token file as a process (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


def tokens_add(path: Path, name: str) -> str:
    """`pollwarden tokens add NAME --scopes pollwarden:agent` as a process, as a newcomer runs it; the token."""
    done = pollwarden_cli("tokens", "add", name, "--scopes", AGENT, "--file", str(path))
    assert done.code == 0, done.stderr
    return done.stdout.strip()


async def test_a_token_protected_serve_process_refuses_without_a_token_serves_with_one_and_keeps_principals_apart(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("proc-job", [pending("running")])
    tokens = tmp_path / "tokens"
    alice, bob = tokens_add(tokens, "alice"), tokens_add(tokens, "bob")
    h = make_harness(tmp_path, fake)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    metadata = f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp"
    log = tmp_path / "serve.log"
    args = serve_args(h, "--transport", "http", "--port", str(port), "--auth-tokens", str(tokens))
    with child_process(args, log) as proc:
        await wait_until_listening(proc, port, log)
        refused = await post_initialize(url)
        assert refused.status_code == 401
        challenge = refused.headers["www-authenticate"]
        assert challenge.startswith("Bearer ")
        assert f'resource_metadata="{metadata}"' in challenge
        async with httpx2.AsyncClient(timeout=10) as http:
            document = (await http.get(metadata)).json()
        assert document["resource"] == url
        assert "pollwarden:agent" in document["scopes_supported"]

        async with bearer_client(url, alice) as client:
            started = view(
                await client.call_tool(
                    "start_operation",
                    {"provider": "acme", "operation_id": "mine", "provider_job_id": "proc-job"},
                )
            )
            assert (started["operation_id"], started["status"]) == ("mine", "waiting")
        async with bearer_client(url, bob) as client:
            theirs = await client.call_tool("get_operation", {"operation_id": "mine"})
            unknown = await client.call_tool("get_operation", {"operation_id": "nobody-has-this"})
            listed = view(await client.call_tool("list_operations", {}))
        assert theirs.is_error
        text = json.dumps([getattr(b, "text", None) for b in theirs.content])
        assert text == json.dumps([getattr(b, "text", None) for b in unknown.content]).replace(
            "nobody-has-this", "mine"
        )
        assert listed["operations"] == []
    logged = log.read_text()
    assert "[alice]" in logged  # the log names the principal …
    for token in (alice, bob):
        assert token not in logged  # … never a token
