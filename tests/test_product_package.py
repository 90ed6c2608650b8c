"""The product package carries no test machinery: what the wheel ships is what runs in production."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRODUCT = (REPO / "server" / "pollwarden", REPO / "providers" / "pollwarden_providers")


def _modules() -> list[Path]:
    return sorted(path for root in PRODUCT for path in root.rglob("*.py"))


def test_the_wheel_ships_only_the_server_and_provider_packages() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert packages == ["server/pollwarden", "providers/pollwarden_providers"]


def test_no_product_module_imports_the_tests_or_the_benchmarks() -> None:
    offenders: list[str] = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{path.relative_to(REPO)}: {name}"
                for name in names
                if name.split(".")[0] in {"tests", "benchmarks"}
            ]
    assert _modules()
    assert offenders == []


def test_no_product_module_kills_its_own_process_or_reads_a_test_switch() -> None:
    # The crash tests' hook (tests/support/serve_with_faults.py) is injected; the product never reads one.
    for path in _modules():
        text = path.read_text()
        assert "os.kill(" not in text, path
        assert "SIGKILL" not in text, path
        assert "POLLWARDEN_FAULT" not in text, path
        assert "POLLWARDEN_LEASE" not in text, path
