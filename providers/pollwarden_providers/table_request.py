"""The request side of a provider table: where requests go and what they carry.

``base_url`` (one origin), the job id's parts and the paths they are filled
into, the fixed ``[headers]``, the credential (``[auth]``), and the submit and
cancel calls (``[submit]``, ``[cancel]``). The checks that need the whole table
(which placeholders a path holds, which headers another section already sends)
are called from ``ProviderTable``.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, StrictStr, field_validator

from pollwarden_providers.table_common import (
    ENV_RE,
    MODEL_CONFIG,
    PLACEHOLDER_RE,
    check_dotted_path,
    check_header_name,
    has_control_or_space,
    refuse,
)

__all__ = [
    "CREDENTIAL_HEADERS",
    "CREDENTIAL_HEADER_WORDS",
    "OWN_ENV_PREFIX",
    "OWN_HEADERS",
    "AuthSpec",
    "CancelSpec",
    "SubmitSpec",
    "check_base_url",
    "check_fixed_headers",
    "check_job_id_parts",
    "check_path",
    "check_placeholders",
    "normalized_origin",
]

# pollwarden's own settings and secrets (the audit key, the operator token) live
# in variables with this prefix: no table may send one to a provider.
OWN_ENV_PREFIX = "POLLWARDEN_"
_HOST_RE = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?")
_USERINFO_RE = re.compile(r"(?<=://)[^/?#]*@")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_PART_RE = re.compile(r"[a-z][a-z0-9_]*")
# Headers pollwarden itself sets or that would change how a request is framed,
# routed or decoded: a table may not set them in [headers].
OWN_HEADERS = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "te", "upgrade",
     "accept-encoding", "cookie", "proxy-authorization", "keep-alive", "expect", "trailer"}
)  # fmt: skip
# Hop-by-hop and routing headers: a credential sent in one of these would be
# consumed or forwarded by a proxy, or would re-route the request. [auth] may
# not use them (nor any header pollwarden owns, nor one starting "proxy-").
_ROUTING_HEADERS = frozenset(
    {"forwarded", "via", "max-forwards", "x-real-ip", "x-http-method-override", "x-original-url",
     "x-rewrite-url", "content-encoding", "origin", "referer"}
)  # fmt: skip
# [headers] holds fixed, non-secret values. A header whose name says it carries
# a credential is refused: these names exactly, and any name containing one of
# the words below (so "X-Api-Key", "X-Auth-Token", "X-Client-Secret" are refused).
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
CREDENTIAL_HEADER_WORDS: tuple[str, ...] = (
    "token",
    "secret",
    "key",
    "auth",
    "password",
    "passwd",
    "credential",
)


def check_base_url(value: str) -> str:
    """Refuse a ``base_url`` that is more than one http(s) origin (scheme, host, optional port)."""
    # base_url is the only place requests may go (no request leaves its origin), so it must be
    # an origin and nothing more: a path would be ambiguous when joined, and
    # userinfo would be a credential living in the table.
    example = 'e.g. "https://api.acme.example"'
    shown = repr(_USERINFO_RE.sub("***@", value))  # never echo a password
    if has_control_or_space(value) or "\\" in value:
        raise refuse(f"{shown} contains spaces, control characters or '\\'", f"remove them, {example}")
    parts = urlsplit(value)
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.netloc:
        raise refuse(f"{shown} is not an absolute http(s) URL", f"write scheme and host, {example}")
    if "@" in parts.netloc:
        raise refuse(
            f"{shown} contains a user name or password",
            f"remove it and put the secret in an environment variable named by [auth], {example}",
        )
    if "?" in value or "#" in value:
        raise refuse(f"{shown} has a query or fragment", f"remove it, {example}")
    if parts.path not in ("", "/"):
        raise refuse(
            f"{shown} has a path ({parts.path!r})",
            "keep only scheme, host and port here and move the path into status_path "
            "(and submit.path, cancel.path)",
        )
    host = parts.hostname or ""
    if not _valid_host(host):
        raise refuse(
            f"{shown} has no valid host", f"write a DNS name or IP address (IDNs as punycode), {example}"
        )
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or parts.netloc.endswith(":"):
        raise refuse(f"{shown} has an invalid port", f"write a port from 1 to 65535 or omit it, {example}")
    return value


def normalized_origin(url: str) -> str:
    """``scheme://host[:port]`` of an http(s) URL: lower-cased, IPv6 in brackets, default port omitted."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literals keep their brackets in an origin
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def _valid_host(host: str) -> bool:
    """Accept a DNS name or an IP literal (``urlsplit`` has already lower-cased it)."""
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return _HOST_RE.fullmatch(host) is not None
    return True


