"""`console --allow-non-loopback` follows serve's rule (issue 31, item 12): allowed with a bearer-token verifier.

Nothing here listens beyond 127.0.0.1: the command stops at the next check (a person must start it).
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_http_auth import OPERATOR, add_token
from tests.support.live import pollwarden_cli


def console(tmp_path: Path, *extra: str) -> tuple[int, str]:
    db = tmp_path / "p.db"
    db.touch(mode=0o600)
    done = pollwarden_cli(
        "console",
        "--db",
        str(db),
        "--host",
        "0.0.0.0",
        "--allow-non-loopback",
        "--allowed-host",
        "console.example.com",
        *extra,
    )
    return done.code, done.stderr


def test_a_console_beyond_loopback_without_a_verifier_is_refused(tmp_path: Path) -> None:
    code, stderr = console(tmp_path)
    assert code == 2
    assert "--allow-non-loopback needs a bearer-token verifier" in stderr


def test_a_console_beyond_loopback_with_operator_tokens_passes_the_host_check(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    add_token(tokens, "ops", OPERATOR)
    code, stderr = console(tmp_path, "--auth-tokens", str(tokens))
    assert code == 2
    assert "bearer-token verifier" not in stderr
    assert "needs a person" in stderr  # the next check: no terminal and no operator key here
