"""Bearer tokens on streamable HTTP: the verifiers behind the MCP SDK's own auth.

pollwarden is an OAuth 2.1 resource server. The SDK's bearer middleware reads
the ``Authorization`` header, asks a `TokenVerifier` (one of these) for an
`AccessToken`, answers 401/403 with a ``WWW-Authenticate`` header naming the
RFC 9728 metadata URL, and serves that metadata. The verifiers only decide
whether a token is good and for whom:

* `TokenFileVerifier`: a file of SHA-256 hashes of random tokens, one line per
  token (``sha256:<hex> NAME SCOPE[,SCOPE]``), for a team without an identity
  provider. The file never holds a token; it is re-read when it changes.
* `JwtVerifier`: JWT access tokens from an external issuer, checked against
  its JWKS: an asymmetric signature by a published key, ``iss``, ``aud`` (this
  server's resource URL), ``exp``/``nbf`` with a small leeway, a principal
  claim. Keys are cached; an unknown ``kid`` refreshes them at most once per
  ``min_refresh_seconds``; the cache is dropped after ``max_age_seconds`` so a
  removed key stops working.

A verifier returns None for every bad token (the middleware answers 401) and
logs why at debug level, never the token or its hash. ``pollwarden:operator``
implies ``pollwarden:agent``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import anyio

from pollwarden.access.principals import (
    KNOWN_SCOPES,
    SCOPE_AGENT,
    SCOPE_OPERATOR,
    jwt_principal,
    principal_name_problem,
)
from pollwarden.cli.options import with_examples
from pollwarden.core.errors import ConfigError
from pollwarden.core.files import trust_file_problem, write_private_file

if TYPE_CHECKING:  # imported where a token is verified: `pollwarden tokens` and the CLI need none of it
    import httpx2
    import jwt
    from mcp.server.auth.provider import AccessToken, TokenVerifier
    from mcp.server.auth.settings import AuthSettings

__all__ = [
    "TOKENS_ENV",
    "AuthOptions",
    "JwtVerifier",
    "TokenFileVerifier",
    "add_token_commands",
    "auth_settings",
    "build_verifier",
    "hash_token",
]

log = logging.getLogger("pollwarden")

TOKENS_ENV = "POLLWARDEN_AUTH_TOKENS"
TOKEN_PREFIX = "pwt_"
_HASH_PREFIX = "sha256:"
# Asymmetric algorithms only: a JWKS publishes public keys, and an HMAC "signed" with a public key is forgeable.
ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
MAX_JWKS_BYTES = 256 * 1024


def hash_token(token: str) -> str:
    """How a token is stored: its SHA-256 (the tokens are 256 random bits, so a fast hash is enough)."""
    return _HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def _with_implied(scopes: Sequence[str]) -> list[str]:
    """The scopes, with ``pollwarden:agent`` added when ``pollwarden:operator`` is there."""
    out = list(dict.fromkeys(scopes))
    if SCOPE_OPERATOR in out and SCOPE_AGENT not in out:
        out.append(SCOPE_AGENT)
    return out


# -- the token file -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenEntry:
    """One line of the token file: a token's hash, whom it names and its scopes."""

    token_hash: str
    name: str
    scopes: tuple[str, ...]

    def line(self) -> str:
        """The entry as a line of the file."""
        return f"{self.token_hash} {self.name} {','.join(self.scopes)}"


def _scopes_problem(scopes: Sequence[str]) -> str | None:
    unknown = [s for s in scopes if s not in KNOWN_SCOPES]
    if not scopes or unknown:
        return f"scopes must be one or more of {', '.join(KNOWN_SCOPES)} (got {', '.join(scopes) or 'none'})"
    return None


