"""A scriptable fake job provider for the tests and the benchmarks.

It speaks the shape of the shipped example provider table (providers/pollwarden_providers/examples/example-export.toml):
``POST /v1/jobs`` submits, ``GET /v1/jobs/{job_id}`` answers a status request,
``POST /v1/jobs/{job_id}/cancel`` cancels. A job id of several parts spans
several segments (``GET /v1/jobs/octo/hello/42`` is job ``octo/hello/42``). Every answer comes from a script of
`Step`s, and every request is written to a log that tests read to prove what
pollwarden actually sent (headers, paths, timing, overlap).

In-process use::

    with running_fake_provider() as fake:
        fake.script("job_0001", [pending("queued"), pending(), succeeded()])
        ...  # point a provider table's base_url at fake.base_url
        assert fake.max_in_flight("job_0001") == 1

From another process: ``python -m tests.support.fake_provider --port N`` prints the
base URL to stderr; drive it with ``POST /_control/script``, ``GET /_control/log``
and ``POST /_control/reset``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import socket
import sys
import threading
import time
import zlib
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, Final, Literal, Self, TypedDict, cast
from urllib.parse import unquote

import anyio
import anyio.abc
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

__all__ = [
    "ConnectionDropped",
    "FakeProvider",
    "RequestLogEntry",
    "Step",
    "drop_connection",
    "failed",
    "http",
    "main",
    "pending",
    "running_fake_provider",
    "serve_fake_provider",
    "succeeded",
]

HOST: Final = "127.0.0.1"
IDEMPOTENCY_HEADER: Final = "idempotency-key"
JOB_ID_PLACEHOLDER: Final = "{job_id}"
BODY_LOG_LIMIT: Final = 10 * 1024
DEFAULT_RESULT_URL: Final = "https://files.example/{job_id}.csv"

_STARTUP_TIMEOUT_SECONDS: Final = 10.0
_SHUTDOWN_TIMEOUT_SECONDS: Final = 5.0
# Small enough that a trickled body visibly drips, large enough to keep the
# number of event-loop wakeups per second bounded.
_TRICKLE_TICK_SECONDS: Final = 0.05
_EXCHANGE_SCOPE_KEY: Final = "pollwarden.fake_provider.exchange"
_ALL_METHODS: Final = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

RouteKind = Literal["status", "submit", "cancel", "unknown", "control_script", "control_log", "control_reset"]
ScriptKind = Literal["status", "cancel", "submit", "new_jobs"]


class Step(BaseModel):
    """One scripted answer.

    ``body`` is sent as JSON; ``raw_body`` (base64 in JSON) or ``raw_body_text``
    is sent byte for byte. ``{job_id}`` in body strings, ``raw_body_text`` and
    header values is replaced by the job id (``raw_body`` is left untouched so
    invalid bytes stay invalid). ``body=None`` with no raw body means an empty body.
    """

    # Frozen so a script shared between jobs or threads cannot be edited under
    # a request that is using it; base64 so arbitrary bytes survive the
    # JSON control endpoint.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")

    # Up to 999: h11 sends any three-digit final status, and real proxies do answer with odd ones.
    status: int = Field(default=200, ge=200, le=999)
    body: Any = None
    raw_body: bytes | None = None
    raw_body_text: str | None = None
    headers: dict[str, str] = Field(default_factory=dict[str, str])
    gzip_bomb_bytes: int = Field(default=0, ge=0)
    trickle_bytes_per_second: float = Field(default=0.0, ge=0.0)
    trickle_total_bytes: int = Field(default=0, ge=0)
    delay_seconds: float = Field(default=0.0, ge=0.0)
    close_connection: bool = False

    @model_validator(mode="after")
    def _one_body_source(self) -> Self:
        sources = [
            self.body is not None,
            self.raw_body is not None,
            self.raw_body_text is not None,
            self.gzip_bomb_bytes > 0,
        ]
        if sum(sources) > 1:
            raise ValueError("give at most one of body, raw_body, raw_body_text, gzip_bomb_bytes")
        try:
            # Fail when scripting, not later as a 500 in the server thread.
            json.dumps(self.body)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"body is not JSON-serialisable: {exc}") from exc
        return self

    def replace(self, **changes: Any) -> Step:
        """A validated copy with some fields changed (``pending().replace(delay_seconds=1)``)."""
        return Step.model_validate({**self.model_dump(), **changes})


def pending(state: str = "running", **extra: Any) -> Step:
    """A 200 whose body says the job is still ``state``; ``extra`` adds body fields."""
    return Step(body={"state": state, **extra})


def succeeded(**fields: Any) -> Step:
    """A 200 saying ``succeeded`` with a result URL; ``fields`` override or add body fields.

    For "succeeded without result_url" use ``pending("succeeded")``.
    """
    return Step(body={"state": "succeeded", "result_url": DEFAULT_RESULT_URL, **fields})


def failed(error: Any = "job failed", **extra: Any) -> Step:
    """A 200 saying the job reached the terminal ``failed`` state with ``error``."""
    return Step(body={"state": "failed", "error": error, **extra})


def http(status: int, headers: Mapping[str, str] | None = None, body: Any = None, **step_fields: Any) -> Step:
    """Any HTTP answer, e.g. ``http(503, headers={"Retry-After": "2"})``."""
    return Step(status=status, headers=dict(headers or {}), body=body, **step_fields)


def drop_connection() -> Step:
    """Close the connection without sending a single byte of response."""
    return Step(close_connection=True)


_DEFAULT_SUBMIT_STEP: Final = http(
    202, headers={"Location": "/v1/jobs/{job_id}"}, body={"id": "{job_id}", "state": "queued"}
)
_DEFAULT_CANCEL_STEP: Final = http(202, body={"id": "{job_id}", "state": "cancelled"})


class RequestLogEntry(TypedDict):
    """One request as the fake saw it; ``*_at`` are time.monotonic(), ``*_at_wall`` time.time()."""

    seq: int
    method: str
    path: str
    raw_path: str
    query: str
    route: str
    job_id: str | None
    raw_job_id: str | None
    headers: dict[str, str]
    body: str
    body_bytes: int
    idempotency_key: str | None
    idempotent_replay: bool
    step_index: int | None
    in_flight: int
    started_at: float
    started_at_wall: float
    finished_at: float | None
    finished_at_wall: float | None
    status: int | None
    dropped: bool


@dataclass(frozen=True)
class _Route:
    kind: RouteKind
    raw_job_id: str | None = None
    job_id: str | None = None


@dataclass
class _Exchange:
    """Per-request bookkeeping shared by the recording wrapper and the endpoint."""

    entry: RequestLogEntry
    generation: int
    route: _Route
    body: bytes = b""
    drop: bool = False
    finished: bool = False


@dataclass
class _Script:
    steps: tuple[Step, ...]
    served: int = 0

    def next_step(self) -> tuple[int, Step]:
        index = min(self.served, len(self.steps) - 1)
        self.served += 1
        return index, self.steps[index]


@dataclass
class _State:
    seq: int = 0
    generation: int = 0
    next_job_number: int = 0
    log: list[RequestLogEntry] = field(default_factory=list[RequestLogEntry])
    status_scripts: dict[str, _Script] = field(default_factory=dict[str, _Script])
    cancel_scripts: dict[str, _Script] = field(default_factory=dict[str, _Script])
    submit_script: _Script | None = None
    submit_count: int = 0
    new_job_steps: tuple[Step, ...] = ()
    idempotency_keys: dict[str, str] = field(default_factory=dict[str, str])
    in_flight: dict[str, int] = field(default_factory=dict[str, int])
    max_in_flight: dict[str, int] = field(default_factory=dict[str, int])


class _ScriptRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: ScriptKind = "status"
    job_id: str | None = None
    steps: list[Step]


def _match_route(raw_path: bytes) -> _Route:
    """Route on the raw path so an encoded job id such as ``..%2Fadmin`` stays one segment."""
    text = raw_path.decode("latin-1")
    control = {
        "/_control/script": "control_script",
        "/_control/log": "control_log",
        "/_control/reset": "control_reset",
    }
    if text in control:
        return _Route(cast(RouteKind, control[text]))
    parts = text.split("/")
    if parts[:3] != ["", "v1", "jobs"]:
        return _Route("unknown")
    if len(parts) == 3:
        return _Route("submit")
    # A job id of several parts (a table with job_id_parts) spans several
    # segments: /v1/jobs/octo/hello/42 is job "octo/hello/42".
    segments = parts[3:]
    kind: RouteKind = "status"
    if len(segments) > 1 and segments[-1] == "cancel":
        kind, segments = "cancel", segments[:-1]
    if not all(segments):
        return _Route("unknown")
    raw_job_id = "/".join(segments)
    return _Route(kind, raw_job_id, "/".join(unquote(segment) for segment in segments))


def _substitute(value: Any, job_id: str) -> Any:
    if isinstance(value, str):
        return value.replace(JOB_ID_PLACEHOLDER, job_id)
    if isinstance(value, dict):
        mapping = cast(dict[str, Any], value)
        return {key: _substitute(item, job_id) for key, item in mapping.items()}
    if isinstance(value, list):
        items = cast(list[Any], value)
        return [_substitute(item, job_id) for item in items]
    return value


@functools.lru_cache(maxsize=8)
def _gzip_of_zeros(size: int) -> bytes:
    """Gzip of ``size`` zero bytes, built in 1 MiB pieces so a huge bomb never exists uncompressed."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: gzip container
    piece = bytes(min(size, 1 << 20))
    parts: list[bytes] = []
    remaining = size
    while remaining > 0:
        n = min(remaining, len(piece))
        parts.append(compressor.compress(piece[:n]))
        remaining -= n
    parts.append(compressor.flush())
    return b"".join(parts)


