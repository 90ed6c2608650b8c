"""`pollwarden webhooks`: the webhook receiver alone (for stdio deployments), and its wiring into `serve`."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from pollwarden.audit.chain import audit_key_from_env
from pollwarden.cli.http_options import add_http_arguments, http_options
from pollwarden.cli.options import add_database_options, require_existing_database, with_examples
from pollwarden.config import ServerConfig, load_config, load_provider_tables
from pollwarden.core.clock import SystemClock
from pollwarden.ops.metrics import (
    DEFAULT_METRICS,
    MetricsOptions,
    add_metrics_arguments,
    metrics_options_from,
)
from pollwarden.store import Store, open_store
from pollwarden_providers.table import ProviderTable

if TYPE_CHECKING:  # the HTTP stack is imported by the commands that serve, not by every CLI call
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.applications import Starlette
    from starlette.types import ASGIApp

    from pollwarden.provider_io.webhooks import StoreOpener

__all__ = ["add_webhook_commands", "serve_wrapper", "store_opener"]

log = logging.getLogger("pollwarden")

DEFAULT_WEBHOOK_PORT = 8001


def store_opener(config: ServerConfig, environ: Mapping[str, str] = os.environ) -> StoreOpener:
    """Opens the configured database for the receiver (its own connection, like another server process)."""

    def opener() -> AbstractAsyncContextManager[Store]:
        return open_store(
            config.database,
            audit_key=audit_key_from_env(environ),
            busy_timeout_seconds=config.busy_timeout_seconds,
        )

    return opener


def _with_webhooks(tables: Mapping[str, ProviderTable]) -> list[str]:
    return sorted(name for name, table in tables.items() if table.webhook is not None)


def warn_without_standard_webhooks(tables: Mapping[str, ProviderTable]) -> None:
    """Say at start-up which tables' webhooks will get 503 because the [webhooks] extra is missing."""
    needing = sorted(
        name
        for name, table in tables.items()
        if table.webhook is not None and table.webhook.scheme == "standard"
    )
    if not needing or importlib.util.find_spec("standardwebhooks") is not None:
        return
    log.warning(
        "webhooks for %s use Standard Webhooks signatures, but the standardwebhooks package is missing: "
        "they will be answered 503. Install the extra (from a clone: .venv/bin/pip install -e '.[webhooks]')",
        ", ".join(needing),
    )


def serve_wrapper(
    config: ServerConfig,
    tables: Mapping[str, ProviderTable],
    metrics_options: MetricsOptions = DEFAULT_METRICS,
) -> Callable[[Starlette, TransportSecuritySettings], ASGIApp]:
    """For `serve --transport http`: put `POST /webhooks/{provider}`, /healthz, /readyz and /metrics beside `/mcp`."""

    def wrap(mcp_app: Starlette, security: TransportSecuritySettings) -> ASGIApp:
        from pollwarden.ops.health import ops_routes
        from pollwarden.provider_io.webhooks import WebhookReceiver, combined_app

        receiver = WebhookReceiver(tables=tables, clock=SystemClock())
        log.info("webhooks: POST /webhooks/{provider} for %s", ", ".join(_with_webhooks(tables)) or "(none)")
        warn_without_standard_webhooks(tables)
        ops = ops_routes(lambda: receiver.store, tables, security, options=metrics_options)
        return combined_app(mcp_app, receiver, security, store_opener(config), ops)

    return wrap


def cmd_webhooks(args: argparse.Namespace) -> int:
    """Run the webhook receiver alone on the shared database."""
    from pollwarden.ops.health import ops_routes
    from pollwarden.provider_io.webhooks import WebhookReceiver, receiver_app
    from pollwarden.surface.http_serve import serve_app, transport_security

    # The receiver serves no tools: each webhook is verified by its provider's signature.
    options = http_options(args, verifier_configured=True)
    security = transport_security(options)  # refuses a non-loopback host without names, first
    config = load_config(db=args.db, providers=args.providers or [], busy_timeout=args.busy_timeout)
    # An operator command never creates a database: `--db typo.db` would answer unknown_job to every
    # signed event. The servers (`serve`) create it; the receiver only wakes what they recorded.
    require_existing_database(config.database)
    tables = load_provider_tables(config)
    warn_without_standard_webhooks(tables)
    receiver = WebhookReceiver(tables=tables, clock=SystemClock())
    ops = ops_routes(lambda: receiver.store, tables, security, options=metrics_options_from(args))
    app = receiver_app(receiver, security, store_opener(config), ops)
    log.info(
        "pollwarden webhooks on %s:%d for %s, database %s",
        options.host,
        options.port,
        ", ".join(_with_webhooks(tables)) or "(no table has [webhook])",
        config.database,
    )
    serve_app(app, options, security)
    return 0


def add_webhook_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """Register `pollwarden webhooks`."""

    parser = sub.add_parser(
        "webhooks",
        help="receive signed provider webhooks (POST /webhooks/PROVIDER) and wake waiting operations",
        description="Serve only POST /webhooks/PROVIDER on the shared database, for deployments whose "
        "MCP servers run over stdio. A webhook only brings the next status check forward.",
    )
    add_database_options(parser)
    parser.add_argument(
        "--providers",
        action="append",
        metavar="DIR",
        help="a directory of provider *.toml tables, added to the shipped ones; repeatable",
    )
    add_http_arguments(parser, default_port=DEFAULT_WEBHOOK_PORT)
    add_metrics_arguments(parser)
    with_examples(
        parser,
        "OPENAI_WEBHOOK_SECRET=whsec_... pollwarden webhooks --port 8001 --db ~/pollwarden/pollwarden.db",
        "pollwarden webhooks --host 0.0.0.0 --allow-non-loopback --allowed-host hooks.example.com",
    )
    parser.set_defaults(func=cmd_webhooks)
