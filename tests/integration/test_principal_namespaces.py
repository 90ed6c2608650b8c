"""Principals are namespaced by their verifier (issue 31, item 6): a JWT's alice is not the token file's."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import error_text, make_harness, view
from pollwarden.access.auth import EitherVerifier, JwtVerifier, TokenFileVerifier
from pollwarden.access.principals import principal_name_problem
from pollwarden.core.errors import ConfigError
from tests.integration.test_http_auth import AGENT, FAST, Now, add_token, served
from tests.support.auth_helpers import Issuer, SigningKey, bearer_client, serving
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import pollwarden_cli
from tests.support.ports import free_port

# SQLite only: the subject is how principals are named (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


async def test_a_jwt_naming_alice_does_not_read_the_token_file_alices_operations(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("j1", [pending("running")])
    tokens = tmp_path / "tokens"
    alice_token = add_token(tokens, "alice", AGENT)
    now = Now()
    issuer = Issuer(port=free_port(), keys=[SigningKey("k1")])

    def both(resource: str) -> EitherVerifier:
        jwt = JwtVerifier(issuer=issuer.url, audience=resource, jwks_url=issuer.jwks_url, now=now)
        return EitherVerifier([TokenFileVerifier(tokens), jwt])

    h = make_harness(tmp_path, fake, table=FAST)
    async with serving(issuer.app(), issuer.port), served(h, both, issuer=issuer.url) as s:
        async with bearer_client(s.url, alice_token) as client:
            view(
                await client.call_tool(
                    "start_operation", {"provider": "acme", "operation_id": "a1", "provider_job_id": "j1"}
                )
            )
        impostor = issuer.token(issuer.keys[0], audience=s.resource, sub="alice", now=now.t)
        async with bearer_client(s.url, impostor) as client:
            unknown = await client.call_tool("get_operation", {"operation_id": "a1"})
            listed = view(await client.call_tool("list_operations", {}))
            # Another job (one job has one budget whoever asks): the same operation id is its own.
            mine = view(
                await client.call_tool(
                    "start_operation", {"provider": "acme", "operation_id": "a1", "provider_job_id": "j2"}
                )
            )
    assert unknown.is_error
    assert "a1" in error_text(unknown)
    assert listed["operations"] == []
    assert mine["operation_id"] == "a1"  # its own operation under the same id, not the token file alice's
    assert mine["status_requests_used"] == 0


def test_a_token_file_name_cannot_take_the_jwt_namespace(tmp_path: Path) -> None:
    assert principal_name_problem("jwt:alice") is not None
    added = pollwarden_cli("tokens", "add", "jwt:alice", "--scopes", AGENT, "--file", str(tmp_path / "t"))
    assert added.code == 2
    assert "JWT issuer's principals" in added.stderr
    (tmp_path / "t").write_text("sha256:" + "0" * 64 + " jwt:alice " + AGENT + "\n")
    (tmp_path / "t").chmod(0o600)
    with pytest.raises(ConfigError, match="JWT issuer's principals"):
        TokenFileVerifier(tmp_path / "t")
