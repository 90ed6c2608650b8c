"""``pollwarden metrics``: /metrics, /healthz and /readyz for deployments whose MCP servers run over stdio.

Stdio servers have no HTTP port; this small server reads the shared database
at each scrape (every process's work counted once) and never creates one.
Each process's own instruments stay in that process: over stdio only the
database's numbers (and this process's) are scraped.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

from pollwarden.cli.http_options import add_http_arguments, http_options
from pollwarden.cli.options import add_database_options, require_existing_database, with_examples
from pollwarden.cli.webhooks import store_opener
from pollwarden.config import load_config, load_provider_tables
from pollwarden.ops.metrics import add_metrics_arguments, metrics_options_from, require_metrics
from pollwarden.store import Store

__all__ = ["DEFAULT_METRICS_PORT", "add_metrics_command"]

log = logging.getLogger("pollwarden")

DEFAULT_METRICS_PORT = 9464  # the port OpenTelemetry's Prometheus exporter uses by convention


def cmd_metrics(args: argparse.Namespace) -> int:
    """Serve /metrics, /healthz and /readyz on the shared database until interrupted."""
    # The HTTP stack is imported by the commands that serve, not by every CLI call.
    from starlette.applications import Starlette

    from pollwarden.ops.health import ops_routes
    from pollwarden.surface.http_serve import serve_app, transport_security

    require_metrics()
    options = http_options(args, verifier_configured=True)  # no tools here: nothing to spend
    security = transport_security(options)
    config = load_config(db=args.db, providers=args.providers or [], busy_timeout=args.busy_timeout)
    require_existing_database(config.database)  # an operator command never creates a database
    tables = load_provider_tables(config)
    opened: list[Store] = []
    open_db = store_opener(config)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncGenerator[None]:
        async with open_db() as store:
            opened.append(store)
            try:
                yield
            finally:
                opened.clear()

    routes = ops_routes(
        lambda: opened[0] if opened else None, tables, security, options=metrics_options_from(args)
    )
    log.info(
        "pollwarden metrics on http://%s:%d/metrics, database %s", options.host, options.port, config.database
    )
    serve_app(Starlette(routes=routes, lifespan=lifespan), options, security)
    return 0


def add_metrics_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """Register ``pollwarden metrics``."""

    parser = sub.add_parser(
        "metrics",
        help="serve Prometheus /metrics (and /healthz, /readyz) from the shared database",
        description="For stdio deployments: serve /metrics, /healthz and /readyz read from the shared "
        "database (never created here). HTTP servers (`serve --transport http`, `webhooks`, `console`) "
        "serve the same paths themselves.",
    )
    add_database_options(parser)
    parser.add_argument(
        "--providers",
        action="append",
        metavar="DIR",
        help="a directory of provider *.toml tables, as given to `serve` (/readyz needs them loaded)",
    )
    add_http_arguments(parser, default_port=DEFAULT_METRICS_PORT)
    add_metrics_arguments(parser)
    with_examples(
        parser,
        "pollwarden metrics --port 9464 --db ~/.local/share/pollwarden/pollwarden.db",
        "curl -s http://127.0.0.1:9464/metrics | grep pollwarden_approvals_pending",
    )
    parser.set_defaults(func=cmd_metrics)
