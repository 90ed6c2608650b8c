"""Bearer tokens on streamable HTTP through the SDK's own auth: token file and JWT against a JWKS.

Every server here is real HTTP on 127.0.0.1 (uvicorn in the test's event loop), called by the SDK's
own client with a bearer token provider; the JWKS is served by a local issuer signing with test keys.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from mcp.server.auth.provider import TokenVerifier
from mcp.shared.exceptions import MCPError

from harness import Harness, make_harness, view
from pollwarden.access.auth import (
    AuthOptions,
    JwtVerifier,
    TokenFileVerifier,
    auth_settings,
    build_verifier,
    hash_token,
    read_token_file,
)
from pollwarden.access.principals import PrincipalLimits
from pollwarden.cli.main import build_parser
from pollwarden.core.errors import ConfigError
from pollwarden.surface.http_serve import HttpOptions, transport_security
from pollwarden.surface.server import build_server, controller_factory
from tests.integration.test_restart_and_transports import FAST
from tests.support.auth_helpers import Issuer, SigningKey, bearer_client, serving
from tests.support.fake_provider import FakeProvider
from tests.support.live import pollwarden_cli
from tests.support.ports import free_port

# SQLite only: the subject is bearer tokens on streamable HTTP (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

AGENT = "pollwarden:agent"
OPERATOR = "pollwarden:operator"


def add_token(path: Path, name: str, scopes: str) -> str:
    """`pollwarden tokens add`'s own command, run in this process; the printed token.

    A `python -m pollwarden` start-up costs 1–3 s on two busy cores, and a team of four principals paid
    it four times per test. The command as a process is tested below (`tokens add|list|remove`) and in
    tests/integration/test_http_auth_process.py.
    """
    args = build_parser().parse_args(["tokens", "add", name, "--scopes", scopes, "--file", str(path)])
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = args.func(args)
    assert code == 0, err.getvalue()
    return out.getvalue().strip()


@dataclass
class Served:
    url: str
    resource: str
    h: Harness


@asynccontextmanager
async def served(
    h: Harness,
    make_verifier: Callable[[str], TokenVerifier],
    *,
    issuer: str | None = None,
    limits: PrincipalLimits | None = None,
) -> AsyncGenerator[Served]:
    """The pollwarden server with auth on 127.0.0.1, on the harness's clock and fake provider."""
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    from harness import write_table

    write_table(h.tables_dir, h.table)
    config = h.config() if limits is None else replace(h.config(), limits=limits)
    factory = controller_factory(config, clock=h.clock, rng=h.rng, environ=h.environ)
    settings = auth_settings(AuthOptions(jwt_issuer=issuer), resource_url=resource)
    server = build_server(factory, auth=settings, token_verifier=make_verifier(resource))
    app = server.streamable_http_app(
        transport_security=transport_security(HttpOptions(port=port)), host="127.0.0.1"
    )
    async with serving(app, port):
        yield Served(url=resource, resource=resource, h=h)


