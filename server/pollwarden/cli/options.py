"""The options every command that opens the database shares, so each finds it the same way."""

from __future__ import annotations

import argparse
from pathlib import Path

from pollwarden.config import BUSY_TIMEOUT_ENV, BUSY_TIMEOUT_SECONDS, DB_ENV, DatabaseChoice, database_choice
from pollwarden.core.errors import StoreError
from pollwarden.core.files import missing_directory, prepare_database_file
from pollwarden.store.location import DatabaseLocation


def add_database_options(parser: argparse.ArgumentParser) -> None:
    """``--db`` and ``--busy-timeout``, with the same environment variables and defaults everywhere."""
    parser.add_argument(
        "--db",
        metavar="PATH_OR_URL",
        help=f"the SQLite file every pollwarden process shares, a sqlite:/// URL, or a PostgreSQL database "
        f"postgresql://user@host:5432/dbname (env {DB_ENV}; default: "
        "pollwarden.db in the user's data directory, e.g. ~/.local/share/pollwarden/pollwarden.db)",
    )
    parser.add_argument(
        "--busy-timeout",
        type=float,
        metavar="SECONDS",
        help="how long a write waits for another process's lock before giving up with a clear error "
        f"(env {BUSY_TIMEOUT_ENV}; default {BUSY_TIMEOUT_SECONDS:g})",
    )


def database_from(args: argparse.Namespace) -> DatabaseChoice:
    """The database named by the options `add_database_options` added (or the environment, or the default)."""
    return database_choice(args.db, args.busy_timeout)


def writable_existing_database(where: Path | DatabaseLocation) -> None:
    """An operator command that writes a decision: the file must exist (never created) and be safe to open.

    A PostgreSQL database is checked when it is opened (a wrong URL is a clear error there).
    """
    if isinstance(where, DatabaseLocation) and not where.is_sqlite:
        return
    path = where.path if isinstance(where, DatabaseLocation) else where
    require_existing_database(path)
    prepare_database_file(path)


def require_existing_database(where: Path | DatabaseLocation) -> None:
    """Refuse a missing file: operator commands read a server's database and never create one."""
    if isinstance(where, DatabaseLocation):
        if not where.is_sqlite:
            return
        where = where.path
    path = where
    if not path.parent.is_dir():
        raise missing_directory(path)
    if not path.exists():
        raise StoreError(
            f"no database at {path}; nothing was created. Pass the server's --db PATH or set {DB_ENV}"
        )


def with_examples(parser: argparse.ArgumentParser, *examples: str) -> argparse.ArgumentParser:
    """Show `examples` under the command's help (``pollwarden COMMAND --help``)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:\n" + "\n".join(f"  {example}" for example in examples)
    return parser