def check_job_id_parts(value: tuple[str, ...]) -> tuple[str, ...]:
    """Refuse ``job_id_parts`` that are not distinct placeholder names."""
    if not value:
        raise refuse("no job id part is named", 'omit the key, or write e.g. ["owner", "repo", "run_id"]')
    for part in value:
        if not _PART_RE.fullmatch(part):
            raise refuse(
                f"{part!r} is not a placeholder name",
                'use lower-case letters, digits and "_", starting with a letter, e.g. "run_id"',
            )
    if len(set(value)) != len(value):
        raise refuse("a job id part is named twice", "name each part once")
    return value


def check_path(value: str, *, example: str) -> str:
    """Check the syntax of a request path relative to ``base_url``.

    The path is appended to the one origin, so anything that could make it name
    another host (a leading "//", a backslash, a scheme) is refused. Which
    placeholders it holds is checked by the table, which knows the job id parts.
    """
    if not value.startswith("/"):
        raise refuse(
            f"{value!r} does not start with '/'", f"write the path relative to base_url, e.g. {example}"
        )
    if value.startswith("//") or "\\" in value:
        raise refuse(
            f"{value!r} could be read as another host",
            f"write a plain path on base_url's host, e.g. {example}",
        )
    if has_control_or_space(value) or "#" in value:
        raise refuse(
            f"{value!r} contains spaces, control characters or a '#' fragment",
            f"percent-encode them or remove them, e.g. {example}",
        )
    if "{" in PLACEHOLDER_RE.sub("", value) or "}" in PLACEHOLDER_RE.sub("", value):
        raise refuse(f"{value!r} has an unmatched '{{' or '}}'", f"remove it, e.g. {example}")
    return value


def check_placeholders(value: str, parts: tuple[str, ...], *, key: str, names_the_job: bool) -> None:
    """Refuse a path whose placeholders are not exactly the job id parts (each once), or any at submission."""
    wanted = [f"{{{part}}}" for part in parts]
    shown = "".join(f"/{p}" for p in wanted)
    example = f'"/v1/jobs{shown}"' if names_the_job else '"/v1/jobs"'
    placeholders = PLACEHOLDER_RE.findall(value)
    if not names_the_job:
        if placeholders:
            raise refuse(
                f"{value!r} contains {', '.join(sorted(set(placeholders)))}, but no job exists yet at submission",
                f"remove it, e.g. {example}",
                key=key,
            )
        return
    for segment in value.split("?")[0].split("/"):
        held = PLACEHOLDER_RE.findall(segment)
        if len(held) > 1:
            adjacent = "}{" in segment
            raise refuse(
                f"{value!r} puts {' and '.join(held)} "
                + ("next to each other" if adjacent else "in one path segment")
                + ", so a job id could not be told apart from its neighbour",
                "give each placeholder its own path segment, e.g. " + example,
                key=key,
            )
    others = sorted({p for p in placeholders if p not in wanted})
    if others:
        raise refuse(
            f"{value!r} has placeholder(s) {', '.join(others)}; only {', '.join(wanted)} "
            + ("is" if len(wanted) == 1 else "are")
            + " filled in",
            "remove them or write them literally, or name them in job_id_parts, e.g. " + example,
            key=key,
        )
    for placeholder in wanted:
        count = placeholders.count(placeholder)
        if count != 1:
            problem = (
                f"does not contain {placeholder}" if count == 0 else f"contains {placeholder} more than once"
            )
            raise refuse(
                f"{value!r} {problem}",
                f"put {placeholder} exactly once where it goes, e.g. {example}",
                key=key,
            )


def check_fixed_headers(value: dict[str, str]) -> dict[str, str]:
    """Refuse a ``[headers]`` name pollwarden sets or that changes framing, and a value with control characters.

    Credential names are refused by ``ProviderTable``, which also knows what ``[auth]`` and ``[submit]`` send.
    """
    for name, text in value.items():
        check_header_name(name)
        # Credential names (Cookie among them) are refused with their own message by ProviderTable.
        if name.lower() in OWN_HEADERS - CREDENTIAL_HEADERS or name.lower().startswith("proxy-"):
            raise refuse(
                f"{name!r} is set by pollwarden or changes how requests are framed",
                "remove it from [headers]",
            )
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
            # A CR/LF would smuggle extra headers into every request.
            raise refuse(f"the value of {name!r} contains control characters", "use plain text")
    return value


