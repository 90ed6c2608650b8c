"""What ships and where things sit: the wheel carries no test machinery, and each test file sits in its folder."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.support.live import REPO_ROOT

PRODUCT = (REPO_ROOT / "server" / "pollwarden", REPO_ROOT / "providers" / "pollwarden_providers")


def _modules() -> list[Path]:
    return sorted(path for root in PRODUCT for path in root.rglob("*.py"))


def test_the_wheel_ships_only_the_server_and_provider_packages() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
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
                f"{path.relative_to(REPO_ROOT)}: {name}"
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


def test_every_test_file_sits_in_unit_properties_or_integration() -> None:
    # tests/unit is what runs in seconds; a test file at the top of tests/ would fall outside every folder's rule.
    loose = sorted(path.name for path in (REPO_ROOT / "tests").glob("test_*.py"))
    assert loose == [], f"move {loose} into tests/unit (pure), tests/properties or tests/integration"
