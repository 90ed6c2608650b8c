"""Real HTTP for the auth tests: an ASGI app served by uvicorn on 127.0.0.1, a JWKS issuer, bearer clients."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp


@asynccontextmanager
async def serving(app: ASGIApp, port: int) -> AsyncGenerator[None]:
    """Serve `app` on 127.0.0.1:`port` in this event loop until the block ends."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, timeout_graceful_shutdown=2)
    )
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 (uvicorn offers no event to wait on)
                await anyio.sleep(0.01)
        try:
            yield
        finally:
            server.should_exit = True


class Bearer(httpx2.Auth):
    """A token provider for the SDK client's HTTP client: sends the current token on every request."""

    def __init__(self, token: str | None) -> None:
        self.token = token

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response]:
        if self.token is not None:
            request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


@asynccontextmanager
async def bearer_client(url: str, token: str | None, **client_kwargs: Any) -> AsyncGenerator[Client]:
    """The SDK's real client over streamable HTTP, with a bearer token."""
    async with (
        httpx2.AsyncClient(auth=Bearer(token), timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), **client_kwargs) as client,
    ):
        yield client


@dataclass
class SigningKey:
    """An RSA key with a kid, as an issuer would publish it."""

    kid: str
    private: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    def jwk(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        return {**data, "kid": self.kid, "alg": "RS256", "use": "sig"}


@dataclass
class Issuer:
    """A JWKS server on 127.0.0.1 and the tokens it signs; `keys` is what the JWKS publishes now."""

    port: int
    keys: list[SigningKey]
    fetches: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/jwks.json"

    def app(self) -> Starlette:
        async def jwks(_: Request) -> JSONResponse:
            self.fetches += 1
            return JSONResponse({"keys": [k.jwk() for k in self.keys]})

        return Starlette(routes=[Route("/jwks.json", jwks)])

    def token(
        self,
        key: SigningKey,
        *,
        audience: str,
        sub: str | None = "alice",
        scope: str = "pollwarden:agent",
        now: float | None = None,
        **claims: Any,
    ) -> str:
        at = time.time() if now is None else now
        payload: dict[str, Any] = {
            "iss": self.url,
            "aud": audience,
            "sub": sub,
            "scope": scope,
            "iat": int(at),
            "exp": int(at) + 600,
            **claims,
        }
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, key.private, algorithm="RS256", headers={"kid": key.kid})
