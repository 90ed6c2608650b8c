"""Building provider requests that cannot leave the table's origin.

The agent supplies job ids and payloads, never URLs: a job id is
percent-encoded as one path segment, so `../admin`, `a/b`, `x?y=1` and
`%2e%2e` stay inside the segment.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote, unquote, urljoin, urlsplit

from pollwarden_providers.table import ProviderTable


class EgressError(ValueError):
    """A URL would leave the provider's origin."""


class MissingCredentialError(LookupError):
    """The environment variable the table names for credentials is not set."""


def encode_job_id(job_id: str) -> str:
    """The job id as a single, fully percent-encoded path segment."""
    # safe="" encodes "/" too; "%" is encoded, so "%2e%2e" cannot decode into "..".
    return quote(job_id, safe="")


def job_url(table: ProviderTable, path_template: str, job_id: str) -> str:
    """The absolute URL of `path_template` with `job_id` on the table's origin."""
    path = path_template.replace("{job_id}", encode_job_id(job_id))
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


def resolve_location(table: ProviderTable, base_url: str, location: str) -> str:
    """Resolve a `Location` header against `base_url`; refuse other origins."""
    absolute = urljoin(base_url, location.strip())
    ensure_same_origin(table, absolute)
    return absolute


def job_id_from_location(table: ProviderTable, location_url: str) -> str | None:
    """The job id from a same-origin `Location` that matches the table's status path."""
    template = table.status_path
    prefix, _, suffix = template.partition("{job_id}")
    path = urlsplit(location_url).path
    if not path.startswith(prefix) or not path.endswith(suffix):
        return None
    segment = path[len(prefix) : len(path) - len(suffix)] if suffix else path[len(prefix) :]
    if not segment or "/" in segment:
        return None
    return unquote(segment)


def auth_headers(table: ProviderTable, environ: Mapping[str, str]) -> dict[str, str]:
    """The credential header read from the environment variable the table names.

    Raises `MissingCredentialError` when the table asks for one and it is unset,
    so nothing is ever sent unauthenticated by accident.
    """
    if table.auth is None:
        return {}
    value = environ.get(table.auth.env)
    if not value:
        raise MissingCredentialError(
            f"provider {table.name!r} needs credentials in the environment variable {table.auth.env}; "
            f"set it in the server's environment (it is never shown to the agent)"
        )
    return {table.auth.header: table.auth.prefix + value}
