"""Files pollwarden trusts are checked like the database (issue 31, item 7).

Whoever can write the token file adds a token of any scope; whoever can write
the operator public keys file adds a key whose signed decisions are applied.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import make_operator
from pollwarden.access.auth import TokenFileVerifier, hash_token
from pollwarden.access.operator_keys import load_public_keys
from pollwarden.core.errors import ConfigError
from tests.integration.test_http_auth import AGENT, OPERATOR, add_token

pytestmark = pytest.mark.anyio

ROOT = os.geteuid() == 0


def test_a_world_writable_token_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    add_token(path, "alice", AGENT)
    path.chmod(0o666)
    with pytest.raises(ConfigError) as refused:
        TokenFileVerifier(path)
    assert "writable by its group or by others (mode 666)" in str(refused.value)
    assert f"chmod go-w {path}" in str(refused.value)


async def test_a_token_appended_to_a_token_file_made_writable_is_not_honoured(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    alice = add_token(path, "alice", AGENT)
    verifier = TokenFileVerifier(path)
    path.chmod(0o666)
    with path.open("a") as tokens:
        tokens.write(f"{hash_token('intruder-token-123456')} mallory {OPERATOR}\n")
    assert await verifier.verify_token("intruder-token-123456") is None
    assert await verifier.verify_token(alice) is not None  # the last good copy still serves


def test_a_group_writable_operator_public_keys_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    operator = make_operator(tmp_path / "keys")
    operator.pubkeys_file.chmod(0o664)
    with pytest.raises(ConfigError) as refused:
        load_public_keys(operator.pubkeys_file)
    message = str(refused.value)
    assert "the operator public keys file" in message
    assert "writable by its group or by others (mode 664)" in message
    assert f"chmod go-w {operator.pubkeys_file}" in message
    operator.pubkeys_file.chmod(0o644)
    assert load_public_keys(operator.pubkeys_file)


@pytest.mark.skipif(not ROOT, reason="changing a file's owner needs root")
def test_trust_files_owned_by_another_user_are_refused(tmp_path: Path) -> None:
    operator = make_operator(tmp_path / "keys")
    os.chown(operator.pubkeys_file, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to user id 65534"):
        load_public_keys(operator.pubkeys_file)
    path = tmp_path / "tokens"
    add_token(path, "alice", AGENT)
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to user id 65534, not to this user"):
        TokenFileVerifier(path)
