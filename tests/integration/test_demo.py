"""`pollwarden demo` runs end to end, as a newcomer would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_demo_succeeds_one_job_and_escalates_the_other(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = subprocess.run(
        [sys.executable, "-m", "pollwarden", "demo", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
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
