"""The approval policy lives in the database: one policy for every process that opens it (issue 31, item 2)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness import Harness, make_operator, view
from pollwarden.access.operator_keys import REQUIRE_ENV, load_operator_key
from pollwarden.core.errors import ConfigError
from pollwarden.surface.server import controller_factory
from tests.integration.test_operator_decisions import at_terminal, cli, escalate_and_ask, harness, next_check
from tests.support.fake_provider import FakeProvider, pending

pytestmark = pytest.mark.anyio


async def serve_once(h: Harness) -> None:
    """Start one server process's controller on the harness's database (what `serve` does first)."""
    async with controller_factory(h.config(), tables={}, clock=h.clock, rng=h.rng, environ=h.environ)():
        pass


async def test_a_server_with_a_weaker_policy_than_the_databases_refuses_to_start(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    guarded = harness(tmp_path, fake, operator, require_key=True)
    await serve_once(guarded)  # the operator's server: POLLWARDEN_REQUIRE_OPERATOR_KEY
    self_approving = replace(harness(tmp_path, fake), approval_mode="tool-confirmation")
    with pytest.raises(ConfigError) as refused:
        await serve_once(self_approving)
    message = str(refused.value)
    assert "weaker approval policy than the database's" in message
    assert REQUIRE_ENV in message
    assert "tool-confirmation" in message
    assert "pollwarden policy set" in message
    # Without the key requirement, even with keys, the client's own confirmation does not count now.
    with pytest.raises(ConfigError, match="approves by tool-confirmation"):
        await serve_once(
            replace(harness(tmp_path, fake, operator, require_key=True), approval_mode="tool-confirmation")
        )
    agents_own = make_operator(tmp_path / "agent", "agent")
    with pytest.raises(ConfigError, match="trusts operator key"):
        await serve_once(harness(tmp_path, fake, agents_own, require_key=True))


@pytest.mark.sqlite_only
async def test_pollwarden_serve_with_tool_confirmation_on_a_guarded_database_exits_with_the_policy(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    h = harness(tmp_path, fake, operator, require_key=True)
    await serve_once(h)
    started = cli(h, "serve", "--approval", "tool-confirmation")
    assert started.returncode == 2, started.stderr
    assert "refusing to serve with a weaker approval policy" in started.stderr
    assert "an operator key required" in started.stderr


async def test_a_terminal_decision_is_refused_up_front_when_the_database_requires_a_key(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    h = harness(tmp_path, fake, operator, require_key=True)
    approval_id = await escalate_and_ask(h, "dbkey")
    code, shown = at_terminal(h, "approve", approval_id, typed=approval_id)  # no REQUIRE env in this shell
    assert code == 2, shown
    assert "requires an operator key for every decision" in shown
    # The database's trusted key signs without any keys file in the caller's environment.
    decided = cli(h, "approve", approval_id, "--operator-key", str(operator.key_file))
    assert decided.returncode == 0, decided.stderr
    assert (await next_check(h, "dbkey"))["max_status_requests"] == 3


async def test_a_policy_raised_while_a_server_runs_binds_it_when_it_applies_a_decision(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    h = harness(tmp_path, fake)  # a server started with no requirement, still running below
    fake.script("late", [pending("running")])
    async with h.client() as client:
        await client.call_tool(
            "start_operation",
            {
                "provider": "acme",
                "operation_id": "op-late",
                "provider_job_id": "late",
                "max_status_requests": 1,
            },
        )
        view(await client.call_tool("check_status", {"operation_id": "op-late", "wait_seconds": 30}))
        asked = view(
            await client.call_tool(
                "request_extension",
                {"operation_id": "op-late", "extra_seconds": 60, "extra_status_requests": 2, "reason": "r"},
            )
        )
        approval_id = str(asked["approval_id"])
        code, shown = at_terminal(h, "approve", approval_id, typed=approval_id)
        assert code == 0, shown
        # Meanwhile another server starts requiring a key: this one must not apply the terminal decision.
        await serve_once(harness(tmp_path, fake, operator, require_key=True))
        after = view(await client.call_tool("check_status", {"operation_id": "op-late", "wait_seconds": 30}))
    assert (after["outcome"], after["max_status_requests"]) == ("stopped", 1)


async def test_tool_confirmation_does_not_approve_once_the_database_stops_counting_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = replace(harness(tmp_path, fake), approval_mode="tool-confirmation")
    fake.script("tc", [pending("running")])
    async with h.client() as client:
        await client.call_tool(
            "start_operation",
            {"provider": "acme", "operation_id": "op-tc", "provider_job_id": "tc", "max_status_requests": 1},
        )
        view(await client.call_tool("check_status", {"operation_id": "op-tc", "wait_seconds": 30}))
        operator = make_operator(tmp_path / "keys")
        await serve_once(harness(tmp_path, fake, operator, require_key=True))  # raises the stored policy
        asked = view(
            await client.call_tool(
                "request_extension",
                {"operation_id": "op-tc", "extra_seconds": 60, "extra_status_requests": 1, "reason": "r"},
            )
        )
    assert asked["decision"] == "pending_approval"


async def test_policy_set_needs_the_databases_key_to_lower_it_and_policy_show_tells_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    await serve_once(harness(tmp_path, fake, operator, require_key=True))
    h = harness(tmp_path, fake)
    shown = cli(h, "policy", "show")
    assert shown.returncode == 0, shown.stderr
    key_id = load_operator_key(operator.key_file).public.key_id
    assert f"an operator key required (trusted: {key_id}" in shown.stdout
    assert "channels that count: elicitation, app, operator" in shown.stdout
    agents_own = make_operator(tmp_path / "agent", "agent")
    lowered = cli(
        h, "policy", "set", "--require-operator-key", "no", "--operator-key", str(agents_own.key_file)
    )
    assert lowered.returncode == 2
    assert "not among the keys the database's policy trusts" in lowered.stderr
    assert cli(h, "policy", "set", "--require-operator-key", "no").returncode == 2
    lowered = cli(
        h,
        "policy",
        "set",
        "--require-operator-key",
        "no",
        "--channels",
        "elicitation,tool-confirmation,operator",
        "--operator-key",
        str(operator.key_file),
    )
    assert lowered.returncode == 0, lowered.stderr
    assert "no operator key required; channels that count: elicitation, tool-confirmation, operator" in (
        lowered.stdout
    )
    await serve_once(replace(harness(tmp_path, fake), approval_mode="tool-confirmation"))