def parse_token_file(path: Path, text: str) -> list[TokenEntry]:
    """The entries of a token file; a wrong line is refused naming the file, the line and the fix."""
    entries: list[TokenEntry] = []
    names: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        where = f"{path} line {number}"
        if (
            len(parts) != 3
            or not parts[0].startswith(_HASH_PREFIX)
            or len(parts[0]) != len(_HASH_PREFIX) + 64
        ):
            raise ConfigError(
                f"{where}: expected 'sha256:<64 hex digits> NAME SCOPE[,SCOPE]'; "
                "add tokens with `pollwarden tokens add NAME --scopes pollwarden:agent`"
            )
        token_hash, name, scope_text = parts
        if (problem := principal_name_problem(name)) is not None:
            raise ConfigError(f"{where}: the name {problem}")
        scopes = tuple(s for s in scope_text.split(",") if s)
        if (problem := _scopes_problem(scopes)) is not None:
            raise ConfigError(f"{where}: {problem}")
        entries.append(TokenEntry(token_hash.lower(), name, scopes))
        names.add(name)
    return entries


def read_token_file(path: Path) -> list[TokenEntry]:
    """The entries of the token file at `path` (an absent file has none; an unsafe one is refused)."""
    if (problem := trust_file_problem(path, "the token file", "could add a token of any scope")) is not None:
        raise ConfigError(f"refusing {problem}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc}") from exc
    return parse_token_file(path, text)


class TokenFileVerifier:
    """Tokens whose SHA-256 is listed in a file; the file is re-read when it changes."""

    def __init__(self, path: Path) -> None:
        """Read `path` now (a wrong file is refused at start-up, not at the first call)."""
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._by_hash: dict[str, TokenEntry] = {}
        self._reload()
        if not self._by_hash:
            raise ConfigError(
                f"the token file {path} holds no tokens; add one with "
                f"`pollwarden tokens add NAME --scopes {SCOPE_AGENT} --file {path}`"
            )

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _reload(self) -> None:
        stamp = self._file_stamp()
        if stamp == self._stamp and self._stamp is not None:
            return
        entries = read_token_file(self.path)
        self._by_hash = {e.token_hash: e for e in entries}
        self._stamp = stamp

    async def verify_token(self, token: str) -> AccessToken | None:
        """The token's principal and scopes, or None when its hash is not listed."""
        try:
            self._reload()
        except ConfigError as exc:
            log.error("token file unusable, keeping the last good copy: %s", exc)
        wanted = hash_token(token)
        entry = None
        for known, candidate in self._by_hash.items():
            if hmac.compare_digest(known, wanted):
                entry = candidate
        if entry is None:
            log.debug("bearer token refused: not in the token file")
            return None
        from mcp.server.auth.provider import AccessToken

        return AccessToken(token=token, client_id=entry.name, scopes=_with_implied(entry.scopes))


# -- JWT against a JWKS -------------------------------------------------------------------------


