"""Signed provider webhooks as wake-up hints: `POST /webhooks/{provider}`.

A webhook can only bring an operation's next allowed status check forward
(to now): it never changes a state, a budget, a deadline or an approval, and
the status request that follows goes through every usual rule (lease, budget,
fleet pace, deadline). Lost, late, duplicated or forged webhooks leave waiting
exactly as it is without them.

Order for one request, each step refusing before the next runs:

1. the provider's table has a `[webhook]` section (else 404), its secret is set (else 503);
2. Host/Origin and Content-Type, as `pollwarden serve --transport http` checks them (421/403/400);
3. the body, read up to the table's `max_body_bytes` (else 413);
4. the signature over the raw bytes, before anything is parsed (else 401, nothing changes):
   Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`, `whsec_` secrets;
   the signature is computed by the `standardwebhooks` library and compared in constant time,
   the timestamp checked against the injected clock within `TOLERANCE_SECONDS`), or GitHub's
   `X-Hub-Signature-256` (HMAC-SHA256 of the body, `hmac.compare_digest`), whose event id is a
   digest of the body (the `X-GitHub-Delivery` header is not signed) and whose signed time is the
   table's `timestamp_field`, refused beyond `TOLERANCE_SECONDS` once the body is read;
5. then the JSON, the event type and the job id. An event type the table does not list, an
   unreadable body or a job no operation tracks is acknowledged (2xx, so the provider stops
   retrying) and counted, not stored;
6. one store transaction: an event id seen before is acknowledged and ignored; otherwise it is
   remembered and the job's waiting operations are woken (`Store.wake`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from pollwarden.core.clock import Clock
from pollwarden.core.errors import StoreError
from pollwarden.core.errors import WebhookRefused as Refused
from pollwarden.core.records import WakeOutcome
from pollwarden.ops import observe
from pollwarden.store import Store
from pollwarden_providers.interpret import BodyError, parse_json_object
from pollwarden_providers.table import ProviderTable
from pollwarden_providers.table_webhook import WebhookSpec
from pollwarden_providers.webhook import MAX_EVENT_TEXT, event_time, read_event

__all__ = [
    "GITHUB_REMEMBER_SECONDS",
    "TOLERANCE_SECONDS",
    "WebhookReceiver",
    "combined_app",
    "github_signature",
    "receiver_app",
    "standard_signature_headers",
    "verify",
]

log = logging.getLogger("pollwarden")

WEBHOOK_PATH = "/webhooks/{provider}"
# A Standard Webhooks timestamp further than this from now (either way) is refused.
TOLERANCE_SECONDS = 300.0
# GitHub signs no timestamp: the digests of its bodies are remembered this long (a replay within it is
# ignored); a table's `timestamp_field` refuses an older event (a later replay) outright.
GITHUB_REMEMBER_SECONDS = 86_400.0


@dataclass(frozen=True)
class Verified:
    """A request whose signature is valid: its event id, and how long ids are remembered."""

    event_id: str
    remember_seconds: float


def _standard_webhook(secret: str) -> Any:
    """The `standardwebhooks` library's signer for `secret` (an optional extra: pollwarden[webhooks])."""
    try:
        from standardwebhooks.webhooks import Webhook
    except ImportError as exc:
        log.error(
            "Standard Webhooks need the standardwebhooks package: from a clone, "
            ".venv/bin/pip install -e '.[webhooks]' (or pip install 'pollwarden[webhooks]')"
        )
        raise Refused(503, "the receiver cannot check Standard Webhooks signatures") from exc
    try:
        return Webhook(secret)
    except Exception as exc:  # the library raises several kinds for a malformed secret
        log.error(
            "the Standard Webhooks signing secret is not a whsec_… (base64) secret: %s", type(exc).__name__
        )
        raise Refused(503, "the receiver's signing secret for this provider is malformed") from exc


def _event_id(value: str | None, header: str) -> str:
    if not value or len(value) > MAX_EVENT_TEXT or not value.isprintable():
        raise Refused(401, f"missing or unusable {header} header")
    return value


