"""Where the database lives: a SQLite file (a path or a ``sqlite:///`` URL), later a PostgreSQL URL."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pollwarden.errors import ConfigError

SQLITE_SCHEME = "sqlite:///"


class Engine(StrEnum):
    """The database engines pollwarden can store its records in."""

    SQLITE = "sqlite"


@dataclass(frozen=True)
class DatabaseLocation:
    """A database: its engine and where it is.

    ``parse`` takes what an operator writes after ``--db``: a file path
    (``~/pollwarden.db``) or a URL (``sqlite:///relative.db``,
    ``sqlite:////absolute/path.db``, as SQLAlchemy writes them).
    """

    engine: Engine
    path: Path

    @classmethod
    def sqlite(cls, path: Path | str) -> DatabaseLocation:
        """A SQLite file."""
        return cls(Engine.SQLITE, Path(path).expanduser())

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
            raise ConfigError(
                f"database URL scheme {scheme!r} is not supported; give a file path or a sqlite:/// URL "
                "(PostgreSQL support is planned)"
            )
        if not text:
            raise ConfigError("the database location is empty; give a file path, e.g. --db ~/pollwarden.db")
        return cls.sqlite(text)

    @property
    def url(self) -> str:
        """The location as a URL (``sqlite:////abs/path.db`` for an absolute path)."""
        return f"{SQLITE_SCHEME}{self.path}"

    def __str__(self) -> str:
        return str(self.path)
