"""Generate the CLI and tool references from the code, so they cannot drift from it.

Writes docs/reference/cli.md (every command's ``--help``) and docs/reference/tools.md (every
tool's name, description, input and output schema as ``tools/list`` shows them). Run by the
MkDocs hook in docs/hooks.py on every build, and checked by
tests/integration/test_docs_reference.py (the committed files must be current).

    .venv/bin/python docs/gen_reference.py          # rewrite both files
    .venv/bin/python docs/gen_reference.py --check  # exit 1 when either is stale
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REFERENCE = DOCS / "reference"
WIDTH = "100"  # argparse wraps help at $COLUMNS: fixed, so the output is the same everywhere


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk of subcommands
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:
                    continue  # an alias
                seen.add(id(sub))
                found.append((name, sub))
                found += [(f"{name} {inner}", p) for inner, p in _subcommands(sub)]
    return found


def cli_reference() -> str:
    """Every command's help, as `pollwarden COMMAND --help` prints it (at a fixed width)."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return _cli_reference()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _cli_reference() -> str:
    from pollwarden.cli.main import build_parser

    parser = build_parser()
    parser.prog = "pollwarden"
    parts = [
        "# CLI reference\n",
        "Generated from the code by `docs/gen_reference.py`: each command's `--help`.\n",
        "```text\n" + parser.format_help().rstrip() + "\n```\n",
    ]
    for name, sub in _subcommands(parser):
        sub.prog = f"pollwarden {name}"
        parts.append(f"## pollwarden {name}\n\n```text\n{sub.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


async def _tools() -> list[dict[str, object]]:
    from pollwarden.config import ServerConfig
    from pollwarden.surface.server import build_server, controller_factory
    from pollwarden.store import DatabaseLocation

    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig(database=DatabaseLocation.sqlite(Path(tmp) / "reference.db"))
        server = build_server(controller_factory(config))
        tools = await server.list_tools()
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools]


def tools_reference() -> str:
    """Every tool as `tools/list` describes it (shipped tables only)."""
    parts = [
        "# Tool reference\n",
        "Generated from the code by `docs/gen_reference.py`: what `tools/list` answers (names, "
        "descriptions, annotations, input and output schemas).\n",
    ]
    for tool in asyncio.run(_tools()):
        parts.append(f"## {tool['name']}\n\n{tool.get('description', '')}\n")
        if "annotations" in tool:
            parts.append(f"Annotations: `{json.dumps(tool['annotations'], sort_keys=True)}`\n")
        parts.append("### Input schema\n\n```json\n" + json.dumps(tool["inputSchema"], indent=2) + "\n```\n")
        if "outputSchema" in tool:
            parts.append(
                "### Output schema\n\n```json\n" + json.dumps(tool["outputSchema"], indent=2) + "\n```\n"
            )
    return "\n".join(parts)


def generated() -> dict[Path, str]:
    """The reference files and what they must hold."""
    return {REFERENCE / "cli.md": cli_reference(), REFERENCE / "tools.md": tools_reference()}


def main(argv: list[str]) -> int:
    """Write the references (or with --check, say which are stale)."""
    files = generated()
    stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
    if "--check" in argv:
        for path in stale:
            print(f"stale: {path.relative_to(DOCS.parent)} (run .venv/bin/python docs/gen_reference.py)")
        return 1 if stale else 0
    REFERENCE.mkdir(exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
