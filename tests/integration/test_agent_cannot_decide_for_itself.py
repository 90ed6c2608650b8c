"""An agent with a shell cannot approve its own extension, or reopen its own refusal, with a key it made.

The keys file a CLI caller names proves nothing (the caller may be the agent); only
the keys the server itself was configured with do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import make_operator
from tests.integration.test_operator_decisions import audit_of, cli, escalate_and_ask, harness, next_check
from tests.support.fake_provider import FakeProvider

# SQLite only: the subject is who may decide (operator keys) (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


async def test_an_agent_signing_with_its_own_key_and_keys_file_changes_nothing_on_a_default_server(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)  # the default: the server has no operator public keys
    approval_id = await escalate_and_ask(h, "self")
    agents_own = make_operator(tmp_path / "agentkeys", "agent")  # the agent ran `operator-key init`
    cli(
        h,
        "approve",
        approval_id,
        "--operator-key",
        str(agents_own.key_file),
        "--operator-pubkeys",
        str(agents_own.pubkeys_file),
        "--by",
        "alice (on-call lead)",
    )
    after = await next_check(h, "self")
    assert after["max_status_requests"] == 1
    assert after["outcome"] != "polled"
    assert len(fake.status_requests("self")) == 1
    [refused] = audit_of(h, "self", "approval_refused")
    assert "no operator public keys configured" in refused["note"]
    assert audit_of(h, "self", "extension_approved") == []


async def test_an_agent_signing_with_its_own_key_is_refused_when_the_server_has_other_keys(
    tmp_path: Path, fake: FakeProvider
) -> None:
    trusted = make_operator(tmp_path / "opkeys", "operator")
    h = harness(tmp_path, fake, trusted)
    approval_id = await escalate_and_ask(h, "other")
    agents_own = make_operator(tmp_path / "agentkeys", "agent")
    cli(
        h,
        "approve",
        approval_id,
        "--operator-key",
        str(agents_own.key_file),
        "--operator-pubkeys",
        str(agents_own.pubkeys_file),
    )
    after = await next_check(h, "other")
    assert after["max_status_requests"] == 1
    assert len(fake.status_requests("other")) == 1
