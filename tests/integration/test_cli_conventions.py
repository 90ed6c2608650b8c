"""One convention for every command: the error tree, finding the database, help with examples, a closed pipe.

The pure checks are tests/unit/test_cli_conventions.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from pollwarden.cli.main import EXIT_CLOSED_PIPE, build_parser
from pollwarden.cli.options import database_from
from pollwarden.config import default_db_path
from pollwarden.store import DatabaseLocation, open_store
from tests.support.live import REPO_ROOT

# Every command that opens the database, with its other required arguments.
DATABASE_COMMANDS = [
    ["serve"],
    ["approvals", "list"],
    ["approve", "ap-1"],
    ["deny", "ap-1"],
    ["audit", "show", "op-1"],
    ["audit", "export"],
    ["audit", "verify"],
    ["audit", "anchor", "--out", "anchor.json"],
    ["audit", "rekey"],
    ["reopen", "op-1", "--reason", "fixed"],
    ["webhooks"],
    ["console"],
]


@pytest.mark.parametrize("command", DATABASE_COMMANDS, ids=" ".join)
def test_every_command_finds_the_database_the_same_way(
    command: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("POLLWARDEN_DB", raising=False)
    monkeypatch.delenv("POLLWARDEN_BUSY_TIMEOUT_SECONDS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    parser = build_parser()

    default = database_from(parser.parse_args(command))
    assert default.location == DatabaseLocation.sqlite(default_db_path())
    assert default.is_default
    assert default.busy_timeout_seconds == 5

    flagged = database_from(parser.parse_args([*command, "--db", "sqlite:///x.db", "--busy-timeout", "0.3"]))
    assert (flagged.location.path, flagged.busy_timeout_seconds, flagged.is_default) == (
        Path("x.db"),
        0.3,
        False,
    )

    monkeypatch.setenv("POLLWARDEN_DB", str(tmp_path / "env.db"))
    assert database_from(parser.parse_args(command)).location.path == tmp_path / "env.db"


def _closed_pipe(*args: str) -> tuple[int, str]:
    """Run a command whose reader has already left: its exit code and stderr."""
    with subprocess.Popen(
        [sys.executable, "-m", "pollwarden", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        # Buffered as an operator's shell runs it: the last write then fails at the final flush.
        env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
    ) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read()
        return proc.wait(timeout=60), err


def test_a_closed_pipe_ends_every_command_the_same_quiet_way(tmp_path: Path) -> None:
    db = tmp_path / "pollwarden.db"

    async def create() -> None:
        async with open_store(DatabaseLocation.sqlite(db)):
            pass

    anyio.run(create)
    for args in (["providers", "list"], ["audit", "verify", "--db", str(db)]):
        code, err = _closed_pipe(*args)
        assert (code, err) == (EXIT_CLOSED_PIPE, ""), args