async def post_initialize(url: str, token: str | None = None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    async with httpx2.AsyncClient(timeout=10) as client:
        return await client.post(url, json=body, headers=headers)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        group = cast(BaseExceptionGroup[BaseException], exc)
        return [leaf for inner in group.exceptions for leaf in leaves(inner)]
    return [exc]


# -- the token file ----------------------------------------------------------------------------


def test_tokens_add_prints_a_token_once_and_the_file_holds_only_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    token = add_token(path, "alice", AGENT)
    second = add_token(path, "ops", f"{OPERATOR}")
    text = path.read_text()
    assert token.startswith("pwt_")
    assert len(token) > 40
    assert token != second
    assert token not in text
    assert second not in text
    assert hash_token(token) in text
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    entries = read_token_file(path)
    assert [(e.name, e.scopes) for e in entries] == [("alice", (AGENT,)), ("ops", (OPERATOR,))]
    listed = pollwarden_cli("tokens", "list", "--file", str(path))
    assert listed.stdout.splitlines() == [f"1\talice\t{AGENT}", f"2\tops\t{OPERATOR}"]
    assert "sha256" not in listed.stdout
    removed = pollwarden_cli("tokens", "remove", "alice", "--file", str(path))
    assert removed.code == 0
    assert [e.name for e in read_token_file(path)] == ["ops"]


def test_tokens_add_refuses_unknown_scopes_and_reserved_names(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    bad_scope = pollwarden_cli("tokens", "add", "alice", "--scopes", "admin", "--file", str(path))
    assert bad_scope.code == 2
    assert "scopes must be one or more of pollwarden:agent" in bad_scope.stderr
    local = pollwarden_cli("tokens", "add", "local", "--scopes", AGENT, "--file", str(path))
    assert local.code == 2
    assert "'local' is the local user of stdio" in local.stderr
    assert not path.exists()


async def test_the_token_file_verifier_accepts_listed_tokens_and_reloads_when_the_file_changes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens"
    alice = add_token(path, "alice", AGENT)
    verifier = TokenFileVerifier(path)
    access = await verifier.verify_token(alice)
    assert access is not None
    assert access.client_id == "alice"
    assert access.scopes == [AGENT]
    assert await verifier.verify_token(alice + "x") is None
    assert await verifier.verify_token(hash_token(alice)) is None  # the hash is not a token
    ops = add_token(path, "ops", OPERATOR)
    access = await verifier.verify_token(ops)
    assert access is not None
    assert access.scopes == [OPERATOR, AGENT]
    pollwarden_cli("tokens", "remove", "alice", "--file", str(path))
    assert await verifier.verify_token(alice) is None


async def test_without_a_token_or_with_a_wrong_one_http_answers_401_naming_the_metadata(
    tmp_path: Path, fake: FakeProvider
) -> None:
    path = tmp_path / "tokens"
    token = add_token(path, "alice", AGENT)
    h = make_harness(tmp_path, fake, table=FAST)
    async with served(h, lambda _: TokenFileVerifier(path)) as s:
        metadata_url = f"{s.url.removesuffix('/mcp')}/.well-known/oauth-protected-resource/mcp"
        for sent in (None, "wrong", "x" + token[1:], token[:-1]):
            response = await post_initialize(s.url, sent)
            assert response.status_code == 401, sent
            challenge = response.headers["www-authenticate"]
            assert challenge.startswith("Bearer ")
            assert 'error="invalid_token"' in challenge
            assert f'resource_metadata="{metadata_url}"' in challenge
        async with httpx2.AsyncClient() as client:
            metadata = (await client.get(metadata_url)).json()
        assert metadata["resource"] == s.resource
        assert metadata["scopes_supported"] == [AGENT]
        assert metadata["bearer_methods_supported"] == ["header"]
        assert (await post_initialize(s.url, token)).status_code == 200
        async with bearer_client(s.url, token) as client:
            started = view(
                await client.call_tool(
                    "start_operation", {"provider": "acme", "operation_id": "a1", "provider_job_id": "j1"}
                )
            )
            assert started["operation_id"] == "a1"
        with pytest.raises(Exception) as refused:  # noqa: PT011 (the SDK wraps it in task-group groups)
            async with bearer_client(s.url, "wrong") as client:
                await client.list_tools()
        assert any(isinstance(e, MCPError) for e in leaves(refused.value))


async def test_serve_refuses_allow_non_loopback_without_a_verifier(tmp_path: Path) -> None:
    done = pollwarden_cli(
        "serve",
        "--transport",
        "http",
        "--host",
        "0.0.0.0",
        "--allow-non-loopback",
        "--allowed-host",
        "mcp.example.com",
        "--db",
        str(tmp_path / "x.db"),
    )
    assert done.code == 2
    assert "--allow-non-loopback needs a bearer-token verifier" in done.stderr
    assert not (tmp_path / "x.db").exists()
    with pytest.raises(ConfigError, match="needs a bearer-token verifier"):
        transport_security(
            HttpOptions(host="0.0.0.0", allow_non_loopback=True, allowed_hosts=("mcp.example.com",))
        )
    transport_security(
        HttpOptions(
            host="0.0.0.0",
            allow_non_loopback=True,
            allowed_hosts=("mcp.example.com",),
            verifier_configured=True,
        )
    )


def test_a_jwt_issuer_must_be_https_beyond_loopback() -> None:
    with pytest.raises(ConfigError, match="must be an https:// URL"):
        build_verifier(AuthOptions(jwt_issuer="http://idp.example.com"), resource_url="https://x/mcp")
    with pytest.raises(ConfigError, match="must be an https:// URL"):
        auth_settings(AuthOptions(), resource_url="http://mcp.example.com/mcp")


# -- JWT against a JWKS ----------------------------------------------------------------------------


class Now:
    """The verifier's clock: real time, moved on by the test when needed."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


@asynccontextmanager
async def issuer_and_server(
    tmp_path: Path, fake: FakeProvider, now: Now, **verifier_kwargs: Any
) -> AsyncGenerator[tuple[Issuer, Served, list[JwtVerifier]]]:
    issuer = Issuer(port=free_port(), keys=[SigningKey("k1")])
    made: list[JwtVerifier] = []

    def make(resource: str) -> JwtVerifier:
        verifier = JwtVerifier(
            issuer=issuer.url, audience=resource, jwks_url=issuer.jwks_url, now=now, **verifier_kwargs
        )
        made.append(verifier)
        return verifier

    h = make_harness(tmp_path, fake, table=FAST)
    async with serving(issuer.app(), issuer.port), served(h, make, issuer=issuer.url) as s:
        yield issuer, s, made


async def test_a_jwt_from_the_issuer_is_accepted_and_names_the_principal(
    tmp_path: Path, fake: FakeProvider
) -> None:
    now = Now()
    async with issuer_and_server(tmp_path, fake, now) as (issuer, s, _):
        token = issuer.token(issuer.keys[0], audience=s.resource, sub="alice", now=now.t)
        async with bearer_client(s.url, token) as client:
            started = view(
                await client.call_tool(
                    "start_operation", {"provider": "acme", "operation_id": "a1", "provider_job_id": "j1"}
                )
            )
        assert started["operation_id"] == "a1"
        async with httpx2.AsyncClient() as client:
            metadata = (
                await client.get(f"{s.url.removesuffix('/mcp')}/.well-known/oauth-protected-resource/mcp")
            ).json()
        assert metadata["authorization_servers"] == [issuer.url]


def _unsigned(claims: dict[str, Any]) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT', 'kid': 'k1'})}.{part(claims)}."


async def test_expired_early_foreign_misaddressed_unsigned_and_hs256_tokens_are_refused_with_401(
    tmp_path: Path, fake: FakeProvider
) -> None:
    now = Now()
    async with issuer_and_server(tmp_path, fake, now) as (issuer, s, _):
        key = issuer.keys[0]
        good = issuer.token(key, audience=s.resource, now=now.t)
        assert (await post_initialize(s.url, good)).status_code == 200
        public_pem = key.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        claims = jwt.decode(good, options={"verify_signature": False})
        stranger = SigningKey("k1")  # the same kid, another key: a forged signature
        refused = {
            "expired": issuer.token(key, audience=s.resource, now=now.t - 3600),
            "not yet valid": issuer.token(key, audience=s.resource, now=now.t, nbf=int(now.t) + 600),
            "wrong issuer": issuer.token(key, audience=s.resource, now=now.t, iss="https://evil.example"),
            "wrong audience": issuer.token(key, audience="http://127.0.0.1:1/mcp", now=now.t),
            "no expiry": issuer.token(key, audience=s.resource, now=now.t, exp=None),
            "alg none": _unsigned(claims),
            "hs256 with the public key": jwt.encode(
                claims, public_pem, algorithm="HS256", headers={"kid": "k1"}
            )
            if _hs256_with_pem_possible()
            else _hs256_by_hand(claims, public_pem),
            "forged signature": issuer.token(stranger, audience=s.resource, now=now.t),
            "not a jwt": "abc.def",
            "no principal": issuer.token(key, audience=s.resource, now=now.t, sub=None),
        }
        for why, token in refused.items():
            response = await post_initialize(s.url, token)
            assert response.status_code == 401, why
            assert 'error="invalid_token"' in response.headers["www-authenticate"], why
        # Within the leeway (30 s) an expiry or start is tolerated: clocks differ a little.
        lenient = issuer.token(key, audience=s.resource, now=now.t - 610)
        assert (await post_initialize(s.url, lenient)).status_code == 200


def _hs256_with_pem_possible() -> bool:
    try:
        jwt.encode({"a": 1}, b"-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----", algorithm="HS256")
    except jwt.InvalidKeyError:
        return False
    return True


def _hs256_by_hand(claims: dict[str, Any], secret: bytes) -> str:
    import hashlib
    import hmac

    def enc(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{enc(json.dumps({'alg': 'HS256', 'typ': 'JWT', 'kid': 'k1'}).encode())}.{enc(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{enc(signature)}"


async def test_a_token_without_the_agent_scope_gets_403_insufficient_scope(
    tmp_path: Path, fake: FakeProvider
) -> None:
    now = Now()
    async with issuer_and_server(tmp_path, fake, now) as (issuer, s, _):
        token = issuer.token(issuer.keys[0], audience=s.resource, scope="openid profile", now=now.t)
        response = await post_initialize(s.url, token)
        assert response.status_code == 403
        assert 'error="insufficient_scope"' in response.headers["www-authenticate"]
        operator = issuer.token(issuer.keys[0], audience=s.resource, scope=OPERATOR, now=now.t)
        assert (await post_initialize(s.url, operator)).status_code == 200  # operator implies agent


async def test_a_rotated_key_is_fetched_on_its_new_kid_and_a_removed_key_is_refused(
    tmp_path: Path, fake: FakeProvider
) -> None:
    now = Now()
    async with issuer_and_server(tmp_path, fake, now, min_refresh_seconds=30.0) as (issuer, s, _):
        old = issuer.keys[0]
        assert (
            await post_initialize(s.url, issuer.token(old, audience=s.resource, now=now.t))
        ).status_code == 200
        assert issuer.fetches == 1
        new = SigningKey("k2")
        issuer.keys = [new]  # rotation: k2 published, k1 withdrawn
        now.t += 31
        fresh = issuer.token(new, audience=s.resource, now=now.t)
        assert (await post_initialize(s.url, fresh)).status_code == 200
        assert issuer.fetches == 2
        # k1 is gone from the refreshed set: a token it signed is refused, though unexpired.
        stale = issuer.token(old, audience=s.resource, now=now.t)
        assert (await post_initialize(s.url, stale)).status_code == 401


async def test_unknown_kids_refresh_the_jwks_at_most_once_per_interval(
    tmp_path: Path, fake: FakeProvider
) -> None:
    now = Now()
    async with issuer_and_server(tmp_path, fake, now, min_refresh_seconds=30.0) as (issuer, s, _):
        good = issuer.token(issuer.keys[0], audience=s.resource, now=now.t)
        assert (await post_initialize(s.url, good)).status_code == 200
        for i in range(20):
            bogus = issuer.token(SigningKey(f"nope-{i}"), audience=s.resource, now=now.t)
            assert (await post_initialize(s.url, bogus)).status_code == 401
        assert issuer.fetches == 1  # a flood of unknown kids costs the issuer nothing within 30 s
        now.t += 30
        bogus = issuer.token(SigningKey("nope-late"), audience=s.resource, now=now.t)
        assert (await post_initialize(s.url, bogus)).status_code == 401
        assert issuer.fetches == 2


async def test_a_removed_key_stops_working_when_the_cache_ages_out_even_without_new_kids(
    tmp_path: Path, fake: FakeProvider
) -> None:
    now = Now()
    async with issuer_and_server(tmp_path, fake, now, max_age_seconds=300.0) as (issuer, s, _):
        key = issuer.keys[0]
        assert (
            await post_initialize(s.url, issuer.token(key, audience=s.resource, now=now.t))
        ).status_code == 200
        issuer.keys = []
        now.t += 299
        assert (
            await post_initialize(s.url, issuer.token(key, audience=s.resource, now=now.t))
        ).status_code == 200
        now.t += 2
        assert (
            await post_initialize(s.url, issuer.token(key, audience=s.resource, now=now.t))
        ).status_code == 401