def verify(
    spec: WebhookSpec, secret: str, headers: Mapping[str, str], body: bytes, *, now: float
) -> Verified:
    """Check the signature of `body` (raw bytes) under the table's scheme; `Refused` (401) when it fails.

    `headers` must have lower-case names. Nothing in the body is read here.
    """
    if spec.scheme == "github":
        given = headers.get("x-hub-signature-256", "")
        if not hmac.compare_digest(given.encode(), github_signature(secret, body).encode()):
            raise Refused(401, "X-Hub-Signature-256 does not match the body")
        # X-GitHub-Delivery is not signed: anyone holding one delivery could resend it under new ids.
        # The digest of what is signed (the body) is the event's identity.
        return Verified("sha256:" + hashlib.sha256(body).hexdigest(), GITHUB_REMEMBER_SECONDS)
    msg_id = _event_id(headers.get("webhook-id"), "webhook-id")
    raw_timestamp = headers.get("webhook-timestamp", "")
    if not (raw_timestamp.isascii() and raw_timestamp.isdigit()) or len(raw_timestamp) > 12:
        raise Refused(401, "missing or unusable webhook-timestamp header")
    timestamp = int(raw_timestamp)
    if abs(now - timestamp) > TOLERANCE_SECONDS:
        when = "old" if timestamp < now else "far in the future"
        raise Refused(401, f"webhook-timestamp is too {when} (more than {TOLERANCE_SECONDS:g} s from now)")
    try:
        text = body.decode("utf-8")
        expected = _signature_bytes(
            str(
                _standard_webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, UTC), text)
            ).partition(",")[2]
        )
    except (UnicodeDecodeError, ValueError, binascii.Error) as exc:
        raise Refused(401, f"the signature cannot be checked ({type(exc).__name__})") from exc
    if len(expected) != hashlib.sha256().digest_size:  # never compare against an empty expectation
        raise Refused(401, "the signature cannot be checked")
    for candidate in headers.get("webhook-signature", "").split(" "):
        version, _, signature = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(_signature_bytes(signature), expected):
            # Twice the tolerance: a timestamp up to TOLERANCE_SECONDS ahead stays acceptable that long.
            return Verified(msg_id, 2 * TOLERANCE_SECONDS)
    raise Refused(401, "no webhook-signature matches the body")


def _check_event_time(spec: WebhookSpec, body: Mapping[str, object], now: float) -> None:
    """A scheme that signs no timestamp: the signed time the table names must be within the tolerance."""
    if spec.timestamp_field is None:
        return
    when = event_time(spec, body)
    if when is None:
        raise Refused(401, f"no RFC 3339 time at {spec.timestamp_field} in the signed event")
    if abs(now - when) > TOLERANCE_SECONDS:
        old = "old" if when < now else "far in the future"
        raise Refused(
            401, f"{spec.timestamp_field} is too {old} (more than {TOLERANCE_SECONDS:g} s from now): a replay"
        )


