"""HTTP to providers: one origin, no redirects, capped bodies, bounded time.

Thin I/O around the pure rules: it returns a `ProviderAnswer`, a `NoAnswer`
(transport failure) or an `UnusableAnswer` (an answer we refuse to read), and
never raises for anything a provider does. The transport is a seam
(`httpx2.AsyncBaseTransport`), so tests use a real loopback server instead of
patching.

A provider that echoes our credential back (in an error message, a header, a
Location) gets it replaced by "[redacted]" before anything else reads the
answer, so the secret cannot travel on into the database, the audit, a tool
result or a log. The credential is found in every spelling a provider could
use (`Redactor`): as it is, in either case, JSON-escaped character by
character (``\\/``, ``\u002b``), percent-encoded, as HTML entities (``&#115;``,
``&#x73;``, ``&sol;``), or inside base64 at any alignment (a Basic
``user:token``); then once more on the decoded values of a JSON body (where a
JSON-escaped percent-encoding or a base64 text with ``\\/`` becomes plain). The
HTTP libraries' own debug logs pass through the same redaction, and the
database driver's debug log, which prints SQL parameters, is kept quiet.

A credential that cannot be sent in a header (anything but printable ASCII)
is refused before anything is counted or sent, with a message that names the
variable and shows none of its characters.
"""

from __future__ import annotations

import base64
import html.entities
import json
import logging
import re
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote_plus

import anyio
import httpx2

