"""Where the database lives: a SQLite file (a path or a ``sqlite:///`` URL) or a PostgreSQL URL.

A PostgreSQL URL may carry a password; it is kept only in `DatabaseLocation.dsn`
(used to connect, never shown). Everything that names the database to a person
(`str()`, `url`, `repr()`, log lines, errors, the audit) uses the URL with the
password masked.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from pollwarden.core.errors import ConfigError

SQLITE_SCHEME = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql", "postgres")


class Engine(StrEnum):
    """The database engines pollwarden can store its records in."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


def redact_url(url: str) -> str:
    """`url` with any password replaced by ``***`` (in the user part and in a ``password=`` parameter)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{k}={'***' if k.lower() == 'password' else urllib.parse.quote(v, safe='/:,')}" for k, v in pairs
        )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


@dataclass(frozen=True)
class DatabaseLocation:
    """A database: its engine and where it is.

    ``parse`` takes what an operator writes after ``--db``: a file path
    (``~/pollwarden.db``), a SQLite URL (``sqlite:///relative.db``,
    ``sqlite:////absolute/path.db``, as SQLAlchemy writes them) or a PostgreSQL
    URL (``postgresql://user@host:5432/dbname``; the password from the URL or
    libpq's environment / ``.pgpass``).
    """

    engine: Engine
    path: Path  # the SQLite file (for PostgreSQL: an empty path, never used)
    dsn: str = field(
        default="", repr=False, compare=False
    )  # the PostgreSQL URL as given (may hold a password)
    display: str = ""  # the PostgreSQL URL with the password masked

    @classmethod
    def sqlite(cls, path: Path | str) -> DatabaseLocation:
        """A SQLite file."""
        return cls(Engine.SQLITE, Path(path).expanduser())

    @classmethod
    def postgres(cls, url: str) -> DatabaseLocation:
        """A PostgreSQL database by URL (``postgresql://user[:password]@host[:port]/dbname[?…]``)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in POSTGRES_SCHEMES:
            raise ConfigError(f"{redact_url(url)!r} is not a postgresql:// URL")
        if not parts.path.strip("/"):
            raise ConfigError(
                f"{redact_url(url)!r} names no database; write postgresql://user@host:5432/dbname"
            )
        return cls(Engine.POSTGRES, Path(), dsn=url, display=redact_url(url))

    @classmethod
    def parse(cls, value: str | Path) -> DatabaseLocation:
        """A location from a path or a URL; a scheme pollwarden cannot use is a ConfigError naming the fix."""
        if isinstance(value, Path):
            return cls.sqlite(value)
        text = value.strip()
        if text.startswith(SQLITE_SCHEME):
            rest = text[len(SQLITE_SCHEME) :]
            if not rest:
                raise ConfigError(
                    f"{value!r} names no file; write sqlite:///relative.db or sqlite:////abs/path.db"
                )
            return cls.sqlite(rest)
        if "://" in text:
            scheme = text.split("://", 1)[0]
            if scheme in POSTGRES_SCHEMES:
                return cls.postgres(text)
            raise ConfigError(
                f"database URL scheme {scheme!r} is not supported; give a file path, a sqlite:/// URL "
                "or a postgresql://user@host:5432/dbname URL"
            )
        if not text:
            raise ConfigError("the database location is empty; give a file path, e.g. --db ~/pollwarden.db")
        return cls.sqlite(text)

    @property
    def is_sqlite(self) -> bool:
        """Whether this is a SQLite file (the offline file checks apply)."""
        return self.engine == Engine.SQLITE

    @property
    def url(self) -> str:
        """The location as a URL (``sqlite:////abs/path.db``; PostgreSQL's with the password masked)."""
        if self.engine == Engine.POSTGRES:
            return self.display
        return f"{SQLITE_SCHEME}{self.path}"

    def __str__(self) -> str:
        return self.display if self.engine == Engine.POSTGRES else str(self.path)