async def _trickle(payload: bytes, total: int, bytes_per_second: float) -> AsyncIterator[bytes]:
    """Yield ``total`` bytes (payload, then spaces) at about ``bytes_per_second``."""
    chunk = max(1, int(bytes_per_second * _TRICKLE_TICK_SECONDS))
    for offset in range(0, total, chunk):
        if offset:
            await anyio.sleep(chunk / bytes_per_second)
        size = min(chunk, total - offset)
        piece = payload[offset : offset + size]
        # Trailing spaces keep a JSON payload valid however far it is padded.
        yield piece + b" " * (size - len(piece))


def _request_headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in cast(list[tuple[bytes, bytes]], scope["headers"]):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        # Repeated headers are folded the way HTTP allows, so none is lost.
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(cast(bytes, message.get("body", b"")))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


class ConnectionDropped(RuntimeError):
    """Raised when a step asks to drop the connection but the server gives no handle on it."""


class FakeProvider:
    """The fake's state, scripts and log; also the ASGI app that uvicorn serves.

    Every public method is safe to call from any thread while the server runs.
    Requests to ``/_control/*`` are not logged: the log is evidence of what the
    system under test sent, and reading it must not change it.
    """

    def __init__(self, *, new_job_steps: Sequence[Step] = (), job_id_prefix: str = "job_") -> None:
        """``new_job_steps`` scripts every job created by a submission that has no script yet."""
        self._lock = threading.Lock()
        self._initial_new_job_steps = tuple(new_job_steps)
        self._job_id_prefix = job_id_prefix
        self._state = _State(new_job_steps=self._initial_new_job_steps)
        self._base_url: str | None = None
        # Touched only on the server's event loop thread, so no lock.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cut_scopes: set[anyio.CancelScope] = set()
        self.starlette_app = Starlette(routes=[Route("/{path:path}", self._endpoint, methods=_ALL_METHODS)])

    # ----- public API -------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` once the fake is being served."""
        if self._base_url is None:
            raise RuntimeError("the fake provider is not being served yet")
        return self._base_url

    @base_url.setter
    def base_url(self, value: str) -> None:
        self._base_url = value

    def script(self, job_id: str, steps: Sequence[Step]) -> None:
        """Answer status requests for ``job_id`` with ``steps`` in order, repeating the last.

        Re-scripting a job starts again from its first step.
        """
        script = _non_empty_script(steps)
        with self._lock:
            self._state.status_scripts[job_id] = script

    def script_submit(self, steps: Sequence[Step]) -> None:
        """Answer submissions with ``steps`` in order (idempotent replays included)."""
        script = _non_empty_script(steps)
        with self._lock:
            self._state.submit_script = script

    def script_cancel(self, job_id: str, steps: Sequence[Step]) -> None:
        """Answer cancel requests for ``job_id`` with ``steps`` in order."""
        script = _non_empty_script(steps)
        with self._lock:
            self._state.cancel_scripts[job_id] = script

    def script_new_jobs(self, steps: Sequence[Step]) -> None:
        """Give every job created by a later submission this status script (unless it has one)."""
        with self._lock:
            self._state.new_job_steps = tuple(steps)

    def log(self) -> list[RequestLogEntry]:
        """A copy of every logged request, oldest first."""
        with self._lock:
            return [_copy_entry(entry) for entry in self._state.log]

    def requests_for(self, job_id: str) -> list[RequestLogEntry]:
        """Logged requests about ``job_id``: its submission, status and cancel requests."""
        return [entry for entry in self.log() if entry["job_id"] == job_id]

    def status_requests(self, job_id: str) -> list[RequestLogEntry]:
        """Logged ``GET`` status requests for ``job_id``."""
        return [e for e in self.requests_for(job_id) if e["route"] == "status" and e["method"] == "GET"]

    def max_in_flight(self, job_id: str) -> int:
        """The most requests for ``job_id`` ever being handled at the same moment."""
        with self._lock:
            return self._state.max_in_flight.get(job_id, 0)

    def reset(self) -> None:
        """Forget scripts, log, counters and idempotency keys."""
        with self._lock:
            generation = self._state.generation + 1
            self._state = _State(generation=generation, new_job_steps=self._initial_new_job_steps)

    def cut_off_in_flight(self) -> None:
        """Drop the connection of every request still being answered (a slow step, a trickle).

        Called on shutdown so that a test ending mid-response neither waits for
        uvicorn's graceful timeout nor gets a cancellation traceback in its log.
        Safe from any thread.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def cut_all() -> None:
            for scope in list(self._cut_scopes):
                scope.cancel()

        with suppress(RuntimeError):  # the loop closed between the check and the call
            loop.call_soon_threadsafe(cut_all)

    # ----- ASGI entry: recording wrapper around the Starlette app --------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point: log the request, then let the Starlette app answer it."""
        if scope["type"] != "http":
            return  # lifespan is off and websockets are not part of a provider
        raw_path = cast(bytes, scope.get("raw_path") or str(scope["path"]).encode())
        route = _match_route(raw_path)
        if route.kind.startswith("control_"):
            await self.starlette_app(scope, receive, send)
            return

        exchange = self._begin(scope, raw_path, route)
        self._loop = asyncio.get_running_loop()
        try:
            with anyio.CancelScope() as cut:
                self._cut_scopes.add(cut)
                try:
                    exchange.body = await _read_body(receive)
                    self._record_body(exchange)
                    scope[_EXCHANGE_SCOPE_KEY] = exchange
                    await self.starlette_app(
                        scope, _replaying(exchange.body, receive), self._recording(exchange, send)
                    )
                finally:
                    self._cut_scopes.discard(cut)
            if cut.cancelled_caught:
                exchange.drop = True  # cut off by shutdown: the client sees the connection go
            if exchange.drop:
                # Finish first, as for a normal response: the client may retry as soon
                # as it sees the connection close.
                self._finish(exchange)
                await _drop(send, receive)
        finally:
            self._finish(exchange)

    def _recording(self, exchange: _Exchange, send: Send) -> Send:
        async def recording_send(message: Message) -> None:
            if exchange.drop:
                return  # the endpoint's placeholder response must never reach the wire
            if message["type"] == "http.response.start":
                with self._lock:
                    exchange.entry["status"] = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # Finish before the last bytes leave: a client cannot see this response
                # end and send its next request while this one still counts as in flight.
                self._finish(exchange)
            await send(message)

        return recording_send

    def _begin(self, scope: Scope, raw_path: bytes, route: _Route) -> _Exchange:
        headers = _request_headers(scope)
        with self._lock:
            state = self._state
            state.seq += 1
            in_flight = 0
            if route.job_id is not None:
                in_flight = state.in_flight.get(route.job_id, 0) + 1
                state.in_flight[route.job_id] = in_flight
                state.max_in_flight[route.job_id] = max(state.max_in_flight.get(route.job_id, 0), in_flight)
            entry: RequestLogEntry = {
                "seq": state.seq,
                "method": str(scope["method"]),
                "path": str(scope["path"]),
                "raw_path": raw_path.decode("latin-1"),
                "query": cast(bytes, scope.get("query_string", b"")).decode("latin-1"),
                "route": route.kind,
                "job_id": route.job_id,
                "raw_job_id": route.raw_job_id,
                "headers": headers,
                "body": "",
                "body_bytes": 0,
                "idempotency_key": headers.get(IDEMPOTENCY_HEADER),
                "idempotent_replay": False,
                "step_index": None,
                "in_flight": in_flight,
                "started_at": time.monotonic(),
                "started_at_wall": time.time(),
                "finished_at": None,
                "finished_at_wall": None,
                "status": None,
                "dropped": False,
            }
            state.log.append(entry)
            return _Exchange(entry=entry, generation=state.generation, route=route)

    def _record_body(self, exchange: _Exchange) -> None:
        text = exchange.body[:BODY_LOG_LIMIT].decode("utf-8", errors="replace")
        with self._lock:
            exchange.entry["body"] = text
            exchange.entry["body_bytes"] = len(exchange.body)

    def _finish(self, exchange: _Exchange) -> None:
        with self._lock:
            if exchange.finished:
                return
            exchange.finished = True
            exchange.entry["finished_at"] = time.monotonic()
            exchange.entry["finished_at_wall"] = time.time()
            exchange.entry["dropped"] = exchange.drop
            job_id = exchange.route.job_id
            # After a reset the counters are new; an old request must not decrement them.
            if job_id is not None and exchange.generation == self._state.generation:
                self._state.in_flight[job_id] = self._state.in_flight.get(job_id, 1) - 1

    # ----- endpoint ----------------------------------------------------------------------

    async def _endpoint(self, request: Request) -> Response:
        route = _match_route(cast(bytes, request.scope.get("raw_path") or request.url.path.encode()))
        match route.kind:
            case "control_script":
                return await self._control_script(request)
            case "control_log":
                return self._control_log(request)
            case "control_reset":
                return self._control_reset(request)
            case _:
                pass
        exchange = request.scope.get(_EXCHANGE_SCOPE_KEY)
        if not isinstance(exchange, _Exchange):
            return JSONResponse({"error": "not found"}, status_code=404)
        method = request.method
        if route.kind == "status" and route.job_id is not None:
            if method != "GET":
                return _method_not_allowed("GET")
            return await self._status(exchange, route.job_id)
        if route.kind == "cancel" and route.job_id is not None:
            if method != "POST":
                return _method_not_allowed("POST")
            return await self._cancel(exchange, route.job_id)
        if route.kind == "submit":
            if method != "POST":
                return _method_not_allowed("POST")
            return await self._submit(exchange)
        return JSONResponse({"error": "no such route"}, status_code=404)

    async def _status(self, exchange: _Exchange, job_id: str) -> Response:
        with self._lock:
            script = self._state.status_scripts.get(job_id)
            if script is None:
                return JSONResponse({"error": "not found"}, status_code=404)
            index, step = script.next_step()
            exchange.entry["step_index"] = index
        return await _answer(step, job_id, exchange)

    async def _cancel(self, exchange: _Exchange, job_id: str) -> Response:
        with self._lock:
            script = self._state.cancel_scripts.get(job_id)
            index, step = script.next_step() if script is not None else (None, _DEFAULT_CANCEL_STEP)
            exchange.entry["step_index"] = index
        return await _answer(step, job_id, exchange)

    async def _submit(self, exchange: _Exchange) -> Response:
        with self._lock:
            state = self._state
            key = exchange.entry["idempotency_key"]
            known = state.idempotency_keys.get(key) if key is not None else None
            if known is not None:
                job_id = known
                exchange.entry["idempotent_replay"] = True
            else:
                # The job exists as soon as the submission arrives, even if the scripted
                # answer is lost (close_connection): that is the ambiguous-delivery case.
                state.next_job_number += 1
                job_id = f"{self._job_id_prefix}{state.next_job_number:04d}"
                if key is not None:
                    state.idempotency_keys[key] = job_id
                if state.new_job_steps and job_id not in state.status_scripts:
                    state.status_scripts[job_id] = _Script(state.new_job_steps)
            exchange.entry["job_id"] = job_id
            state.submit_count += 1
            if state.submit_script is not None:
                index, step = state.submit_script.next_step()
                exchange.entry["step_index"] = index
            else:
                step = _DEFAULT_SUBMIT_STEP
        return await _answer(step, job_id, exchange)

    async def _control_script(self, request: Request) -> Response:
        try:
            command = _ScriptRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if command.kind in ("status", "cancel") and command.job_id is None:
            return JSONResponse({"error": f"kind {command.kind!r} needs a job_id"}, status_code=400)
        if command.kind != "new_jobs" and not command.steps:
            return JSONResponse({"error": "steps must not be empty"}, status_code=400)
        match command.kind:
            case "status":
                self.script(cast(str, command.job_id), command.steps)
            case "cancel":
                self.script_cancel(cast(str, command.job_id), command.steps)
            case "submit":
                self.script_submit(command.steps)
            case "new_jobs":
                self.script_new_jobs(command.steps)
        return JSONResponse({"ok": True})

    def _control_log(self, request: Request) -> Response:
        if request.method != "GET":
            return _method_not_allowed("GET")
        job_id = request.query_params.get("job_id")
        entries = self.log() if job_id is None else self.requests_for(job_id)
        return JSONResponse(entries)

    def _control_reset(self, request: Request) -> Response:
        if request.method != "POST":
            return _method_not_allowed("POST")
        self.reset()
        return JSONResponse({"ok": True})