@dataclass
class JwtVerifier:
    """JWT access tokens signed by a key in the issuer's JWKS (see the module docstring)."""

    issuer: str
    audience: str
    jwks_url: str
    principal_claim: str = "sub"
    leeway_seconds: float = 30.0
    min_refresh_seconds: float = 30.0
    max_age_seconds: float = 300.0
    now: Callable[[], float] = time.time
    transport: httpx2.AsyncBaseTransport | None = None
    _keys: dict[str, jwt.PyJWK] = field(default_factory=lambda: {}, init=False)
    _fetched_at: float | None = field(default=None, init=False)
    _lock: anyio.Lock = field(default_factory=anyio.Lock, init=False)
    fetches: int = field(default=0, init=False)

    async def _fetch(self) -> None:
        import httpx2
        import jwt

        self.fetches += 1
        self._fetched_at = self.now()
        try:
            async with httpx2.AsyncClient(
                transport=self.transport, timeout=10.0, follow_redirects=False
            ) as client:
                response = await client.get(self.jwks_url, headers={"Accept": "application/json"})
            if response.status_code != 200 or len(response.content) > MAX_JWKS_BYTES:
                raise ValueError(f"HTTP {response.status_code}, {len(response.content)} bytes")
            document = cast(object, response.json())
        except (httpx2.HTTPError, ValueError) as exc:
            log.warning(
                "JWKS %s could not be fetched (%s); keeping the keys already known", self.jwks_url, exc
            )
            return
        keys: dict[str, jwt.PyJWK] = {}
        raw_keys: object = (
            cast(dict[str, object], document).get("keys") if isinstance(document, dict) else None
        )
        for raw in cast(list[object], raw_keys) if isinstance(raw_keys, list) else []:
            if not isinstance(raw, dict):
                continue
            data = cast(dict[str, Any], raw)
            kid = data.get("kid")
            if not isinstance(kid, str) or data.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(data)
            except jwt.PyJWTError:
                continue
            if key.algorithm_name in ASYMMETRIC_ALGORITHMS:
                keys[kid] = key
        self._keys = keys

    async def _key(self, kid: str) -> jwt.PyJWK | None:
        async with self._lock:
            stale = self._fetched_at is None or self.now() - self._fetched_at >= self.max_age_seconds
            may_refresh = (
                self._fetched_at is None or self.now() - self._fetched_at >= self.min_refresh_seconds
            )
            if stale or (kid not in self._keys and may_refresh):
                if stale:
                    self._keys = {}  # a key the issuer removed must not outlive the cache
                await self._fetch()
            return self._keys.get(kid)

    async def verify_token(self, token: str) -> AccessToken | None:
        """The token's principal and scopes, or None (logged at debug level, without the token)."""
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            log.debug("bearer token refused: not a JWT")
            return None
        kid, alg = header.get("kid"), header.get("alg")
        if not isinstance(kid, str) or alg not in ASYMMETRIC_ALGORITHMS:
            log.debug("bearer token refused: algorithm %r or key id missing", alg)
            return None
        key = await self._key(kid)
        if key is None or key.algorithm_name != alg:
            log.debug("bearer token refused: key %r unknown or for another algorithm", kid)
            return None
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False, "require": ["exp"]},
            )
        except jwt.PyJWTError as exc:
            log.debug("bearer token refused: %s", type(exc).__name__)
            return None
        return self._access(token, claims)

    def _access(self, token: str, claims: Mapping[str, Any]) -> AccessToken | None:
        now = self.now()
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if not isinstance(exp, int | float) or now > exp + self.leeway_seconds:
            log.debug("bearer token refused: expired")
            return None
        if nbf is not None and (not isinstance(nbf, int | float) or now + self.leeway_seconds < nbf):
            log.debug("bearer token refused: not valid yet")
            return None
        claim = claims.get(self.principal_claim)
        name = jwt_principal(claim) if isinstance(claim, str) else None  # "jwt:<claim>": never a token file's
        if name is None:
            log.debug("bearer token refused: claim %r does not name a usable principal", self.principal_claim)
            return None
        raw_scope = claims.get("scope", claims.get("scp", ""))
        scopes: list[str] = (
            raw_scope.split()
            if isinstance(raw_scope, str)
            else [s for s in cast(list[object], raw_scope) if isinstance(s, str)]
            if isinstance(raw_scope, list)
            else []
        )
        subject = claims.get("sub")
        from mcp.server.auth.provider import AccessToken

        return AccessToken(
            token=token,
            client_id=name,
            scopes=_with_implied(scopes),
            expires_at=int(exp + self.leeway_seconds),  # the SDK checks it again, without a leeway
            resource=self.audience,
            subject=subject if isinstance(subject, str) else None,
            claims={"iss": self.issuer},
        )


class EitherVerifier:
    """The token file first (a hash look-up), then the JWT issuer."""

    def __init__(self, verifiers: Sequence[TokenVerifier]) -> None:
        """Try `verifiers` in order."""
        self.verifiers = tuple(verifiers)

    async def verify_token(self, token: str) -> AccessToken | None:
        """The first verifier's answer that accepts the token."""
        for verifier in self.verifiers:
            access = await verifier.verify_token(token)
            if access is not None:
                return access
        return None


