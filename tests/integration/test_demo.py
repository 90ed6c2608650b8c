"""`pollwarden demo` (and `demo --team`) run end to end, as a newcomer would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import database_in
from pollwarden.audit.verify import verify_chain
from pollwarden.store import Engine
from tests.support.ports import free_port

# SQLite only: the subject is the demo commands (tests/conftest.py).
pytestmark = pytest.mark.one_engine


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    """`pollwarden demo` with `args`, as a newcomer runs it (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "pollwarden", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_demo_succeeds_one_job_and_escalates_the_other(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = _demo("--db", str(db))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "-> succeeded (succeeded)" in out
    assert "provider_retry_after" in out
    assert "-> escalated (request_budget_exhausted)" in out
    assert "External job needs a decision" in out
    assert "Status requests: 5 of 5" in out
    assert "received 503, Retry-After 1" in out
    assert "audit chain: OK" in out
    assert db.exists()


@pytest.mark.both_engines
def test_the_team_demo_runs_two_http_instances_on_one_database_that_share_one_budget(
    tmp_path: Path, database_engine: Engine
) -> None:
    where = database_in(tmp_path)
    db = where.dsn if not where.is_sqlite else str(where.path)
    done = _demo("--team", "--db", db)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    checks = [line for line in lines if "check_status ->" in line]
    assert [line.split(":")[0] for line in checks] == ["instance A", "instance B", "instance A", "instance B"]
    assert "requests used 2 of 3" in checks[1]  # B counts the request A sent
    assert "requests used 3 of 3 -> escalated (request_budget_exhausted)" in checks[2]
    assert "check_status -> stopped" in checks[3]
    assert "the provider saw 3 status requests in all" in done.stdout
    assert "one budget, shared by both instances" in done.stdout
    assert verify_chain(where, None).ok


def test_the_team_demo_on_a_postgresql_server_it_cannot_reach_says_so_and_starts_no_instance(
    tmp_path: Path,
) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/pollwarden_team"  # nothing listens there
    done = _demo("--team", "--db", url)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "127.0.0.1" in done.stderr
    assert "instance A" not in done.stdout
