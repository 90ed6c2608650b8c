"""The README is the short entry point, and the generated references in docs/ match the code."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def gen_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_and_tool_references_are_generated_from_the_current_code() -> None:
    for path, text in gen_reference().generated().items():
        assert path.read_text() == text, f"{path} is stale: run .venv/bin/python docs/gen_reference.py"


def test_the_references_name_every_command_and_every_tool() -> None:
    cli = (ROOT / "docs/reference/cli.md").read_text()
    tools = (ROOT / "docs/reference/tools.md").read_text()
    for command in ("serve", "demo", "console", "webhooks", "metrics", "doctor", "audit verify"):
        assert f"## pollwarden {command}\n" in cli
    for tool in ("start_operation", "check_status", "request_extension", "list_operations"):
        assert f"## {tool}\n" in tools


def test_the_readme_is_short_and_keeps_the_setup_demo_and_test_commands() -> None:
    assert len(README.splitlines()) <= 250
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/pollwarden demo" in README
    test_command = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest"
    assert test_command in README
    assert ".venv/bin/python -m pytest" in (ROOT / ".ci/run").read_text()  # CI runs the README's command


def test_every_docs_page_the_readme_links_exists() -> None:
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).is_file(), target
