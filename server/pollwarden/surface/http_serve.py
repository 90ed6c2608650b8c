"""Serving MCP over streamable HTTP: DNS-rebinding protection always on, slow clients cut off.

The MCP SDK's ``run("streamable-http")`` keeps Host/Origin validation only for
the literal hosts ``127.0.0.1``, ``localhost`` and ``::1`` and turns it off for
any other host, and its uvicorn has no deadline for a request's headers or
body: idle or trickling connections stay open until the client closes them.
So pollwarden builds the SDK's Starlette app itself and runs uvicorn with:

* explicit `TransportSecuritySettings` for every host: the loopback names (all
  of 127.0.0.0/8 and ::1 count as loopback) plus exactly the hosts and origins
  the operator lists (``--allowed-host``, ``--allowed-origin``); beyond
  loopback, an empty list is refused rather than served unprotected;
* ``limit_concurrency`` (a request beyond it gets 503 at once),
  ``timeout_keep_alive`` for idle kept-alive connections, and a bounded header
  size (``h11_max_incomplete_event_size``);
* `GuardedH11Protocol`: a connection must deliver each request's headers and
  body within ``request_timeout_seconds`` of opening (or of its previous
  response), or it is closed. A response may stream as long as it needs (a
  ``check_status`` waits up to 50 s); only receiving a request is bounded.

A protocol subclass is used because uvicorn has no header or body deadline of
its own, and an ASGI middleware only runs once the headers are complete.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from pollwarden.core.errors import ConfigError
from pollwarden.surface.listening import HttpOptions, is_loopback

__all__ = [
    "GuardedH11Protocol",
    "HttpOptions",
    "is_loopback",
    "run_http",
    "serve_app",
    "transport_security",
]

log = logging.getLogger("pollwarden")

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def _host_header(host: str) -> str:
    """How `host` appears in a Host header (an IPv6 literal in brackets)."""
    bare = host.strip("[]")
    return f"[{bare}]" if ":" in bare else bare


def _allowed_host_forms(entry: str) -> list[str]:
    """``name`` allows the bare name and any port; ``name:port`` or ``name:*`` is taken as given."""
    text = entry.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ("" if not rest else None)
    elif text.count(":") <= 1:
        host, _, port = text.partition(":")
        port = port if ":" in text else ""
    else:
        host, port = "", None
    if (
        not host
        or port is None
        or any(ch in host for ch in "/*@ \t")
        or not (port in ("", "*") or (port.isascii() and port.isdigit()))
    ):
        raise ConfigError(
            f"--allowed-host {entry!r}: give a host name as clients send it in the Host header, such as "
            "mcp.example.com, mcp.example.com:8443 or [2001:db8::1] (no scheme, path or wildcard host)"
        )
    return [text] if port else [text, f"{text}:*"]


def _allowed_origin(entry: str) -> str:
    parts = urlsplit(entry.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise ConfigError(
            f"--allowed-origin {entry!r}: give an origin as a browser sends it, such as https://app.example.com "
            "(scheme and host, optional port, no path)"
        )
    return f"{parts.scheme}://{parts.netloc}"


def transport_security(options: HttpOptions) -> TransportSecuritySettings:
    """Host/Origin validation for `options`: always on, with exactly the names that may reach the server.

    Refuses (`ConfigError`) a non-loopback host without ``allow_non_loopback``,
    one without any ``allowed_hosts`` (the SDK would otherwise serve it with
    the protection off), and one without a bearer-token verifier.
    """
    loopback = is_loopback(options.host)
    if not loopback and not options.allow_non_loopback:
        raise ConfigError(
            f"--host {options.host} is not a loopback address: anyone who can reach the port may call the tools. "
            "Serve on 127.0.0.1 behind an authenticating proxy, or pass --allow-non-loopback with "
            "--allowed-host NAME for each name clients use (DNS-rebinding protection stays on)"
        )
    if not loopback and not options.allowed_hosts:
        raise ConfigError(
            "--allow-non-loopback needs the names clients use to reach this server: --allowed-host NAME "
            "(repeatable; as in the Host header, e.g. mcp.example.com), and --allowed-origin https://… for "
            "browser-based clients. Host and Origin are still checked beyond loopback"
        )
    hosts: list[str] = []
    origins: list[str] = []
    if loopback:
        names = [*_LOOPBACK_HOSTS, _host_header(options.host)]
        for name in dict.fromkeys(names):
            hosts += [name, f"{name}:*"]
            origins += [f"http://{name}", f"http://{name}:*"]
    for entry in options.allowed_hosts:
        hosts += _allowed_host_forms(entry)
    origins += [_allowed_origin(entry) for entry in options.allowed_origins]
    if not loopback and not options.verifier_configured:
        raise ConfigError(
            "--allow-non-loopback needs a bearer-token verifier, or anyone who reaches the port spends the "
            "server's provider credentials: pass --auth-tokens FILE (from `pollwarden tokens add`) or "
            "--jwt-issuer URL, and --resource-url https://NAME/mcp (see docs/http.md)"
        )
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=list(dict.fromkeys(hosts)),
        allowed_origins=list(dict.fromkeys(origins)),
    )


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for receiving each request (headers and body).

    The deadline starts when the connection opens and again when a response
    completes; it stops once a request has fully arrived. A connection still
    receiving a request when it passes is closed (an application waiting for
    the body sees a disconnect).
    """

    request_timeout_seconds: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:
        """Start the deadline for the first request."""
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def _receiving(self) -> bool:
        cycle: Any = self.cycle
        return cycle is None or bool(cycle.response_complete) or bool(cycle.more_body)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_seconds, self._too_slow)

    def _disarm(self) -> None:
        deadline = getattr(self, "_deadline", None)
        if deadline is not None:
            deadline.cancel()
            self._deadline = None

    def handle_events(self) -> None:
        """Process what arrived; once a whole request is in, its deadline no longer applies."""
        super().handle_events()
        if not self._receiving():
            self._disarm()

    def on_response_complete(self) -> None:
        """After a response, the next request (if any) must arrive in time too."""
        super().on_response_complete()
        if not self.transport.is_closing() and self._receiving():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the deadline with the connection."""
        self._disarm()
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not self._receiving():
            return
        client = self.client
        log.warning(
            "closed a connection from %s: no complete request within %g s",
            f"{client[0]}:{client[1]}" if client else "an unknown client",
            self.request_timeout_seconds,
        )
        self.transport.close()


def run_http(
    server: MCPServer[Any],
    options: HttpOptions,
    *,
    wrap: Callable[[Starlette, TransportSecuritySettings], ASGIApp] | None = None,
) -> None:
    """Serve `server` at ``/mcp`` on `options.host`:`options.port` until interrupted.

    `wrap` may put more routes beside the MCP app (the webhook receiver), under the same security settings.
    """
    security = transport_security(options)
    app = server.streamable_http_app(transport_security=security, host=options.host)
    serve_app(app if wrap is None else wrap(app, security), options, security)


def serve_app(app: ASGIApp, options: HttpOptions, security: TransportSecuritySettings) -> None:
    """Run `app` under uvicorn with the connection limits and request deadline of `options`."""
    protocol = type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"request_timeout_seconds": options.request_timeout_seconds},
    )
    config = uvicorn.Config(
        app,
        host=options.host.strip("[]"),
        port=options.port,
        http=protocol,
        limit_concurrency=options.max_connections,
        timeout_keep_alive=options.keep_alive_seconds,
        h11_max_incomplete_event_size=options.max_header_bytes,
        timeout_graceful_shutdown=5,
        log_config=None,  # pollwarden's one-line log formatter, not uvicorn's own
    )
    log.info(
        "HTTP: Host/Origin checked against %s; at most %d connections; a request must arrive within %g s",
        ", ".join(security.allowed_hosts),
        options.max_connections,
        options.request_timeout_seconds,
    )
    uvicorn.Server(config).run()
