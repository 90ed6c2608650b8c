"""The operator console as a Starlette app: pages, the one login, and the one decision path.

Who may use it: whoever opened the one-time login URL `pollwarden console`
printed at its terminal (or wrote to an owner-only file, without one). The URL
shows a form; its POST turns the token into a session cookie (``HttpOnly``,
``SameSite=Strict``), the token is spent and the page's script takes it out of
the address bar, so it stays in no history. A session ends at logout or after
``idle_timeout_seconds`` without a person's request (the pages' own refreshes
do not count). Every page lives
under a random path prefix (``/c/<random>/``, in the printed URL) and the
cookie, named for this console, is scoped to that path: a browser does not
send it to another web app on the same host (cookies ignore the port), nor to
another console there. Where it was started with ``--auth-tokens FILE``, an
operator's bearer token (scope ``pollwarden:operator``) is accepted instead of
the cookie (`pollwarden.console.bearer`). Every POST from a cookie session carries
the session's CSRF token; every response carries a Content-Security-Policy
whose only script is the console's own file (``script-src 'self'``: it
refreshes the page in place and shows local times), ``frame-ancestors 'none'``
and ``nosniff``; the Host
header is checked (DNS rebinding). Every value a provider or an agent wrote
is escaped by the templates, put on one line (`pollwarden.core.untrusted`) and
marked as untrusted. Decisions call `pollwarden.flows.operator_decision.decide`,
as ``pollwarden approve``/``deny`` do.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import logging
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
import anyio.to_thread
from jinja2 import Environment
from mcp.server.auth.provider import TokenVerifier
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pollwarden.access.operation_names import resolve_name
from pollwarden.access.operator_keys import METHOD_CONSOLE, METHOD_HTTP_OPERATOR, OperatorKey
from pollwarden.audit.chain import Anchor, AuditError, audit_operation_ids, export_jsonl
from pollwarden.audit.story import render_story
from pollwarden.audit.verify import VerifyResult, describe_mode, verify_chain
from pollwarden.config import ServerConfig, load_provider_tables
from pollwarden.console import bearer, charts, reading, rendering
from pollwarden.console.anchors import read_named_anchor
from pollwarden.core.clock import Clock, SystemClock
from pollwarden.core.records import ApprovalRecord
from pollwarden.core.untrusted import one_line, quoted
from pollwarden.core.vocabulary import Status, StopReason
from pollwarden.flows.approvals import offered_view
from pollwarden.flows.operator_decision import decide
from pollwarden.ops.health import ops_routes
from pollwarden.store import DatabaseLocation, OperationFilter, Store, open_store
from pollwarden.surface.views import budgets, human_duration
from pollwarden_providers.table import ProviderTable

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "REFRESH_HEADER",
    "ConsoleSettings",
    "create_app",
    "host_allowed",
]

log = logging.getLogger("pollwarden.console")

_COOKIE_PREFIX = "pollwarden_console_"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode("ascii")),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
# A request the page's script makes to refresh itself: it shows the page, and is no sign of a person.
REFRESH_HEADER = "x-pollwarden-refresh"
_MAX_SEARCH = 200


@dataclass
class ConsoleSettings:
    """How one console runs: its database, its one login token, and how decisions are authenticated."""

    config: ServerConfig
    login_token: str
    allowed_hosts: tuple[str, ...]
    clock: Clock = field(default_factory=SystemClock)
    key: OperatorKey | None = None
    by: str = "operator"
    audit_key: bytes | None = None
    refresh_seconds: int = 10
    page_size: int = 25
    # A cookie session ends after this long without a request from the person (refreshes do not count).
    idle_timeout_seconds: float = 1800.0
    # Where the Audit page may read anchor files from, by name (None: it reads none).
    anchor_dir: Path | None = None
    tables: Mapping[str, ProviderTable] | None = None
    # The random part of this console's path prefix (and of its cookie's name).
    instance: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    # Operators' bearer tokens (`--auth-tokens FILE`); None: only the login URL's cookie.
    verifier: TokenVerifier | None = None

    @property
    def prefix(self) -> str:
        """Where every page of this console lives: ``/c/<random>`` (no trailing slash)."""
        return f"/c/{self.instance}"

    @property
    def cookie_name(self) -> str:
        """This console's session cookie: its own name, so two consoles never overwrite each other's."""
        return _COOKIE_PREFIX + hashlib.sha256(self.instance.encode()).hexdigest()[:12]

    @property
    def login_path(self) -> str:
        """The path of the one-time login URL (the token goes in its query)."""
        return f"{self.prefix}/login"

    @property
    def decided_by(self) -> str:
        """Who the audit names as deciding: ``operator (console)`` by default."""
        return f"{self.by} (console)"

    @property
    def method(self) -> str:
        """How decisions made here are authenticated (recorded with each)."""
        return self.key.method if self.key is not None else METHOD_CONSOLE

    def decider(self, operator: str | None) -> tuple[str, str]:
        """(who the audit names, how authenticated) for the cookie's person (None) or a bearer's operator."""
        if operator is None:
            return self.decided_by, self.method
        return f"{operator} (console)", self.key.method if self.key is not None else METHOD_HTTP_OPERATOR


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """Whether a Host header names this console: an exact entry, or ``name:*`` for any port of it."""
    host = host.strip().lower()
    for entry in allowed:
        entry = entry.lower()
        if host == entry:
            return True
        if (
            entry.endswith(":*")
            and host.rpartition(":")[0] == entry[:-2]
            and host.rpartition(":")[2].isascii()
            and host.rpartition(":")[2].isdigit()
        ):
            return True
    return False


class _Guard:
    """Security headers on every response; a Host that does not name this console is refused."""

    def __init__(self, app: ASGIApp, allowed_hosts: tuple[str, ...]) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() not in {h for h, _ in _SECURITY_HEADERS}
                ]
                message["headers"] = [*headers, *_SECURITY_HEADERS]
            await send(message)

        headers = dict(scope.get("headers", []))
        host = headers.get(b"host", b"").decode("latin-1")
        if not host_allowed(host, self.allowed_hosts):
            response = PlainTextResponse(
                "this Host is not one the console answers to (DNS-rebinding protection); open the URL it printed",
                status_code=400,
            )
            await response(scope, receive, send_guarded)
            return
        await self.app(scope, receive, send_guarded)


@dataclass
class _Session:
    csrf: str
    last_seen: float
    flashes: list[tuple[bool, str]] = field(default_factory=list[tuple[bool, str]])


@dataclass
class _State:
    settings: ConsoleSettings
    tables: Mapping[str, ProviderTable]
    templates: Environment
    login_token: str | None
    sessions: dict[str, _Session] = field(default_factory=dict[str, _Session])
    store: Store | None = None
    decide_lock: anyio.Lock = field(default_factory=anyio.Lock)

    def the_store(self) -> Store:
        if self.store is None:  # pragma: no cover - the lifespan opens it before any request
            raise RuntimeError("the console's store is not open")
        return self.store


def _session_of(state: _State, request: Request) -> _Session | None:
    """The request's live session; one idle past the timeout is ended here (and the request told so)."""
    cookie = request.cookies.get(state.settings.cookie_name)
    session = state.sessions.get(cookie) if cookie else None
    if session is None or cookie is None:
        return None
    if state.settings.clock.now() - session.last_seen > state.settings.idle_timeout_seconds:
        del state.sessions[cookie]
        request.state.idle_ended = True
        log.info("console: a session ended after %s idle", reading.span(state.settings.idle_timeout_seconds))
        return None
    return session


