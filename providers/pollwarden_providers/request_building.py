"""Building provider requests that cannot leave the table's origin.

The agent supplies job ids and payloads, never URLs: a job id is
percent-encoded as one path segment, so `../admin`, `a/b`, `x?y=1` and
`%2e%2e` stay inside the segment. The ids `.` and `..` are refused outright:
URL normalisation would turn them into "this directory" and "the parent".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import quote, unquote, urljoin, urlsplit, urlunsplit

from pollwarden_providers.errors import PollwardenError
from pollwarden_providers.table import ProviderTable
from pollwarden_providers.table_request import OWN_ENV_PREFIX


class EgressError(PollwardenError, ValueError):
    """A URL would leave the provider's origin."""


class MissingCredentialError(PollwardenError, LookupError):
    """The environment variable the table names for credentials is not set (or unusable)."""


# A job id longer than this is refused: no provider documents such ids.
MAX_JOB_ID_LENGTH = 256
# A credential shorter than this is not redacted from provider answers
# (replacing every "ab" in a body would corrupt it); such a secret is no secret.
MIN_REDACTED_SECRET_LENGTH = 6
REDACTED = "[redacted]"


def job_id_problem(job_id: str) -> str | None:
    """Why `job_id` cannot be sent as a path segment, or None when it can."""
    if not job_id.strip():
        return "it is empty"
    if len(job_id) > MAX_JOB_ID_LENGTH:
        return f"it is longer than {MAX_JOB_ID_LENGTH} characters"
    if job_id in (".", ".."):
        return f"{job_id!r} would be read as a relative path, not a job id"
    return None


def job_id_form(table: ProviderTable) -> str:
    """How an agent writes a job id for `table`: ``job_id``, or ``owner/repo/run_id`` for a multi-part id."""
    return "/".join(table.job_id_parts)


def split_job_id(table: ProviderTable, job_id: str) -> dict[str, str] | str:
    """The job id's parts by placeholder name, or why it cannot be one.

    A one-part id is one segment whatever it contains ("/" included). A
    multi-part id is split on "/" into exactly the table's parts, each then
    checked and encoded as its own segment.
    """
    parts = table.job_id_parts
    if len(parts) == 1:
        problem = job_id_problem(job_id)
        return {parts[0]: job_id} if problem is None else problem
    if len(job_id) > MAX_JOB_ID_LENGTH:
        return f"it is longer than {MAX_JOB_ID_LENGTH} characters"
    pieces = job_id.split("/")
    if len(pieces) != len(parts):
        return f"it has {len(pieces)} part(s); write it as {job_id_form(table)} ({len(parts)} parts joined by '/')"
    for name, piece in zip(parts, pieces, strict=True):
        problem = job_id_problem(piece)
        if problem is not None:
            return f"its {name} part is refused: {problem}"
    return dict(zip(parts, pieces, strict=True))


def repeated_job_id(table: ProviderTable, job_id: str) -> str:
    """What a status body repeats of `job_id` (``response.job_id_field``): the id, or a multi-part id's last part."""
    return job_id.rsplit("/", 1)[-1] if len(table.job_id_parts) > 1 else job_id


def job_id_problem_for(table: ProviderTable, job_id: str) -> str | None:
    """Why `job_id` is not a usable id for `table`, or None when it is."""
    split = split_job_id(table, job_id)
    return split if isinstance(split, str) else None


def encode_job_id(job_id: str) -> str:
    """The job id as a single, fully percent-encoded path segment (`EgressError` if it cannot be one)."""
    problem = job_id_problem(job_id)
    if problem is not None:
        raise EgressError(f"refusing job id: {problem}")
    # safe="" encodes "/" too; "%" is encoded, so "%2e%2e" cannot decode into "..".
    return quote(job_id, safe="")


def job_url(table: ProviderTable, path_template: str, job_id: str) -> str:
    """The absolute URL of `path_template` with `job_id` (each of its parts one segment) on the table's origin."""
    split = split_job_id(table, job_id)
    if isinstance(split, str):
        raise EgressError(f"refusing job id: {split}")
    path = path_template
    for name, piece in split.items():
        path = path.replace(f"{{{name}}}", encode_job_id(piece))
    url = table.origin + path
    ensure_same_origin(table, url)
    return url


def status_url(table: ProviderTable, job_id: str) -> str:
    """The status URL for `job_id`."""
    return job_url(table, table.status_path, job_id)


