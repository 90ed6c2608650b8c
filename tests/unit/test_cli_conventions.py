"""One convention for every command: the error tree, finding the database, help with examples, a closed pipe: the pure checks.

The checks on real files, servers and processes: tests/integration/test_cli_conventions.py.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import re

import pollwarden
import pollwarden_providers
from pollwarden.cli.main import build_parser
from pollwarden.core import errors
from pollwarden.core.errors import PollwardenError


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