class AuthSpec(BaseModel):
    """How the server authenticates: a secret read from its own environment, sent in one header."""

    model_config = MODEL_CONFIG

    env: str = Field(description='the name of an environment variable holding the secret, e.g. "ACME_TOKEN"')
    header: str = Field(default="Authorization", description='an HTTP header name, e.g. "Authorization"')
    prefix: str = Field(default="", description='text put before the secret, e.g. "Bearer "')
    shared_with_origins: Annotated[tuple[StrictStr, ...], Field(strict=False)] = Field(
        default=(),
        description='origins of other tables allowed to use the same variable, e.g. ["https://api.acme.example"]',
    )

    @field_validator("env")
    @classmethod
    def _env_is_a_variable_name(cls, value: str) -> str:
        if not ENV_RE.fullmatch(value):
            # The value is not echoed: people paste the token itself here.
            raise refuse(
                "the value is not an environment variable name",
                'name the variable that holds the secret, not the secret, e.g. "ACME_TOKEN"',
            )
        if value.upper().startswith(OWN_ENV_PREFIX):
            raise refuse(
                f"{value!r} is one of pollwarden's own variables, which are never sent to a provider",
                'name a variable that holds this provider\'s credential, e.g. "ACME_TOKEN"',
            )
        return value

    @field_validator("header")
    @classmethod
    def _header_is_a_token(cls, value: str) -> str:
        check_header_name(value)
        lower = value.lower()
        if lower in OWN_HEADERS or lower in _ROUTING_HEADERS or lower.startswith(("proxy-", "x-forwarded-")):
            raise refuse(
                f"{value!r} is a hop-by-hop, routing or framing header: a proxy would consume, forward "
                "or re-route a credential sent in it",
                'send the credential in the header the provider documents, e.g. "Authorization" or "x-api-key"',
            )
        return value

    @field_validator("shared_with_origins")
    @classmethod
    def _origins_are_origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            parts = urlsplit(origin)
            if (
                parts.scheme not in _DEFAULT_PORTS
                or not parts.netloc
                or "@" in parts.netloc
                or parts.path not in ("", "/")
                or parts.query
                or parts.fragment
                or has_control_or_space(origin)
            ):
                raise refuse(
                    f"{origin!r} is not an origin",
                    'write scheme, host and optional port only, e.g. "https://api.acme.example"',
                )
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix_cannot_inject(cls, value: str) -> str:
        # A CR/LF here would let the table smuggle extra headers into every request.
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
            raise refuse("the prefix contains control characters", 'use plain text such as "Bearer "')
        return value


class SubmitSpec(BaseModel):
    """The provider's submit call; without it ``start_operation`` can only track existing jobs."""

    model_config = MODEL_CONFIG

    path: str = Field(description='a path on base_url starting with "/", e.g. "/v1/jobs"')
    method: Literal["POST", "PUT"] = Field(default="POST", description='"POST" or "PUT"')
    idempotency_header: str | None = Field(
        default=None,
        description='an HTTP header name, e.g. "Idempotency-Key" (omit it if the provider has none)',
    )
    job_id_field: str | None = Field(
        default=None,
        description='a dotted path to the job id in the JSON reply, e.g. "id" (omit it to use Location)',
    )

    @field_validator("path")
    @classmethod
    def _path_is_relative(cls, value: str) -> str:
        return check_path(value, example='"/v1/jobs"')

    @field_validator("idempotency_header")
    @classmethod
    def _header_is_a_token(cls, value: str | None) -> str | None:
        return check_header_name(value)

    @field_validator("job_id_field")
    @classmethod
    def _field_is_dotted(cls, value: str | None) -> str | None:
        return check_dotted_path(value)


class CancelSpec(BaseModel):
    """The provider's documented cancel call; without it nobody can cancel through pollwarden."""

    model_config = MODEL_CONFIG

    path: str = Field(
        description='a path on base_url containing {job_id} once, e.g. "/v1/jobs/{job_id}/cancel"'
    )
    method: Literal["POST", "PUT", "DELETE"] = Field(default="POST", description='"POST", "PUT" or "DELETE"')

    @field_validator("path")
    @classmethod
    def _path_is_relative(cls, value: str) -> str:
        return check_path(value, example='"/v1/jobs/{job_id}/cancel"')
