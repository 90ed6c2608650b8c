"""The listening options every HTTP-serving command shares (`serve --transport http`, `webhooks`, `metrics`)."""

from __future__ import annotations

import argparse

from pollwarden.core.errors import ConfigError
from pollwarden.surface.listening import HttpOptions


def http_options(args: argparse.Namespace, *, verifier_configured: bool = False) -> HttpOptions:
    """The listening options from the shared HTTP flags (`verifier_configured`: bearer tokens guard /mcp)."""
    if not 0 <= args.port <= 65535:
        raise ConfigError(
            f"--port {args.port}: give a TCP port from 0 to 65535 (0: any free port), e.g. 8765"
        )
    if args.max_connections < 1:
        raise ConfigError("--max-connections must be 1 or more")
    if not args.request_timeout > 0:
        raise ConfigError("--request-timeout must be a number of seconds greater than 0, e.g. 10")
    return HttpOptions(
        host=args.host,
        port=args.port,
        allow_non_loopback=bool(args.allow_non_loopback),
        allowed_hosts=tuple(args.allowed_host or ()),
        allowed_origins=tuple(args.allowed_origin or ()),
        max_connections=args.max_connections,
        request_timeout_seconds=args.request_timeout,
        verifier_configured=verifier_configured,
    )


def add_http_arguments(parser: argparse.ArgumentParser, *, default_port: int) -> None:
    """The listening options `serve --transport http` and `webhooks` share."""
    parser.add_argument("--host", default="127.0.0.1", help="HTTP only; loopback by default")
    parser.add_argument("--port", type=int, default=default_port, help=f"HTTP only (default {default_port})")
    parser.add_argument(
        "--allow-non-loopback",
        action="store_true",
        help="HTTP only: allow a --host other than loopback (127.0.0.0/8, ::1); needs --allowed-host",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="HTTP only: a Host header value clients may use (repeatable), e.g. mcp.example.com; any other "
        "Host is refused (DNS-rebinding protection)",
    )
    parser.add_argument(
        "--allowed-origin",
        action="append",
        metavar="ORIGIN",
        help="HTTP only: an Origin browser-based clients may send (repeatable), e.g. https://app.example.com",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=HttpOptions.max_connections,
        help=f"HTTP only: requests beyond this many connections get 503 (default {HttpOptions.max_connections})",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=HttpOptions.request_timeout_seconds,
        metavar="SECONDS",
        help="HTTP only: a connection that has not sent a whole request (headers and body) within this long "
        f"is closed (default {HttpOptions.request_timeout_seconds:g})",
    )