def _signature_bytes(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return b""


def github_signature(secret: str, body: bytes) -> str:
    """GitHub's `X-Hub-Signature-256` value for `body`: ``sha256=`` and the hex HMAC-SHA256."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def standard_signature_headers(secret: str, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers a provider sends with `body` (for tests, samples and the benchmark)."""
    signature = str(
        _standard_webhook(secret).sign(event_id, datetime.fromtimestamp(timestamp, UTC), body.decode())
    )
    return {"webhook-id": event_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}


@dataclass
class WebhookReceiver:
    """Receives webhooks for the loaded tables and wakes operations in `store`."""

    tables: Mapping[str, ProviderTable]
    clock: Clock
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    store: Store | None = None  # set once the database is open
    # Requests by what became of them (woken, replayed, unknown_job, bad_signature, …): counted, not stored.
    counts: Counter[str] = field(default_factory=Counter[str])

    def _count(self, result: str) -> None:
        # By the outcome's text (a StrEnum's repr would reach the shutdown log otherwise).
        self.counts[str(result)] += 1
        observe.webhook_event(str(result))

    def _spec(self, provider: str) -> tuple[WebhookSpec, str]:
        table = self.tables.get(provider)
        if table is None or table.webhook is None:
            raise Refused(404, f"no provider table with a [webhook] section is named {provider[:80]!r}")
        secret = self.environ.get(table.webhook.secret_env, "")
        if not secret:
            log.error(
                "webhook for %s refused: %s is not set in the environment", provider, table.webhook.secret_env
            )
            raise Refused(503, "the receiver has no signing secret for this provider")
        return table.webhook, secret

    async def handle(self, provider: str, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        """One webhook request (after the HTTP checks): (HTTP status, what became of it)."""
        spec, secret = self._spec(provider)
        now = self.clock.now()
        verified = verify(spec, secret, headers, body, now=now)
        try:
            parsed = parse_json_object(body)
        except BodyError:
            return 202, "unreadable"
        event = read_event(spec, parsed, headers)
        if event.problem is not None:
            return 202, "unreadable"
        _check_event_time(spec, parsed, now)
        if not event.wakes or event.job_id is None or event.event_type is None:
            return 202, "ignored_event_type"
        if self.store is None:
            raise Refused(503, "the database is not open")
        result = await self.store.wake(
            provider=provider,
            job_id=self.tables[provider].canonical_job_id(event.job_id),  # as operations keep it
            event_id=verified.event_id,
            event_type=event.event_type,
            now=now,
            remember_seconds=verified.remember_seconds,
        )
        if result.outcome == WakeOutcome.WOKEN:
            log.info("webhook %s %s woke %s", provider, event.event_type, ", ".join(result.woken))
        return 200, result.outcome

    async def endpoint(self, request: Request, security: TransportSecurityMiddleware) -> Response:
        """`POST /webhooks/{provider}`: HTTP checks, a bounded body, then `handle`."""
        provider = str(request.path_params.get("provider", ""))
        refusal = await security.validate_request(request, is_post=True)
        if refusal is not None:
            self._count("refused_http")
            return refusal
        try:
            spec, _ = self._spec(provider)
            body = await _read_capped(request, spec.max_body_bytes)
            status, what = await self.handle(
                provider, {k.lower(): v for k, v in request.headers.items()}, body
            )
        except Refused as exc:
            self._count(f"refused_{exc.status}")
            if exc.status == 401:
                log.warning("webhook for %s refused: %s", provider[:80], exc.reason)
            return JSONResponse({"error": exc.reason}, status_code=exc.status)
        except StoreError as exc:
            self._count("store_error")
            log.error("webhook for %s not recorded: %s", provider[:80], exc)
            return JSONResponse({"error": "the database is unavailable; retry later"}, status_code=503)
        self._count(what)
        return JSONResponse({"received": True, "outcome": what}, status_code=status)

    def routes(self, security: TransportSecuritySettings) -> list[BaseRoute]:
        """The webhook route, guarded by `security` (the same Host/Origin rules as the MCP endpoint)."""
        guard = TransportSecurityMiddleware(security)

        async def endpoint(request: Request) -> Response:
            return await self.endpoint(request, guard)

        return [Route(WEBHOOK_PATH, endpoint, methods=["POST"])]


async def _read_capped(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is longer than `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise Refused(413, f"the body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise Refused(413, f"the body is larger than {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise Refused(400, "the client went away before the body arrived") from exc
    return b"".join(chunks)


StoreOpener = Callable[[], AbstractAsyncContextManager[Store]]


def receiver_app(
    receiver: WebhookReceiver,
    security: TransportSecuritySettings,
    open_db: StoreOpener,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """A Starlette app serving only the webhook route (`pollwarden webhooks`), its store open while it runs."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncGenerator[None]:
        async with open_db() as store:
            receiver.store = store
            try:
                yield
            finally:
                receiver.store = None
                log.info("webhooks received: %s", dict(receiver.counts) or "none")

    return Starlette(routes=[*receiver.routes(security), *extra_routes], lifespan=lifespan)


def combined_app(
    mcp_app: Starlette,
    receiver: WebhookReceiver,
    security: TransportSecuritySettings,
    open_db: StoreOpener,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The MCP app with the webhook route beside it (`pollwarden serve --transport http`).

    The receiver opens its own connection to the same database (as another
    server process would); the MCP app's own lifespan runs inside this one.
    """

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncGenerator[None]:
        async with mcp_app.router.lifespan_context(mcp_app), open_db() as store:
            receiver.store = store
            try:
                yield
            finally:
                receiver.store = None
                log.info("webhooks received: %s", dict(receiver.counts) or "none")

    inner: ASGIApp = mcp_app
    return Starlette(
        routes=[*receiver.routes(security), *extra_routes, Mount("/", app=inner)], lifespan=lifespan
    )


def sample_event(body: Mapping[str, Any]) -> bytes:
    """A JSON body as a provider sends it (compact), for tests and samples."""
    return json.dumps(body, separators=(",", ":")).encode()