# -- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuthOptions:
    """Which verifiers ``pollwarden serve --transport http`` uses, and the resource URL tokens are for."""

    token_file: Path | None = None
    jwt_issuer: str | None = None
    jwt_jwks_url: str | None = None
    jwt_audience: str | None = None
    jwt_principal_claim: str = "sub"
    resource_url: str | None = None

    @property
    def configured(self) -> bool:
        """Whether any verifier is configured."""
        return self.token_file is not None or self.jwt_issuer is not None


def _url_problem(url: str, *, what: str, loopback_http: bool = True) -> str | None:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "https" and host:
        return None
    from pollwarden.surface.listening import is_loopback

    if parts.scheme == "http" and host and loopback_http and is_loopback(host):
        return None
    return f"{what} {url!r} must be an https:// URL (http:// only on a loopback address)"


def resource_url_for(options: AuthOptions, *, host: str, port: int) -> str:
    """The URL tokens must be issued for: ``--resource-url``, or the loopback address served."""
    if options.resource_url:
        return options.resource_url
    bare = host.strip("[]")
    shown = f"[{bare}]" if ":" in bare else bare
    return f"http://{shown}:{port}/mcp"


def build_verifier(
    options: AuthOptions,
    *,
    resource_url: str,
    now: Callable[[], float] = time.time,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> TokenVerifier | None:
    """The configured verifier (None when none is), refusing a wrong configuration with the fix."""
    verifiers: list[TokenVerifier] = []
    if options.token_file is not None:
        verifiers.append(TokenFileVerifier(options.token_file))
    if options.jwt_issuer is not None:
        if (problem := _url_problem(options.jwt_issuer, what="--jwt-issuer")) is not None:
            raise ConfigError(problem)
        jwks = options.jwt_jwks_url or options.jwt_issuer.rstrip("/") + "/.well-known/jwks.json"
        if (problem := _url_problem(jwks, what="--jwt-jwks-url")) is not None:
            raise ConfigError(problem)
        verifiers.append(
            JwtVerifier(
                issuer=options.jwt_issuer,
                audience=options.jwt_audience or resource_url,
                jwks_url=jwks,
                principal_claim=options.jwt_principal_claim,
                now=now,
                transport=transport,
            )
        )
    elif options.jwt_jwks_url or options.jwt_audience:
        raise ConfigError("--jwt-jwks-url and --jwt-audience need --jwt-issuer URL (the tokens' iss)")
    if not verifiers:
        return None
    return verifiers[0] if len(verifiers) == 1 else EitherVerifier(verifiers)


def auth_settings(options: AuthOptions, *, resource_url: str) -> AuthSettings:
    """The SDK's settings: every MCP request needs ``pollwarden:agent``; the metadata names the issuer."""
    if (problem := _url_problem(resource_url, what="--resource-url")) is not None:
        raise ConfigError(problem)
    # Without an identity provider (the token file) this server is its own "issuer": nobody runs a flow.
    issuer = options.jwt_issuer or resource_url
    from mcp.server.auth.settings import AuthSettings

    return AuthSettings(
        issuer_url=issuer,  # pyright: ignore[reportArgumentType]  (pydantic validates the string)
        resource_server_url=resource_url,  # pyright: ignore[reportArgumentType]
        required_scopes=[SCOPE_AGENT],
        validate_token_resource=False,  # the verifiers check the audience themselves
    )


# -- `pollwarden tokens` ------------------------------------------------------------------------


def default_token_file(environ: Mapping[str, str] = os.environ) -> Path:
    """``$POLLWARDEN_AUTH_TOKENS``, else ``tokens`` beside the default database."""
    from pollwarden.config import default_db_path

    value = environ.get(TOKENS_ENV)
    return Path(value).expanduser() if value else default_db_path(environ).parent / "tokens"


def _token_file(args: argparse.Namespace) -> Path:
    return Path(args.file).expanduser() if args.file else default_token_file()


def _write_entries(path: Path, entries: Sequence[TokenEntry]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with write_private_file(path) as handle:
        handle.write("# pollwarden bearer tokens: sha256:<hash of the token> NAME SCOPES (never the token)\n")
        for entry in entries:
            handle.write(entry.line() + "\n")


def cmd_tokens_add(args: argparse.Namespace) -> int:
    """Create a random token for NAME, store only its hash, print the token once."""
    path = _token_file(args)
    name: str = args.name
    if (problem := principal_name_problem(name)) is not None:
        raise ConfigError(f"NAME {name!r} {problem}")
    scopes = tuple(s for part in args.scopes for s in part.split(",") if s)
    if (problem := _scopes_problem(scopes)) is not None:
        raise ConfigError(f"--scopes: {problem}")
    entries = read_token_file(path)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    _write_entries(path, [*entries, TokenEntry(hash_token(token), name, scopes)])
    print(token)
    print(
        f"added a token for {name} ({','.join(scopes)}) to {path}; only its hash is stored, so copy it now "
        "(it is not shown again). Clients send it as 'Authorization: Bearer <token>'.",
        file=sys.stderr,
    )
    return 0


def cmd_tokens_list(args: argparse.Namespace) -> int:
    """List the principals and scopes in the token file (never a hash)."""
    path = _token_file(args)
    entries = read_token_file(path)
    if not entries:
        print(f"no tokens in {path}", file=sys.stderr)
    for index, entry in enumerate(entries, start=1):
        print(f"{index}\t{entry.name}\t{','.join(entry.scopes)}")
    return 0


def cmd_tokens_remove(args: argparse.Namespace) -> int:
    """Remove every token of NAME (they stop working at once: the server re-reads the file)."""
    path = _token_file(args)
    entries = read_token_file(path)
    kept = [e for e in entries if e.name != args.name]
    if len(kept) == len(entries):
        print(
            f"no token for {args.name!r} in {path}; `pollwarden tokens list` shows the names", file=sys.stderr
        )
        return 1
    _write_entries(path, kept)
    print(f"removed {len(entries) - len(kept)} token(s) of {args.name} from {path}", file=sys.stderr)
    return 0


def add_token_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """Add ``tokens add|list|remove``."""
    tokens = sub.add_parser("tokens", help="bearer tokens for HTTP serving (the file stores only hashes)")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True)

    def file_option(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--file", metavar="FILE", help=f"the token file (env {TOKENS_ENV}; default: beside the database)"
        )

    add = tokens_sub.add_parser("add", help="create a token for NAME; prints it once, stores its hash")
    add.add_argument("name", metavar="NAME", help="the principal the token acts as (recorded as owner)")
    add.add_argument(
        "--scopes",
        action="append",
        required=True,
        metavar="SCOPES",
        help=f"comma-separated: {SCOPE_AGENT} (its own operations), {SCOPE_OPERATOR} (every operation, approvals)",
    )
    file_option(add)
    add.set_defaults(func=cmd_tokens_add)
    with_examples(
        add,
        f"pollwarden tokens add alice --scopes {SCOPE_AGENT} --file /etc/pollwarden/tokens",
        f"pollwarden tokens add oncall --scopes {SCOPE_OPERATOR}",
    )
    listing = tokens_sub.add_parser("list", help="the names and scopes in the token file")
    file_option(listing)
    listing.set_defaults(func=cmd_tokens_list)
    with_examples(listing, "pollwarden tokens list --file /etc/pollwarden/tokens")
    remove = tokens_sub.add_parser("remove", help="remove NAME's tokens")
    remove.add_argument("name", metavar="NAME")
    file_option(remove)
    remove.set_defaults(func=cmd_tokens_remove)
    with_examples(remove, "pollwarden tokens remove alice --file /etc/pollwarden/tokens")