from pollwarden.flows.check_hooks import BoundaryHook, ignore_boundary
from pollwarden.ops import observe
from pollwarden.rules.status_answer import NoAnswer, ProviderAnswer, UnusableAnswer
from pollwarden_providers.request_building import (
    REDACTED,
    MissingCredentialError,
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


# aiosqlite logs every call at DEBUG with its SQL parameters (provider text, job ids):
# never let `-v` print them.
logging.getLogger("aiosqlite").setLevel(logging.INFO)


def _named_entities() -> dict[str, list[str]]:
    """The HTML named entities of each single character (``&sol;`` for ``/``), by character."""
    names: dict[str, list[str]] = {}
    for name, value in html.entities.html5.items():
        if len(value) == 1:
            names.setdefault(value, []).append(name)
    return names


_NAMED = _named_entities()


def _char_forms(ch: str) -> list[str]:
    """Every way one credential character may be spelled in an answer (regex fragments).

    Letters in either case (a provider that upper-cases what it echoes), and each
    character also as an HTML entity: decimal, hex, or named (``&#115;``,
    ``&#x73;``, ``&sol;``), the terminating semicolon optional as browsers read it.
    """
    forms: list[str] = []
    for variant in dict.fromkeys((ch, ch.lower(), ch.upper())):
        if len(variant) != 1:
            continue  # a character whose other case is two characters (ß → SS): only as it is
        code = ord(variant)
        forms += [re.escape(variant), rf"\\u(?i:{code:04x})", rf"%(?i:{code:02x})"]
        forms += [rf"&#0*{code}(?:;|(?![0-9]))", rf"&#(?i:x)0*(?i:{code:x})(?:;|(?![0-9a-fA-F]))"]
        forms += [re.escape("&" + name) for name in _NAMED.get(variant, ())]
    if ch in '/"\\':
        forms.append(re.escape("\\" + ch))
    if ch == " ":
        forms.append(re.escape("+"))
    return forms


def _base64_cores(secret: bytes) -> set[str]:
    """The base64 characters that encode only `secret`, at each of the three alignments.

    Found inside a longer base64 text (such as ``Basic base64(user:token)``)
    whatever comes before the secret; standard and URL-safe alphabets.
    """
    cores: set[str] = set()
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + secret + b"\0\0").decode("ascii")
        first = -(-pad * 8 // 6)  # the first character made only of the secret's bits
        last = (pad + len(secret)) * 8 // 6  # one past the last such character
        core = encoded[first:last]
        if len(core) >= 4:
            cores.add(core)
            cores.add(core.translate(str.maketrans("+/", "-_")))
    return cores


class Redactor:
    """Finds the credentials in any spelling a provider could echo them in, and replaces them."""

    def __init__(self, secrets: Iterable[str]) -> None:
        patterns: list[str] = []
        for secret in sorted(set(secrets), key=len, reverse=True):
            patterns.append("".join(f"(?:{'|'.join(_char_forms(ch))})" for ch in secret))
            patterns.extend(re.escape(core) for core in _base64_cores(secret.encode("utf-8")))
        self._text = re.compile("|".join(patterns)) if patterns else None
        self._bytes = re.compile("|".join(patterns).encode("utf-8")) if patterns else None

    def text(self, value: str) -> str:
        """`value` with every spelling of a credential replaced, also where percent-decoding reveals one."""
        if self._text is None:
            return value
        redacted = self._text.sub(REDACTED, value)
        if "%" in redacted:
            decoded = unquote_plus(redacted)
            if self._text.search(decoded):
                return self._text.sub(REDACTED, decoded)
        return redacted

    def body(self, data: bytes) -> bytes:
        """A body with every credential spelling replaced, on the raw bytes and on its decoded JSON values."""
        if self._bytes is None:
            return data
        data = self._bytes.sub(REDACTED.encode(), data)
        try:
            document: object = json.loads(data)
        except (ValueError, RecursionError):
            return data  # not JSON (or too deep for anyone to read): the raw pass is all there is
        cleaned, changed = self._walk(document)
        if not changed:
            return data
        return json.dumps(cleaned, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def _walk(self, value: object) -> tuple[object, bool]:
        if isinstance(value, str):
            cleaned = self.text(value)
            return cleaned, cleaned != value
        if isinstance(value, list):
            items = [self._walk(v) for v in cast("list[object]", value)]
            return [v for v, _ in items], any(c for _, c in items)
        if isinstance(value, dict):
            pairs = [(self._walk(k), self._walk(v)) for k, v in cast("dict[str, object]", value).items()]
            return {str(k): v for (k, _), (v, _) in pairs}, any(ck or cv for (_, ck), (_, cv) in pairs)
        return value, False


class _RedactingFilter(logging.Filter):
    """Replaces the credentials this client has sent in anything the HTTP libraries log."""

    def __init__(self) -> None:
        super().__init__()
        self.redactor = Redactor(())

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self.redactor.text(message)
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


def _after_request_sent(on_boundary: BoundaryHook) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A response hook: the provider has the request and has answered with headers."""

    async def hook(response: httpx2.Response) -> None:
        del response
        on_boundary("after_request_sent")

    return hook


class ProviderHTTP:
    """Sends the few requests pollwarden makes to providers."""

    def __init__(
        self,
        *,
        environ: Mapping[str, str],
        now: Callable[[], float],
        limits: HttpLimits | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
        on_boundary: BoundaryHook = ignore_boundary,
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
            event_hooks={"response": [_after_request_sent(on_boundary)]},
        )
        self._log_filter = _RedactingFilter()
        self._redactors: dict[tuple[str, ...], Redactor] = {}
        self._logged_secrets: set[str] = set()
        for name in _HTTP_LOGGERS:
            logging.getLogger(name).addFilter(self._log_filter)

    async def aclose(self) -> None:
        """Close the connection pool."""
        for name in _HTTP_LOGGERS:
            logging.getLogger(name).removeFilter(self._log_filter)
        await self._client.aclose()

    def credentials(self, table: ProviderTable) -> dict[str, str]:
        """The credential header for `table`.

        Raises MissingCredentialError when it is unset, or when it holds a
        character a header cannot carry (the message names the variable and
        shows no character of the value).
        """
        headers = auth_headers(table, self.environ)
        for value in headers.values():
            if not all(" " <= ch <= "~" for ch in value):
                assert table.auth is not None
                raise MissingCredentialError(
                    f"the environment variable {table.auth.env} (credentials for provider {table.name!r}) holds "
                    "characters other than printable ASCII, which an HTTP header cannot carry; set it to the "
                    "bare token exactly as the provider issued it"
                )
        return headers

    def _redactor(self, table: ProviderTable) -> Redactor:
        secrets = secret_values(table, self.environ)
        redactor = self._redactors.get(secrets)
        if redactor is None:
            redactor = self._redactors[secrets] = Redactor(secrets)
            self._log_filter.redactor = Redactor({*self._logged_secrets, *secrets})
            self._logged_secrets.update(secrets)
        return redactor

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
        redactor = self._redactor(table)
        # The span names the URL with any credential redacted; headers are never attributes.
        with observe.provider_request(table.name, method, redactor.text(url)) as seen:
            answer = await self._exchange(method, url, all_headers, content, redactor)
            if isinstance(answer, NoAnswer):
                seen.failed(answer.kind)
            else:
                seen.answered(answer.status_code)
            return answer

    async def _exchange(
        self,
        method: str,
        url: str,
        all_headers: Mapping[str, str],
        content: bytes | None,
        redactor: Redactor,
    ) -> ProviderAnswer | NoAnswer | UnusableAnswer:
        try:
            with anyio.fail_after(self.limits.total_timeout_seconds):
                async with self._client.stream(method, url, headers=all_headers, content=content) as response:
                    return await self._read(response, redactor)
        except TimeoutError:
            return NoAnswer(
                "response_too_slow",
                f"no complete answer within {self.limits.total_timeout_seconds:g} s",
                self.now(),
                sent=True,
                waited_seconds=self.limits.total_timeout_seconds,
            )
        except httpx2.ConnectTimeout:
            return NoAnswer("timeout", "connect timeout", self.now(), sent=False)
        except httpx2.ConnectError:
            return NoAnswer("connection_error", "connection refused or failed", self.now(), sent=False)
        except httpx2.TimeoutException:
            return NoAnswer(
                "timeout",
                "timed out waiting for the provider",
                self.now(),
                sent=True,
                waited_seconds=self.limits.read_timeout_seconds,
            )
        except httpx2.TransportError as exc:
            return NoAnswer(
                "connection_error", f"connection lost ({type(exc).__name__})", self.now(), sent=True
            )

    async def _read(self, response: httpx2.Response, redactor: Redactor) -> ProviderAnswer | UnusableAnswer:
        received = self.now()
        headers = {k.lower(): redactor.text(v) for k, v in response.headers.items()}
        if 300 <= response.status_code < 400:
            # Never read or follow a redirect: the Location is only noted.
            return ProviderAnswer(response.status_code, headers, b"", received)

        def unusable(reason: str) -> ProviderAnswer | UnusableAnswer:
            if response.status_code >= 500:
                # A server error is decided by its status and headers (a failure counted, its Retry-After
                # kept): a body nobody reads does not make it unusable.
                return ProviderAnswer(response.status_code, headers, b"", received)
            return UnusableAnswer(response.status_code, reason, received)

        try:
            decoder = _Decoder(headers.get("content-encoding", ""), self.limits.max_body_bytes)
        except ValueError as exc:
            return unusable(str(exc))
        body = bytearray()
        try:
            async for chunk in response.aiter_raw():
                body += decoder.feed(chunk)
        except _TooLarge:
            return unusable(f"body larger than {self.limits.max_body_bytes} bytes after decompression")
        except zlib.error:
            return unusable("body is not valid compressed data")
        return ProviderAnswer(response.status_code, headers, redactor.body(bytes(body)), self.now())
