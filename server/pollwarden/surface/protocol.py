"""The MCP protocol surface beyond the tools: what is advertised is what is served.

- No `prompts` capability (pollwarden has none): `prompts/*` answer "method not found".
- Resource subscriptions in both eras: `subscriptions/listen` (2026-07-28) and
  `resources/subscribe` / `resources/unsubscribe` (2025-11-25), fed by the
  watcher in `watch`.
- No JSON-RPC error with code 0: anything a handler raises that is not an
  MCP error is answered as an internal error (-32603) and logged here.
- Streamable HTTP resumption (each session's events apart) is `event_store`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, cast

import anyio
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    EmptyResult,
    SubscribeRequestParams,
    UnsubscribeRequestParams,
)
from pydantic import ValidationError

from pollwarden.access.principals import current_principal
from pollwarden.surface.watch import Reader, Subscriptions, parse_uri

log = logging.getLogger("pollwarden")

# Methods of a capability pollwarden does not have (it has no prompts).
UNSERVED_METHODS = frozenset({"prompts/list", "prompts/get"})
# Results that carry the server's capabilities.
CAPABILITY_RESULTS = frozenset({"initialize", "server/discover"})

ReaderOf = Callable[[object], Reader | None]
# The URI the watcher follows for the caller's URI (`ownership.watched_uri` for the current principal).
UriFor = Callable[[str], str]


def _same(uri: str) -> str:
    return uri


def honest_capabilities(result: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an initialize / discover result without capabilities pollwarden does not serve."""
    out = dict(result)
    capabilities = out.get("capabilities")
    if isinstance(capabilities, Mapping):
        out["capabilities"] = {
            k: v for k, v in cast(Mapping[str, Any], capabilities).items() if k != "prompts"
        }
    return out


async def surface_middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Advertise only what is served; never answer an error with JSON-RPC code 0."""
    if ctx.request_id is not None and ctx.method in UNSERVED_METHODS:
        raise MCPError(code=METHOD_NOT_FOUND, message="Method not found", data=ctx.method)
    try:
        result = await call_next(ctx)
    except (MCPError, ValidationError):
        raise
    except Exception as exc:
        # The SDK would answer code 0 with the exception's own text on the 2025-11-25 wire.
        log.error("%s failed unexpectedly", ctx.method, exc_info=exc)
        raise MCPError(
            code=INTERNAL_ERROR, message=f"{ctx.method} failed inside pollwarden; see the server's log"
        ) from None
    if ctx.method in CAPABILITY_RESULTS and isinstance(result, Mapping):
        return honest_capabilities(cast(Mapping[str, Any], result))
    return result


def _listened_uris(params: Mapping[str, Any] | None) -> list[str]:
    notifications = (params or {}).get("notifications")
    if not isinstance(notifications, Mapping):
        return []
    uris = cast(Mapping[str, Any], notifications).get("resourceSubscriptions")
    if not isinstance(uris, list):
        return []
    return [u for u in cast(list[object], uris) if isinstance(u, str) and parse_uri(u) is not None]


def _with_uris(params: Mapping[str, Any], uri_for: UriFor) -> dict[str, Any]:
    """`params` with each listened resource URI replaced by the one the watcher follows."""
    notifications = dict(cast(Mapping[str, Any], params["notifications"]))
    notifications["resourceSubscriptions"] = [
        uri_for(u) if isinstance(u, str) else u
        for u in cast(list[object], notifications["resourceSubscriptions"])
    ]
    return {**params, "notifications": notifications}


def listen_middleware(subscriptions: Subscriptions, reader_of: ReaderOf, uri_for: UriFor = _same) -> Any:
    """Watch the pollwarden URIs of each `subscriptions/listen` stream for as long as it is open."""

    async def middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "subscriptions/listen" or ctx.request_id is None:
            return await call_next(ctx)
        if _listened_uris(ctx.params) and ctx.params is not None:
            # The SDK delivers the updates named by the (rewritten) URIs: the caller's own operations only.
            ctx = replace(ctx, params=_with_uris(ctx.params, uri_for))
        uris = _listened_uris(ctx.params)
        reader = reader_of(ctx.lifespan_context)
        if not uris or reader is None:
            return await call_next(ctx)
        for uri in uris:
            await _known(reader, uri, uri)
        principal = current_principal().name
        subscriptions.forget_gone()
        if (why := subscriptions.refusal(principal, None, uris)) is not None:
            raise MCPError(code=INTERNAL_ERROR, message=why)
        subscriptions.listen(uris, principal)
        try:
            await subscriptions.baseline(reader, uris)
            return await call_next(ctx)
        finally:
            subscriptions.unlisten(uris, principal)

    return middleware


def subscribe_handlers(
    subscriptions: Subscriptions, reader_of: ReaderOf, uri_for: UriFor = _same
) -> tuple[Any, Any]:
    """The 2025-11-25 `resources/subscribe` and `resources/unsubscribe` handlers."""

    def watched_uri(uri: str) -> str:
        if parse_uri(uri) is None:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"cannot subscribe to {uri!r}: pollwarden serves pollwarden://operations/{{operation_id}} "
                "and pollwarden://operations/{operation_id}/audit",
            )
        return uri

    async def subscribe(ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams) -> EmptyResult:
        asked = watched_uri(str(params.uri))
        uri = uri_for(asked)
        reader = reader_of(ctx.lifespan_context)
        if reader is None:
            raise MCPError(code=INTERNAL_ERROR, message="the database is unavailable; see the server's log")
        await _known(reader, uri, asked)
        session = ctx.session
        key = session_key(ctx)
        principal = current_principal().name
        subscriptions.forget_gone()
        if (why := subscriptions.refusal(principal, key, [uri])) is not None:
            raise MCPError(code=INTERNAL_ERROR, message=why)
        # The connection (the SDK's session object is per request) is held weakly: when it ends, its
        # subscriptions are dropped, whether or not the client unsubscribed.
        connection = cast(Connection | None, getattr(session, "_connection", None))
        weak = weakref.ref(connection) if isinstance(connection, Connection) else None
        if connection is not None and key not in subscriptions.by_session:
            weakref.finalize(connection, subscriptions.gone.append, key)

        fallback = session if weak is None else None  # never the session beside the weak reference

        def held() -> Connection | ServerSession | None:
            return fallback if weak is None else weak()

        async def notify(changed: str) -> bool:
            alive = held()
            if alive is None:
                return False
            try:
                await alive.send_resource_updated(asked if changed == uri else changed)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, MCPError):
                return False
            return True

        subscriptions.subscribe(uri, key, notify, principal)
        await subscriptions.baseline(reader, [uri])
        return EmptyResult()

    async def unsubscribe(
        ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        subscriptions.unsubscribe(uri_for(watched_uri(str(params.uri))), session_key(ctx))
        return EmptyResult()

    return subscribe, unsubscribe


async def _known(reader: Reader, uri: str, asked: str) -> None:
    """Refuse a subscription to an operation nobody (or only another principal) has: answered as unknown."""
    watched = parse_uri(uri)
    shown = parse_uri(asked)
    if watched is not None and await reader.get(watched.operation_id) is None:
        name = shown.operation_id if shown is not None else asked
        raise MCPError(
            code=INVALID_PARAMS,
            message=f"cannot subscribe to {asked!r}: no operation {name!r}; start it first (list_operations "
            "shows yours)",
        )


def session_key(ctx: ServerRequestContext[Any, Any]) -> object:
    """One key per client connection: the SDK builds a session object per request, but the
    connection's initialize parameters are one object for as long as the connection lives."""
    params = ctx.session.client_params
    return id(params) if params is not None else id(ctx.session)
