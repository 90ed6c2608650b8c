"""HTTP to providers: one origin, no redirects, capped bodies, bounded time.

Thin I/O around the pure rules: it returns a `ProviderAnswer`, a `NoAnswer`
(transport failure) or an `UnusableAnswer` (an answer we refuse to read), and
never raises for anything a provider does. The transport is a seam
(`httpx2.AsyncBaseTransport`), so tests use a real loopback server instead of
patching.

A provider that echoes our credential back (in an error message, a header, a
Location) gets it replaced by "[redacted]" before anything else reads the
answer, so the secret cannot travel on into the database, the audit or a tool
result. The HTTP libraries' own debug logs (which show response headers) pass
through the same redaction.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio
import httpx2

from pollwarden.decide import NoAnswer, ProviderAnswer, UnusableAnswer
from pollwarden.faults import fault_point
from pollwarden_providers.request_building import (
    REDACTED,
    auth_headers,
    job_url,
    secret_values,
    status_url,
    submit_url,
)
from pollwarden_providers.table import ProviderTable

USER_AGENT = "pollwarden/0.1"
# The HTTP libraries' loggers; their DEBUG traces include response headers.
_HTTP_LOGGERS = (
    "httpx2",
    "httpcore2.connection",
    "httpcore2.http11",
    "httpcore2.http2",
    "httpcore2.proxy",
    "httpcore2.socks",
)


class _RedactingFilter(logging.Filter):
    """Replaces the credentials this client has sent in anything the HTTP libraries log."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            redacted = _redact_text(message, tuple(self.secrets))
            if redacted != message:
                record.msg, record.args = redacted, None
        return True


@dataclass(frozen=True)
class HttpLimits:
    """Caps on one provider request."""

    max_body_bytes: int = 1024 * 1024  # counted after decompression
    connect_timeout_seconds: float = 5.0
    read_timeout_seconds: float = 10.0  # between bytes
    total_timeout_seconds: float = 20.0  # a trickling body is cut off here


class _TooLarge(Exception):
    pass


class _Decoder:
    """Incremental Content-Encoding decoder that never inflates past the cap."""

    def __init__(self, encoding: str, cap: int) -> None:
        self.cap = cap
        self.size = 0
        encoding = encoding.strip().lower()
        if encoding in ("", "identity"):
            self._zlib = None
        elif encoding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._zlib = zlib.decompressobj()
        else:
            raise ValueError(f"unsupported Content-Encoding {encoding[:40]!r}")

    def feed(self, chunk: bytes) -> bytes:
        if self._zlib is None:
            return self._count(chunk)
        out = bytearray()
        data = chunk
        while data:
            # max_length bounds memory: a bomb is stopped one slice past the cap.
            piece = self._zlib.decompress(data, self.cap + 1 - self.size)
            out += self._count(piece)
            data = self._zlib.unconsumed_tail
            if not piece and not data:
                break
        return bytes(out)

    def _count(self, piece: bytes) -> bytes:
        self.size += len(piece)
        if self.size > self.cap:
            raise _TooLarge
        return piece


async def _after_request_sent(response: httpx2.Response) -> None:
    """Response hook: the provider has the request and answered headers (test-only fault step)."""
    del response
    fault_point("after_request_sent")


