"""How an HTTP server of pollwarden listens (`HttpOptions`) and whether a host is loopback.

Apart from `http_serve` so the CLI can build its parser and read its options
without importing the HTTP stack (uvicorn, Starlette, the MCP server): only the
commands that serve import that.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = ["HttpOptions", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True for ``localhost``, any address in 127.0.0.0/8 and ``::1`` (brackets allowed)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class HttpOptions:
    """How ``pollwarden serve --transport http`` listens and whom it answers."""

    host: str = "127.0.0.1"
    port: int = 8000
    allow_non_loopback: bool = False
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_connections: int = 64
    request_timeout_seconds: float = 10.0
    keep_alive_seconds: int = 5
    max_header_bytes: int = 16 * 1024
    verifier_configured: bool = False  # a bearer-token verifier guards /mcp (needed beyond loopback)