def _number(text: str | None, default: int = 1) -> int:
    """A page number from a query: digits only, and no bigger than any page could be (huge ones clamp)."""
    text = (text or "").strip()
    if not (text.isascii() and text.isdigit()):  # "²" is a digit to str.isdigit, not to int
        return default
    return int(text[:12])


Handler = Callable[[Request], Awaitable[Response]]


def create_app(settings: ConsoleSettings) -> ASGIApp:
    """The console app for `settings` (opens the store on start-up, closes it on shutdown)."""
    tables = settings.tables if settings.tables is not None else load_provider_tables(settings.config)
    state = _State(settings, tables, rendering.templates(), settings.login_token)
    base = settings.prefix
    database = settings.config.database

    def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        session = _session_of(state, request)
        flashes = list(session.flashes) if session is not None else []
        if session is not None:
            session.flashes.clear()
        operator = _operator_of(request)
        decided_by, method = settings.decider(operator)
        now = settings.clock.now()
        body = state.templates.get_template(name).render(
            csrf=session.csrf if session is not None else "",
            logged_in=session is not None or operator is not None,
            can_log_out=session is not None,
            flashes=flashes,
            base=base,
            path=request.url.path.removeprefix(base) or "/",
            now=rendering.when(now),
            at=now,
            ago=partial(rendering.ago, now=now),
            decided_by=decided_by,
            method=method,
            source_words=charts.DELAY_SOURCE_WORDS,
            source_shapes=charts.legend_shapes(),
            refresh=context.pop("refresh", settings.refresh_seconds),
            **context,
        )
        return HTMLResponse(body, status_code=status_code)

    def needs_login(request: Request, *, offered: str = "", problem: str | None = None) -> HTMLResponse:
        idle = bool(getattr(request.state, "idle_ended", False))
        return page(
            request,
            "login.html",
            status_code=401,
            spent=state.login_token is None,
            offered=offered,
            problem=problem,
            idle=reading.span(settings.idle_timeout_seconds) if idle else None,
            refresh=0,
        )

    def authed(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            operator = await bearer.judge(settings.verifier, request.headers.get("authorization"))
            if isinstance(operator, Response):
                return operator
            session = _session_of(state, request) if operator is None else None
            if operator is None and session is None:
                return needs_login(request)
            if session is not None and request.headers.get(REFRESH_HEADER) is None:
                session.last_seen = settings.clock.now()  # a person asked for this page
            request.state.operator = operator
            return await handler(request)

        return run

    async def login_form(request: Request) -> Response:
        # The form, with the URL's token in it; its POST logs in (the script drops the token from the URL).
        offered = request.query_params.get("token", "")[:200]
        if _session_of(state, request) is not None and not offered:
            return RedirectResponse(f"{base}/", status_code=303)
        return needs_login(request, offered=offered)

    async def login(request: Request) -> Response:
        form = await request.form()
        offered = str(form.get("token", "")).strip()
        expected = state.login_token
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}":
            return PlainTextResponse("refused: a login from another origin; nobody was logged in", 403)
        if expected is None or not offered or not hmac.compare_digest(offered.encode(), expected.encode()):
            log.warning("console: a login with a wrong or spent token was refused")
            return needs_login(request, problem="That token is wrong or already used; nobody was logged in.")
        state.login_token = None  # one time only
        session_id = secrets.token_urlsafe(32)
        state.sessions[session_id] = _Session(csrf=secrets.token_urlsafe(32), last_seen=settings.clock.now())
        response = RedirectResponse(f"{base}/", status_code=303)
        response.set_cookie(
            settings.cookie_name, session_id, httponly=True, samesite="strict", path=f"{base}/"
        )
        log.info("console: logged in")
        return response

    async def logout(request: Request) -> Response:
        cookie = request.cookies.get(settings.cookie_name)
        session = _session_of(state, request)
        if session is None or cookie is None:
            return needs_login(request)
        form = await request.form()
        if refused := _cross_site(request, session, str(form.get("csrf", ""))):
            return refused
        del state.sessions[cookie]
        log.info("console: logged out")
        response = page(request, "logged_out.html", refresh=0)
        response.delete_cookie(settings.cookie_name, path=f"{base}/", httponly=True, samesite="strict")
        return response

    async def open_approvals(now: float) -> dict[str, list[ApprovalRecord]]:
        """Pending approvals a person can still decide, by operation, soonest to expire first."""
        live = [a for a in await state.the_store().list_approvals(status="pending") if a.expires_at > now]
        by_operation: dict[str, list[ApprovalRecord]] = {}
        for approval in sorted(live, key=lambda a: a.expires_at):
            by_operation.setdefault(approval.operation_id, []).append(approval)
        return by_operation

    async def operations(request: Request) -> Response:
        params = request.query_params
        status = params.get("status") or None
        stop_reason = params.get("stop_reason") or None
        provider = params.get("provider") or None
        owner = params.get("owner") or None
        search = (params.get("q") or "").strip()[:_MAX_SEARCH] or None
        if status is not None and status not in set(Status):
            status = None
        if stop_reason is not None and stop_reason not in set(StopReason):
            stop_reason = None
        store = state.the_store()
        now = settings.clock.now()
        listing = await store.operations_page(
            OperationFilter(
                status=status, provider=provider, stop_reason=stop_reason, owner=owner, search=search
            ),
            page=_number(params.get("page")),
            page_size=settings.page_size,
        )
        facets = await store.operation_facets()
        filters = {
            "q": search or "",
            "status": status or "",
            "provider": provider or "",
            "stop_reason": stop_reason or "",
            "owner": owner or "",
        }
        waiting_on_you = await open_approvals(now)
        needs: list[dict[str, Any]] = []
        for operation_id, asked in waiting_on_you.items():
            record = await store.get(operation_id)
            if record is not None:
                needs.append({"record": record, "needs": reading.needs_person(record, asked, now)})
        review = await store.operations_page(
            OperationFilter(stop_reason="awaiting_review", status="escalated"), page=1, page_size=20
        )
        needs += [
            {"record": r, "needs": reading.needs_person(r, [], now)}
            for r in review.records
            if r.operation_id not in waiting_on_you
        ]
        flagged = {item["record"].operation_id for item in needs}
        return page(
            request,
            "operations.html",
            listing=listing,
            filters=filters,
            statuses=[s.value for s in Status],
            stop_reasons=[r.value for r in StopReason],
            providers=sorted(set(facets.providers) | set(state.tables)),
            owners=facets.owners,
            query=urlencode({k: v for k, v in filters.items() if v}),
            status_query=urlencode({k: v for k, v in filters.items() if v and k != "status"}),
            pending=sum(len(a) for a in waiting_on_you.values()),
            needs=needs,
            flagged=flagged,
            next_words=partial(reading.next_check_words, now=now),
            deadline_words=partial(reading.deadline_words, now=now),
        )

    async def operation(request: Request) -> Response:
        operation_id = request.query_params.get("id", "")
        store = state.the_store()
        record = await store.get(operation_id) if operation_id else None
        if record is None and operation_id.isprintable() and operation_id:
            # An id as the agent chose it: the one principal's operation of that id (issue 29). An id with
            # a control character (PostgreSQL refuses a NUL in text) is no operation's: missing.
            found = await anyio.to_thread.run_sync(audit_operation_ids, database, operation_id)
            named = resolve_name(operation_id, found)
            if named.operation_id is not None and named.operation_id != operation_id:
                operation_id = named.operation_id
                record = await store.get(operation_id)
            elif named.ambiguous:
                return page(
                    request, "missing.html", status_code=404, operation_id=operation_id, problem=named.problem
                )
        if record is None:
            return page(request, "missing.html", status_code=404, operation_id=operation_id)
        await store.flush_refusals(operation_id)
        rows = await store.audit_rows(operation_id)
        now = settings.clock.now()
        # The agent's view, by the same rule: no extension shown that the call would refuse (issue 30).
        view = await offered_view(
            store, record, state.tables.get(record.provider), settings.config.caps, now=now
        )
        approvals = await store.list_approvals(operation_id=operation_id)
        live = sorted(
            (a for a in approvals if a.status == "pending" and a.expires_at > now), key=lambda a: a.expires_at
        )
        needs = reading.needs_person(record, live, now)
        return page(
            request,
            "operation.html",
            record=record,
            view=view,
            elapsed=human_duration(now - record.started_at),
            story=render_story(rows),
            chart=charts.timeline(record, rows, now=now),
            approvals=approvals,
            cards=[rendering.approval_card(a, record, now) for a in live],
            needs=needs,
            summary=reading.summary(
                record, needs, now, may_extend="request_extension" in view.allowed_actions
            ),
            budgets=budgets(view),
            next_words=reading.next_check_words(record, now),
            deadline_words=reading.deadline_words(record, now),
        )

    async def approvals(request: Request) -> Response:
        store = state.the_store()
        now = settings.clock.now()
        pending = sorted(await store.list_approvals(status="pending"), key=lambda a: a.expires_at)
        items: list[dict[str, Any]] = []
        expired: list[ApprovalRecord] = []
        for approval in pending:
            if approval.expires_at <= now:  # not decidable any more: no buttons, out of the pending list
                expired.append(approval)
                continue
            items.append(rendering.approval_card(approval, await store.get(approval.operation_id), now))
        decided = [a for a in await store.list_approvals() if a.status != "pending"][:20]
        return page(
            request,
            "approvals.html",
            items=items,
            expired=expired,
            decided=decided,
            expires_words=partial(reading.expires_words, now=now),
        )

    async def decide_post(request: Request) -> Response:
        operator = await bearer.judge(settings.verifier, request.headers.get("authorization"))
        if isinstance(operator, Response):
            return operator
        session = _session_of(state, request) if operator is None else None
        if operator is None and session is None:
            return needs_login(request)
        form = await request.form()
        if session is not None and (refused := _cross_site(request, session, str(form.get("csrf", "")))):
            return refused
        if session is not None:
            session.last_seen = settings.clock.now()
        approval_id = str(form.get("approval_id", ""))
        choice = str(form.get("decision", ""))
        if choice not in ("approve", "deny"):
            return PlainTextResponse("refused: decision must be approve or deny; nothing was decided", 400)
        if operator is not None and await _owns(state.the_store(), approval_id, operator):
            return PlainTextResponse(
                f"refused: approval {one_line(approval_id)} is about an operation {operator} started; another "
                "operator must decide it (nobody approves their own extension or cancel). Nothing was decided",
                status_code=403,
            )
        by = settings.decider(operator)[0]
        async with (
            state.decide_lock
        ):  # a double submit in this console decides once; the store guards the rest
            decision = await decide(
                state.the_store(),
                approval_id,
                approve=choice == "approve",
                by=by,
                at=settings.clock.now(),
                method=METHOD_CONSOLE if operator is None else METHOD_HTTP_OPERATOR,
                key=settings.key,
            )
        log.info("console: %s", decision.message)
        if session is None:  # a bearer client: the outcome itself, no page to come back to
            return PlainTextResponse(decision.message, status_code=200 if decision.ok else 409)
        session.flashes.append((decision.ok, decision.message))
        back = str(form.get("back", ""))
        if back:  # decided on the operation's own page: back there (an operation id, never a URL)
            return RedirectResponse(f"{base}/operation?{urlencode({'id': back})}", status_code=303)
        return RedirectResponse(f"{base}/approvals", status_code=303)

    async def providers(request: Request) -> Response:
        now = settings.clock.now()
        fleet = [name for name, table in state.tables.items() if table.fleet is not None]
        times = await state.the_store().polled_times(fleet, since=now - 3600)
        rows: list[dict[str, Any]] = []
        for name in sorted(state.tables):
            table = state.tables[name]
            chart = None
            if table.fleet is not None:
                chart = charts.pace_chart(
                    times[name], now=now, pace=table.fleet.max_requests_per_second, burst=table.fleet.burst
                )
            rows.append(
                {"name": name, "table": table, "states": rendering.provider_states(table), "chart": chart}
            )
        return page(request, "providers.html", providers=rows)

    async def audit(request: Request) -> Response:
        anchor_name = request.query_params.get("anchor", "").strip()[:255]
        rekeyed = request.query_params.get("rekeyed_at", "").strip()[:20]
        await state.the_store().flush_refusals()
        checked = await anyio.to_thread.run_sync(
            partial(_verify, database, settings.audit_key, settings.anchor_dir, anchor_name, rekeyed)
        )
        return page(
            request,
            "audit.html",
            result=checked.result,
            mode=describe_mode(checked.result) if checked.result is not None else [],
            anchor=checked.anchor,
            anchor_path=anchor_name,
            anchor_dir=settings.anchor_dir,
            rekeyed_at=rekeyed,
            problem=checked.problem,
            refresh=0,  # verifying reads the whole chain: a person asks for it
        )

    async def export(request: Request) -> Response:
        await state.the_store().flush_refusals()
        buffer = io.StringIO()
        await anyio.to_thread.run_sync(export_jsonl, database, buffer)
        return Response(
            buffer.getvalue(),
            media_type="application/x-ndjson",
            headers={"content-disposition": 'attachment; filename="pollwarden-audit.jsonl"'},
        )

    static = resources.files("pollwarden.console").joinpath("static")
    css = static.joinpath("console.css").read_text(encoding="utf-8")
    script = static.joinpath("console.js").read_text(encoding="utf-8")

    async def stylesheet(request: Request) -> Response:
        return Response(css, media_type="text/css")

    async def javascript(request: Request) -> Response:
        return Response(script, media_type="text/javascript")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncGenerator[None]:
        config = settings.config
        async with open_store(
            config.database, audit_key=settings.audit_key, busy_timeout_seconds=config.busy_timeout_seconds
        ) as store:
            state.store = store
            try:
                yield
            finally:
                state.store = None

    pages = [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", authed(operations)),
        Route("/operation", authed(operation)),
        Route("/approvals", authed(approvals)),
        Route("/approvals/decide", decide_post, methods=["POST"]),
        Route("/providers", authed(providers)),
        Route("/audit", authed(audit)),
        Route("/audit/export", authed(export)),
        Route("/console.css", stylesheet),
        Route("/console.js", javascript),
    ]
    # Nothing of the console outside the prefix: a page that guesses paths on this port finds none.
    # Probes and scrapers find /healthz, /readyz and /metrics at their usual paths (Host still checked).
    probes = ops_routes(lambda: state.store, tables, None, clock=settings.clock)
    app = Starlette(routes=[*probes, Mount(base, routes=pages)], lifespan=lifespan)
    return _Guard(app, settings.allowed_hosts)