def submit_url(table: ProviderTable) -> str:
    """The submission URL; the table must have `[submit]`."""
    if table.submit is None:
        raise EgressError(f"provider {table.name!r} has no [submit] section")
    url = table.origin + table.submit.path
    ensure_same_origin(table, url)
    return url


def origin_of(url: str) -> str:
    """`scheme://host[:port]`, lower-cased, default ports dropped."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    port = parts.port
    if port is None or (scheme, port) in (("http", 80), ("https", 443)):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def ensure_same_origin(table: ProviderTable, url: str) -> None:
    """Raise `EgressError` unless `url` is on the table's origin and carries no userinfo."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None or origin_of(url) != table.origin:
        raise EgressError(
            f"refusing a request to {origin_of(url)}: provider {table.name!r} is {table.origin}"
        )


def describe_location(location: str, limit: int = 200) -> str:
    """A `Location` header as safe to note: no user name, password, query or fragment; one line, capped."""
    text = "".join(ch for ch in location.strip() if ch.isprintable())
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "(an unparseable Location)"
    netloc = f"{host}{port}" if parts.netloc else ""
    shown = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    if parts.query or parts.fragment or parts.username is not None:
        shown += " (credentials, query or fragment not shown)"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def resolve_location(table: ProviderTable, base_url: str, location: str) -> str:
    """Resolve a `Location` header against `base_url`; refuse other origins."""
    absolute = urljoin(base_url, location.strip())
    ensure_same_origin(table, absolute)
    return absolute


_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


def match_path(template: str, path: str) -> dict[str, str] | None:
    """The placeholder values of `path` matched against `template`, segment by segment, or None.

    Linear in the length of `path`: a table holds at most one placeholder per
    segment (refused at load otherwise), so each segment is a literal prefix,
    at most one placeholder and a literal suffix, and nothing backtracks however
    a provider's ``Location`` is crafted.
    """
    wanted = template.split("/")
    given = path.split("/")
    if len(wanted) != len(given):
        return None
    values: dict[str, str] = {}
    for pattern, segment in zip(wanted, given, strict=True):
        found = _PLACEHOLDER.search(pattern)
        if found is None:
            if pattern != segment:
                return None
            continue
        prefix, suffix = pattern[: found.start()], pattern[found.end() :]
        if (
            len(segment) <= len(prefix) + len(suffix)
            or not segment.startswith(prefix)
            or not segment.endswith(suffix)
        ):
            return None
        values[found.group(1)] = segment[len(prefix) : len(segment) - len(suffix)]
    return values


def job_id_from_location(table: ProviderTable, location_url: str) -> str | None:
    """The job id from a same-origin `Location` that matches the table's status path."""
    values = match_path(table.status_path, urlsplit(location_url).path)
    if values is None or any(name not in values for name in table.job_id_parts):
        return None
    pieces = [unquote(values[name]) for name in table.job_id_parts]
    if len(pieces) > 1 and any("/" in piece for piece in pieces):
        return None  # an encoded "/" inside one part could not be told apart from the separator
    job_id = "/".join(pieces)
    return job_id if job_id_problem_for(table, job_id) is None else None


def auth_headers(table: ProviderTable, environ: Mapping[str, str]) -> dict[str, str]:
    """The credential header read from the environment variable the table names.

    Raises `MissingCredentialError` when the table asks for one and it is unset,
    so nothing is ever sent unauthenticated by accident.
    """
    if table.auth is None:
        return {}
    if table.auth.env.upper().startswith(OWN_ENV_PREFIX):
        # Refused at load too; checked again here because this is where a secret would leave.
        raise MissingCredentialError(
            f"provider {table.name!r} names {table.auth.env}, one of pollwarden's own variables, which are "
            "never sent to a provider; name the provider's own credential variable in its [auth]"
        )
    value = environ.get(table.auth.env)
    if not value:
        raise MissingCredentialError(
            f"provider {table.name!r} needs credentials in the environment variable {table.auth.env}; "
            f"set it in the server's environment (it is never shown to the agent)"
        )
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        # The value is never echoed: the HTTP client would refuse it with the value in its message.
        raise MissingCredentialError(
            f"the environment variable {table.auth.env} (credentials for provider {table.name!r}) contains "
            "a line break or another control character; set it to the bare token"
        )
    return {table.auth.header: table.auth.prefix + value}


def secret_values(table: ProviderTable, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The credential values to redact from anything a provider sends back."""
    if table.auth is None:
        return ()
    value = environ.get(table.auth.env) or ""
    return (value,) if len(value) >= MIN_REDACTED_SECRET_LENGTH else ()
