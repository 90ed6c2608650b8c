"""The options every command that opens the database shares, so each finds it the same way."""

from __future__ import annotations

import argparse

from pollwarden.config import BUSY_TIMEOUT_ENV, BUSY_TIMEOUT_SECONDS, DB_ENV


def add_database_options(parser: argparse.ArgumentParser) -> None:
    """``--db`` and ``--busy-timeout``, with the same environment variables and defaults everywhere."""
    parser.add_argument(
        "--db",
        metavar="PATH",
        help=f"the SQLite file every pollwarden process shares, or a sqlite:/// URL (env {DB_ENV}; default: "
        "pollwarden.db in the user's data directory, e.g. ~/.local/share/pollwarden/pollwarden.db)",
    )
    parser.add_argument(
        "--busy-timeout",
        type=float,
        metavar="SECONDS",
        help="how long a write waits for another process's lock before giving up with a clear error "
        f"(env {BUSY_TIMEOUT_ENV}; default {BUSY_TIMEOUT_SECONDS:g})",
    )