def _operator_of(request: Request) -> str | None:
    """The bearer operator `authed` found for this request (None: the cookie's person, or nobody)."""
    operator = getattr(request.state, "operator", None)
    return operator if isinstance(operator, str) else None


def _cross_site(request: Request, session: _Session, csrf: str) -> Response | None:
    """A cookie session's POST without its CSRF token, or from another origin: the refusal to send."""
    if not csrf or not hmac.compare_digest(csrf.encode(), session.csrf.encode()):
        return PlainTextResponse(
            "refused: this form has no valid CSRF token (reload the Approvals page and decide there); "
            "nothing was decided",
            status_code=403,
        )
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}":
        return PlainTextResponse("refused: a decision from another origin; nothing was decided", 403)
    return None


async def _owns(store: Store, approval_id: str, operator: str) -> bool:
    """Whether the approval is about an operation `operator` started (the rule `decide_approval` keeps)."""
    approval = await store.get_approval(approval_id)
    record = await store.get(approval.operation_id) if approval is not None else None
    return record is not None and record.owner == operator


@dataclass(frozen=True)
class _Verified:
    result: VerifyResult | None
    anchor: Anchor | None
    problem: str | None


def _verify(
    database: DatabaseLocation, key: bytes | None, anchor_dir: Path | None, anchor_name: str, rekeyed: str
) -> _Verified:
    """Verify the chain, against an anchor file of the anchor directory when one is named (blocking: a thread)."""
    try:
        rekeyed_at = int(rekeyed) if rekeyed else None
    except ValueError:
        return _Verified(None, None, f"rekeyed_at {quoted(rekeyed)} is not a row number")
    try:
        anchor = read_named_anchor(anchor_dir, anchor_name) if anchor_name else None
        return _Verified(verify_chain(database, key, anchor, rekeyed_at=rekeyed_at), anchor, None)
    except AuditError as exc:
        return _Verified(None, None, str(exc))
