"""One convention for every command: the error tree, finding the database, help with examples, a closed pipe."""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import pollwarden
import pollwarden_providers
from pollwarden import errors
from pollwarden.cli import EXIT_CLOSED_PIPE, build_parser
from pollwarden.cli_options import database_from
from pollwarden.config import default_db_path
from pollwarden.errors import PollwardenError
from pollwarden.store import DatabaseLocation, open_store

REPO = Path(__file__).resolve().parents[1]

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


def _product_exceptions() -> list[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for package in (pollwarden, pollwarden_providers):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if (
                    inspect.isclass(value)
                    and issubclass(value, BaseException)
                    and value.__module__ == module.__name__
                    and not name.startswith("_")  # private control flow, never raised out of its module
                ):
                    found.add(value)
    return sorted(found, key=lambda cls: cls.__name__)


def _leaf_parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[str, argparse.ArgumentParser]]:
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # pyright: ignore[reportPrivateUsage]
    if not subparsers:
        return [(" ".join(path), parser)]
    leaves: list[tuple[str, argparse.ArgumentParser]] = []
    for action in subparsers:
        for name, child in action.choices.items():
            leaves += _leaf_parsers(child, (*path, name))
    return leaves


def test_every_error_pollwarden_defines_belongs_to_the_one_tree_drawn_at_the_top_of_errors_py() -> None:
    exceptions = _product_exceptions()
    assert {cls.__name__ for cls in exceptions} >= {"ConfigError", "AuditError", "TableError", "BodyError"}
    for cls in exceptions:
        assert issubclass(cls, PollwardenError), f"{cls.__module__}.{cls.__name__} is outside the tree"
        drawn = re.search(rf"(── |^){cls.__name__}\b", errors.__doc__ or "", re.MULTILINE)
        assert drawn, f"{cls.__name__} is not drawn in errors.py"


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


def test_every_command_shows_an_example_in_its_help() -> None:
    leaves = _leaf_parsers(build_parser())
    assert len(leaves) >= 14
    for name, parser in leaves:
        shown = parser.format_help().replace("POLLWARDEN_AUDIT_KEY=... ", "")
        shown = shown.replace("OPENAI_WEBHOOK_SECRET=whsec_... ", "")
        assert f"  pollwarden {name}" in shown, name


def test_approve_and_deny_say_they_decide_cancels_as_well_as_extensions() -> None:
    leaves = dict(_leaf_parsers(build_parser()))
    for name in ("approve", "deny"):
        text = leaves[name].format_help()
        assert "an extension" in text
        assert "a cancel" in text


def _closed_pipe(*args: str) -> tuple[int, str]:
    """Run a command whose reader has already left: its exit code and stderr."""
    with subprocess.Popen(
        [sys.executable, "-m", "pollwarden", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
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