def _non_empty_script(steps: Sequence[Step]) -> _Script:
    if not steps:
        raise ValueError("a script needs at least one step")
    return _Script(tuple(steps))


def _copy_entry(entry: RequestLogEntry) -> RequestLogEntry:
    copy = entry.copy()
    copy["headers"] = dict(entry["headers"])
    return copy


def _method_not_allowed(allowed: str) -> Response:
    return JSONResponse({"error": "method not allowed"}, status_code=405, headers={"Allow": allowed})


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the already-read body over once, then defers to the server."""
    delivered = False

    async def replaying_receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replaying_receive


async def _drop(send: Send, receive: Receive) -> None:
    """Close the TCP connection with nothing written, so the client sees a transport error.

    ASGI has no "abort" message; uvicorn's h11 ``send`` is a bound method of the
    request cycle, which holds the transport. Waiting for ``http.disconnect``
    afterwards tells uvicorn the peer is gone, so it does not write a 500.
    """
    owner = getattr(send, "__self__", None)
    transport = getattr(owner, "transport", None)
    if not isinstance(transport, asyncio.BaseTransport):
        raise ConnectionDropped("this server gives no handle on the connection; cannot drop it")
    transport.close()
    with anyio.move_on_after(2.0):
        while (await receive())["type"] != "http.disconnect":
            pass


async def _answer(step: Step, job_id: str, exchange: _Exchange) -> Response:
    """Turn a step into a response for ``job_id``."""
    if step.delay_seconds:
        # Not cut short when the client gives up: a real provider keeps working on
        # an abandoned request, so it stays in flight for overlap checks.
        await anyio.sleep(step.delay_seconds)
    if step.close_connection:
        exchange.drop = True
        return Response(status_code=204)  # swallowed by the recording wrapper

    headers: dict[str, str] = {"date": formatdate(usegmt=True)}
    payload = b""
    if step.gzip_bomb_bytes:
        payload = _gzip_of_zeros(step.gzip_bomb_bytes)
        headers["content-type"] = "application/json"
        headers["content-encoding"] = "gzip"
    elif step.raw_body is not None:
        payload = step.raw_body
    elif step.raw_body_text is not None:
        payload = step.raw_body_text.replace(JOB_ID_PLACEHOLDER, job_id).encode()
    elif step.body is not None:
        rendered = _substitute(step.body, job_id)
        payload = json.dumps(rendered, ensure_ascii=False, separators=(",", ":")).encode()
        headers["content-type"] = "application/json"
    # Scripted headers win, whatever their case.
    for name, value in step.headers.items():
        headers[name.lower()] = value.replace(JOB_ID_PLACEHOLDER, job_id)

    if step.trickle_bytes_per_second > 0:
        total = step.trickle_total_bytes or len(payload)
        stream = _trickle(payload, total, step.trickle_bytes_per_second)
        return StreamingResponse(stream, status_code=step.status, headers=headers)
    return Response(content=payload, status_code=step.status, headers=headers)


# ----- running it ---------------------------------------------------------------------------


def _listening_socket(port: int) -> socket.socket:
    """Bind before uvicorn starts so the port (even an ephemeral one) is known up front."""
    # IPPROTO_TCP spelled out: asyncio only sets TCP_NODELAY on accepted sockets whose
    # proto is 6, and without it every keep-alive request waits ~40 ms on delayed ACKs.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        if port:
            # A fixed port must be reusable right after a previous run's TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def _base_url_of(sock: socket.socket) -> str:
    port = cast(tuple[str, int], sock.getsockname())[1]
    return f"http://{HOST}:{port}"


def _allow_odd_status_codes() -> None:
    """Let uvicorn's h11 protocol send 600–999 (h11 allows any three digits; uvicorn knows phrases to 599).

    Some proxies and broken providers answer with such codes; the fake must be able to as well.
    """
    from uvicorn.protocols.http import h11_impl

    for code in range(600, 1000):
        h11_impl.STATUS_PHRASES.setdefault(code, b"")


def _uvicorn_server(provider: FakeProvider) -> uvicorn.Server:
    _allow_odd_status_codes()
    config = uvicorn.Config(
        provider,
        host=HOST,
        log_level="warning",
        access_log=False,
        lifespan="off",
        interface="asgi3",
        # Pinned: dropping a connection relies on the h11 request cycle, and the
        # plain asyncio loop keeps behaviour identical whatever else is installed.
        http="h11",
        loop="asyncio",
        proxy_headers=False,
        # Responses carry only what a step scripts (plus our own Date), so a
        # scripted Date or Server header is never duplicated.
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=2,  # whole seconds: a trickle still running at exit is cut short
    )
    return uvicorn.Server(config)


@contextmanager
def running_fake_provider(port: int = 0, *, provider: FakeProvider | None = None) -> Generator[FakeProvider]:
    """Serve a fake provider from a daemon thread for the duration of the ``with`` block."""
    fake = provider if provider is not None else FakeProvider()
    sock = _listening_socket(port)
    server = _uvicorn_server(fake)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="fake-provider", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + _STARTUP_TIMEOUT_SECONDS
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the fake provider's server thread exited during startup")
            if time.monotonic() > deadline:
                raise TimeoutError("the fake provider did not start in time")
            time.sleep(0.005)
        fake.base_url = _base_url_of(sock)
        yield fake
    finally:
        fake.cut_off_in_flight()
        server.should_exit = True
        thread.join(timeout=_SHUTDOWN_TIMEOUT_SECONDS)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=1.0)
        sock.close()


async def serve_fake_provider(
    provider: FakeProvider | None = None,
    port: int = 0,
    *,
    task_status: anyio.abc.TaskStatus[FakeProvider] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve in the current (asyncio) event loop until cancelled.

    ``fake = await task_group.start(serve_fake_provider)``; cancel the group to stop.
    When run in the main thread uvicorn takes over SIGINT/SIGTERM while serving.
    """
    fake = provider if provider is not None else FakeProvider()
    sock = _listening_socket(port)
    server = _uvicorn_server(fake)
    try:
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                # Shielded so cancellation becomes uvicorn's orderly shutdown
                # instead of abandoning open connections mid-response.
                with anyio.CancelScope(shield=True):
                    await server.serve(sockets=[sock])
                tg.cancel_scope.cancel()  # a server that stops on its own ends the wait too

            tg.start_soon(run)
            try:
                with anyio.fail_after(_STARTUP_TIMEOUT_SECONDS):
                    # uvicorn offers only a flag, no event, to say it is accepting.
                    while not server.started:  # noqa: ASYNC110
                        await anyio.sleep(0.005)
                fake.base_url = _base_url_of(sock)
                task_status.started(fake)
                await anyio.sleep_forever()
            finally:
                fake.cut_off_in_flight()
                server.should_exit = True
    finally:
        sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fake standalone: ``python -m tests.support.fake_provider --port N``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.fake_provider",
        description="Serve a scriptable fake job provider on 127.0.0.1; the base URL goes to stderr.",
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port (default: any free port)")
    args = parser.parse_args(argv)
    fake = FakeProvider()
    sock = _listening_socket(cast(int, args.port))
    fake.base_url = _base_url_of(sock)
    # Printing before uvicorn starts is safe: the socket already listens, so an
    # early client waits in the accept backlog instead of being refused.
    print(fake.base_url, file=sys.stderr, flush=True)
    # uvicorn shuts down cleanly on Ctrl+C, then re-raises it.
    with suppress(KeyboardInterrupt):
        _uvicorn_server(fake).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
