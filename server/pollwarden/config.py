"""Operator configuration: flags and environment, with their defaults."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pollwarden.access.operator_keys import OperatorPolicy, load_policy
from pollwarden.access.principals import PrincipalLimits
from pollwarden.core.errors import ConfigError
from pollwarden.store.location import DatabaseLocation
from pollwarden_providers.loader import TableError, load_tables
from pollwarden_providers.table import ProviderTable

# The longest wait_seconds a check_status call honours, and the tool schema's maximum: what the call budget
# leaves with the default 20 s request cap (55 s − 20 s − the 5 s margin, `schedule.wait_bound`). A server
# with a longer request cap waits less (the call budget wins); tests/unit/test_call_budget.py holds them equal.
MAX_WAIT_SECONDS = 30.0
# How long a write waits for another process's lock before giving up with a clear error.
BUSY_TIMEOUT_SECONDS = 5.0
BUSY_TIMEOUT_ENV = "POLLWARDEN_BUSY_TIMEOUT_SECONDS"
DB_ENV = "POLLWARDEN_DB"

ApprovalMode = Literal["elicitation", "tool-confirmation"]
# What `--approval` accepts: a mode, or "app" (elicitation, plus Approve/Deny on the MCP App card).
APPROVAL_CHOICES = ("elicitation", "tool-confirmation", "app", "elicitation,app")

# The key(s) sealing the 2026-07-28 era's request state, comma-separated (the first seals, all unseal).
STATE_KEY_ENV = "POLLWARDEN_STATE_KEY"
MIN_STATE_KEY_LENGTH = 32


def state_keys_from_env(environ: Mapping[str, str] = os.environ) -> tuple[bytes, ...]:
    """The request-state keys from POLLWARDEN_STATE_KEY (none when unset); a short key is a ConfigError.

    Every HTTP instance serving one database must share them: an approval asked
    through one instance may be answered through another, or after a restart.
    The key is never printed.
    """
    raw = environ.get(STATE_KEY_ENV, "")
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    for index, key in enumerate(keys, start=1):
        if len(key) < MIN_STATE_KEY_LENGTH:
            raise ConfigError(
                f"{STATE_KEY_ENV}: key {index} has {len(key)} characters; use at least "
                f"{MIN_STATE_KEY_LENGTH} random ones, e.g. the output of: openssl rand -hex 32"
            )
    return tuple(k.encode("utf-8") for k in keys)


def default_db_path(environ: Mapping[str, str] = os.environ) -> Path:
    """A file in the user's data directory (XDG on Linux, Application Support on macOS)."""
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    elif sys.platform == "win32":
        base = Path(environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "pollwarden" / "pollwarden.db"


@dataclass(frozen=True)
class ExtensionCaps:
    """Operator caps on what one person's approval can add."""

    max_extensions_per_operation: int = 3
    max_extra_seconds: float = 3600.0
    max_extra_status_requests: int = 20


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs that is not in a provider table."""

    database: DatabaseLocation
    provider_dirs: tuple[Path, ...] = ()
    approval_mode: ApprovalMode = "elicitation"
    approval_ttl_seconds: float = 900.0
    # Approve/Deny on the MCP App card (`--approval app`, issue 32); subject to `app_card.app_channel_refusal`.
    app_channel: bool = False
    caps: ExtensionCaps = field(default_factory=ExtensionCaps)
    max_wait_seconds: float = MAX_WAIT_SECONDS
    progress_interval_seconds: float = 5.0
    # The lease on one in-flight request; None means the controller's default
    # (longer than any one request can take). The crash tests shorten it; it is no operator setting.
    lease_seconds: float | None = None
    # How long a write waits for another process's lock (--busy-timeout, env POLLWARDEN_BUSY_TIMEOUT_SECONDS).
    busy_timeout_seconds: float = BUSY_TIMEOUT_SECONDS

    @property
    def db_path(self) -> Path:
        """The SQLite file (what the offline audit commands and the CLI's messages name)."""
        return self.database.path

    # Operator public keys, and whether a decision made outside the client must be signed.
    operator: OperatorPolicy = field(default_factory=OperatorPolicy)
    # Per-principal fair shares over authenticated HTTP (issue 19); none by default.
    limits: PrincipalLimits = field(default_factory=PrincipalLimits)


def _float_env(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a number; set it to seconds, e.g. {default:g}") from exc
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name}={raw!r} must be a number of seconds greater than 0, e.g. {default or 5:g}")
    return value


def _seconds_flag(flag: str, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} {value:g} must be a number of seconds greater than 0, e.g. 5")
    return value


def _int_env(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a whole number, e.g. {default}") from exc
    if value < 0:
        raise ConfigError(f"{name}={raw!r} must not be negative")
    return value


@dataclass(frozen=True)
class DatabaseChoice:
    """Which database a command opens, and how long its writes wait for another process's lock."""

    location: DatabaseLocation
    busy_timeout_seconds: float
    is_default: bool  # neither --db nor POLLWARDEN_DB: the file in the user's data directory


def database_choice(
    db: str | None = None, busy_timeout: float | None = None, environ: Mapping[str, str] = os.environ
) -> DatabaseChoice:
    """The database every command uses: --db, else POLLWARDEN_DB, else the user's data directory."""
    given = db or environ.get(DB_ENV)
    return DatabaseChoice(
        location=DatabaseLocation.parse(given or default_db_path(environ)),
        busy_timeout_seconds=_seconds_flag("--busy-timeout", busy_timeout)
        or _float_env(environ, BUSY_TIMEOUT_ENV, BUSY_TIMEOUT_SECONDS),
        is_default=not given,
    )


def load_config(
    *,
    db: str | None = None,
    providers: list[str] | None = None,
    approval: str | None = None,
    operator_pubkeys: str | None = None,
    require_operator_key: bool | None = None,
    busy_timeout: float | None = None,
    environ: Mapping[str, str] = os.environ,
) -> ServerConfig:
    """Combine flags (which win) with the environment and defaults."""
    database = database_choice(db, busy_timeout, environ)
    dirs: list[Path] = []
    for entry in providers or []:
        dirs.append(Path(entry).expanduser())
    if not providers and environ.get("POLLWARDEN_PROVIDERS"):
        dirs.extend(Path(p).expanduser() for p in environ["POLLWARDEN_PROVIDERS"].split(os.pathsep) if p)
    mode = approval or environ.get("POLLWARDEN_APPROVAL") or "elicitation"
    if mode not in APPROVAL_CHOICES:
        raise ConfigError(
            f"approval mode {mode!r} is unknown; use 'elicitation' (default), 'tool-confirmation', or 'app' "
            "(elicitation, and Approve/Deny on the MCP App card)"
        )
    app_channel = mode in ("app", "elicitation,app")
    caps = ExtensionCaps(
        max_extensions_per_operation=_int_env(environ, "POLLWARDEN_MAX_EXTENSIONS", 3),
        max_extra_seconds=_float_env(environ, "POLLWARDEN_MAX_EXTRA_SECONDS", 3600.0),
        max_extra_status_requests=_int_env(environ, "POLLWARDEN_MAX_EXTRA_REQUESTS", 20),
    )
    return ServerConfig(
        database=database.location,
        provider_dirs=tuple(dirs),
        approval_mode="elicitation" if app_channel else mode,  # type: ignore[arg-type]
        app_channel=app_channel,
        approval_ttl_seconds=_float_env(environ, "POLLWARDEN_APPROVAL_TTL_SECONDS", 900.0),
        caps=caps,
        busy_timeout_seconds=database.busy_timeout_seconds,
        operator=load_policy(environ, pubkeys=operator_pubkeys, require=require_operator_key),
    )


def load_provider_tables(config: ServerConfig) -> dict[str, ProviderTable]:
    """The shipped tables plus the operator's directories; a wrong table is a ConfigError."""
    try:
        return load_tables(list(config.provider_dirs))
    except TableError as exc:
        raise ConfigError(f"provider table refused: {exc}") from exc
