"""``/healthz``, ``/readyz`` and ``/metrics`` beside whatever an HTTP server of pollwarden serves.

``/healthz`` answers 200 while the process serves requests. ``/readyz`` answers
200 only while the database is reachable and migrated (the SQLite file still
the one opened, the PostgreSQL schema present and current) and provider tables
are loaded; otherwise 503 with the reason. ``/metrics`` is the Prometheus text
exposition (`pollwarden.ops.metrics`; 404 naming the extra without it). All three
are GETs checked against the server's Host/Origin rules like its other routes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from pollwarden.core.clock import Clock, SystemClock
from pollwarden.ops.metrics import CONTENT_TYPE, DEFAULT_METRICS, INSTALL_HINT, MetricsOptions, exposition
from pollwarden.ops.observe import metrics_available
from pollwarden.store import Store
from pollwarden_providers.table import ProviderTable

__all__ = ["HEALTH_PATHS", "ops_routes", "readiness"]

HEALTH_PATHS = ("/healthz", "/readyz", "/metrics")

StoreGetter = Callable[[], Store | None]


async def readiness(store: Store | None, tables: Mapping[str, ProviderTable]) -> str | None:
    """Why this server is not ready to serve (database, tables), or None."""
    if store is None:
        return "the database is not open"
    problem = await store.not_ready()
    if problem is not None:
        return problem
    if not tables:
        return "no provider table is loaded"
    return None


def ops_routes(
    store: StoreGetter,
    tables: Mapping[str, ProviderTable],
    security: TransportSecuritySettings | None,
    *,
    clock: Clock | None = None,
    options: MetricsOptions = DEFAULT_METRICS,
) -> list[BaseRoute]:
    """The three routes, reading the database through `store()` (None while it is not open)."""
    guard = TransportSecurityMiddleware(security) if security is not None else None
    now = (clock or SystemClock()).now

    async def refused(request: Request) -> Response | None:
        return None if guard is None else await guard.validate_request(request, is_post=False)

    async def healthz(request: Request) -> Response:
        return await refused(request) or JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if (refusal := await refused(request)) is not None:
            return refusal
        problem = await readiness(store(), tables)
        if problem is not None:
            return JSONResponse({"status": "not_ready", "reason": problem}, status_code=503)
        return JSONResponse({"status": "ready", "tables": len(tables)})

    async def metrics(request: Request) -> Response:
        if (refusal := await refused(request)) is not None:
            return refusal
        if not metrics_available():
            return PlainTextResponse(
                f"metrics need the optional extra [metrics]: {INSTALL_HINT}\n", status_code=404
            )
        body = await exposition(store(), now=now(), options=options)
        return Response(body, media_type=CONTENT_TYPE)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