class ProviderHTTP:
    """Sends the few requests pollwarden makes to providers."""

    def __init__(
        self,
        *,
        environ: Mapping[str, str],
        now: Callable[[], float],
        limits: HttpLimits | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.environ = environ
        self.now = now
        self.limits = limits or HttpLimits()
        self._client = httpx2.AsyncClient(
            transport=transport,
            follow_redirects=False,
            trust_env=False,  # no proxies or netrc from the environment: one origin only
            timeout=httpx2.Timeout(
                self.limits.read_timeout_seconds, connect=self.limits.connect_timeout_seconds
            ),
            headers={
                "User-Agent": USER_AGENT,
                "Accept": "application/json",
                "Accept-Encoding": "gzip, deflate",
            },
            event_hooks={"response": [_after_request_sent]},
        )
        self._log_filter = _RedactingFilter()
        for name in _HTTP_LOGGERS:
            logging.getLogger(name).addFilter(self._log_filter)

    async def aclose(self) -> None:
        """Close the connection pool."""
        for name in _HTTP_LOGGERS:
            logging.getLogger(name).removeFilter(self._log_filter)
        await self._client.aclose()

    def credentials(self, table: ProviderTable) -> dict[str, str]:
        """The credential header for `table` (raises MissingCredentialError when unset)."""
        return auth_headers(table, self.environ)

    async def get_status(
        self, table: ProviderTable, job_id: str
    ) -> ProviderAnswer | NoAnswer | UnusableAnswer:
        """One status request for `job_id`."""
        return await self._send(table, "GET", status_url(table, job_id), headers={})

    async def submit(
        self, table: ProviderTable, payload: Mapping[str, object], idempotency_key: str | None
    ) -> ProviderAnswer | NoAnswer | UnusableAnswer:
        """POST the job; the idempotency key (if the table names a header) rides along."""
        assert table.submit is not None
        headers = {"Content-Type": "application/json"}
        if table.submit.idempotency_header and idempotency_key:
            headers[table.submit.idempotency_header] = idempotency_key
        body = json.dumps(payload, sort_keys=True).encode()
        return await self._send(table, table.submit.method, submit_url(table), headers=headers, content=body)

    async def cancel(self, table: ProviderTable, job_id: str) -> ProviderAnswer | NoAnswer | UnusableAnswer:
        """The provider's documented cancel call."""
        assert table.cancel is not None
        return await self._send(
            table, table.cancel.method, job_url(table, table.cancel.path, job_id), headers={}
        )

    async def _send(
        self,
        table: ProviderTable,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        content: bytes | None = None,
    ) -> ProviderAnswer | NoAnswer | UnusableAnswer:
        all_headers = {**table.headers, **self.credentials(table), **headers}
        secrets = secret_values(table, self.environ)
        self._log_filter.secrets.update(secrets)
        try:
            with anyio.fail_after(self.limits.total_timeout_seconds):
                async with self._client.stream(method, url, headers=all_headers, content=content) as response:
                    return await self._read(response, secrets)
        except TimeoutError:
            return NoAnswer(
                "response_too_slow",
                f"no complete answer within {self.limits.total_timeout_seconds:g} s",
                self.now(),
                sent=True,
            )
        except httpx2.ConnectTimeout:
            return NoAnswer("timeout", "connect timeout", self.now(), sent=False)
        except httpx2.ConnectError:
            return NoAnswer("connection_error", "connection refused or failed", self.now(), sent=False)
        except httpx2.TimeoutException:
            return NoAnswer("timeout", "timed out waiting for the provider", self.now(), sent=True)
        except httpx2.TransportError as exc:
            return NoAnswer(
                "connection_error", f"connection lost ({type(exc).__name__})", self.now(), sent=True
            )

    async def _read(
        self, response: httpx2.Response, secrets: tuple[str, ...]
    ) -> ProviderAnswer | UnusableAnswer:
        received = self.now()
        headers = {k.lower(): _redact_text(v, secrets) for k, v in response.headers.items()}
        if 300 <= response.status_code < 400:
            # Never read or follow a redirect: the Location is only noted.
            return ProviderAnswer(response.status_code, headers, b"", received)
        try:
            decoder = _Decoder(headers.get("content-encoding", ""), self.limits.max_body_bytes)
        except ValueError as exc:
            return UnusableAnswer(response.status_code, str(exc), received)
        body = bytearray()
        try:
            async for chunk in response.aiter_raw():
                body += decoder.feed(chunk)
        except _TooLarge:
            return UnusableAnswer(
                response.status_code,
                f"body larger than {self.limits.max_body_bytes} bytes after decompression",
                received,
            )
        except zlib.error:
            return UnusableAnswer(response.status_code, "body is not valid compressed data", received)
        return ProviderAnswer(response.status_code, headers, _redact_bytes(bytes(body), secrets), self.now())


def _redact_text(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def _redact_bytes(body: bytes, secrets: tuple[str, ...]) -> bytes:
    """Replace each secret in the body, raw and as it would appear escaped inside a JSON string."""
    for secret in secrets:
        for form in {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}:
            body = body.replace(form.encode(), REDACTED.encode())
    return body
