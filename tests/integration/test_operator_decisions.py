"""An agent cannot approve itself: a person decides at a terminal, or signs with an operator key.

The review that found this: a client without elicitation got the exact `pollwarden approve ap-…` command
in its tool result, and an agent with a shell ran it with `--by "alice (on-call lead)"`. Now the agent is
only told that a person must decide and where; `approve`/`deny` refuse a non-interactive caller without an
operator key; the audit records how each decision was authenticated; and the controller checks a decision
again before it applies it.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness import Harness, Operator, db_rows, db_write, make_harness, make_operator, view
from pollwarden.access.operator_keys import REQUIRE_ENV, load_operator_key
from pollwarden.audit.chain import read_rows
from pollwarden.audit.story import render_story
from pollwarden.core.clock import FakeClock
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import pollwarden_cli

# SQLite only: the subject is who may decide and how (operator keys) (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

PROMPT = b"leaves it undecided): "


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}
    return {**base, **(extra or {})}


def cli(h: Harness, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The operator CLI without a terminal, as an agent's shell tool runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pollwarden", *args, "--db", str(h.db_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        env=_env(env),
    )


def at_terminal(h: Harness, *args: str, typed: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal, type `typed` at its prompt, return (exit code, everything shown)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pollwarden", *args, "--db", str(h.db_path)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=_env(env),
        close_fds=True,
    )
    os.close(slave)
    shown = b""
    answered = False
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
            if not answered and PROMPT in shown:
                os.write(master, typed.encode() + b"\n")
                answered = True
        code = proc.wait(timeout=10)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return code, shown.decode("utf-8", "replace").replace("\r\n", "\n")


async def escalate_and_ask(h: Harness, job: str, **extra: Any) -> str:
    """Exhaust a budget of 1 on `op-<job>`, then ask for +60 s / +2 checks from a client that cannot prompt."""
    h.fake.script(job, [pending("running")])
    async with h.client() as client:
        await client.call_tool(
            "start_operation",
            {
                "provider": "acme",
                "operation_id": f"op-{job}",
                "provider_job_id": job,
                "max_status_requests": 1,
                **extra,
            },
        )
        stopped = view(
            await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 30})
        )
        assert stopped["stop_reason"] == "request_budget_exhausted"
        asked = view(
            await client.call_tool(
                "request_extension",
                {
                    "operation_id": f"op-{job}",
                    "extra_seconds": 60,
                    "extra_status_requests": 2,
                    "reason": "big",
                },
            )
        )
    assert asked["decision"] == "pending_approval"
    return str(asked["approval_id"])


async def next_check(h: Harness, job: str) -> dict[str, Any]:
    async with h.client() as client:
        return view(await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 30}))


def audit_of(h: Harness, job: str, kind: str) -> list[dict[str, Any]]:
    return [row.payload_obj for row in read_rows(h.db_path, f"op-{job}") if row.kind == kind]


def harness(tmp_path: Path, fake: FakeProvider, operator: Operator | None = None, **policy: bool) -> Harness:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    if operator is not None:
        h.operator = operator.policy(**policy)
    return h


async def test_the_agent_is_told_a_person_must_decide_and_where_but_never_a_command(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    fake.script("msg", [pending("running")])
    async with h.client() as client:
        await client.call_tool(
            "start_operation",
            {
                "provider": "acme",
                "operation_id": "op-msg",
                "provider_job_id": "msg",
                "max_status_requests": 1,
            },
        )
        view(await client.call_tool("check_status", {"operation_id": "op-msg", "wait_seconds": 30}))
        asked = view(
            await client.call_tool(
                "request_extension",
                {"operation_id": "op-msg", "extra_seconds": 60, "extra_status_requests": 1, "reason": "r"},
            )
        )
    message = asked["message"]
    assert asked["approval_id"] in message
    assert "A person must decide" in message
    assert "operator's own terminal or console" in message
    assert "pollwarden" not in message
    assert "`" not in message


async def test_approve_from_a_non_interactive_shell_is_refused_and_the_budget_stays(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    approval_id = await escalate_and_ask(h, "self")
    forged = cli(h, "approve", approval_id, "--by", "alice (on-call lead)")
    assert forged.returncode == 2
    assert "needs a person" in forged.stderr
    assert "interactive terminal" in forged.stderr
    assert "Nothing was decided" in forged.stderr
    after = await next_check(h, "self")
    assert (after["outcome"], after["max_status_requests"]) == ("stopped", 1)
    listed = cli(h, "approvals", "list")
    assert f"{approval_id}  pending" in listed.stdout


async def test_a_person_at_a_terminal_reads_the_question_and_approves_by_typing_the_id(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    approval_id = await escalate_and_ask(h, "tty")
    code, shown = at_terminal(h, "approve", approval_id, "--by", "alice", typed=approval_id)
    assert code == 0, shown
    assert "Approve more waiting for op-tty?" in shown
    assert "Would add: 60 seconds more and 2 more status request(s)" in shown
    assert f"{approval_id} approved for op-tty by alice (tty)" in shown
    assert "the agent's next check_status applies it (+60 s, +2 status requests; counters are kept)" in shown
    after = await next_check(h, "tty")
    assert (after["outcome"], after["max_status_requests"], after["status_requests_used"]) == ("polled", 3, 2)
    [granted] = audit_of(h, "tty", "approval_granted")
    assert granted["authenticated_by"] == "tty"
    [applied] = audit_of(h, "tty", "extension_approved")
    assert (applied["authenticated_by"], applied["approved_by"]) == ("tty", "alice")
    # Who decided, and how, is told by the CLI too.
    listed = cli(h, "approvals", "list", "--all").stdout
    assert re.search(
        rf"{approval_id}  applied .*\n    applied by alice at \S+, authenticated by tty\n", listed
    ), listed
    story = cli(h, "audit", "show", "op-tty").stdout
    assert f"approval_granted: {approval_id} by alice, authenticated by tty" in story
    assert re.search(r"extension approved: \+60 s, \+2 checks, .* by alice, authenticated by tty", story), (
        story
    )


async def test_typing_anything_else_at_the_terminal_decides_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    approval_id = await escalate_and_ask(h, "typo")
    code, shown = at_terminal(h, "approve", approval_id, typed="yes")
    assert code == 1
    assert f"{approval_id}: nothing decided" in shown
    assert f"{approval_id}  pending" in cli(h, "approvals", "list").stdout


async def test_a_decision_signed_with_a_configured_operator_key_is_applied_and_audited_with_its_key_id(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    key_id = load_operator_key(operator.key_file).public.key_id
    h = harness(tmp_path, fake, operator)
    approval_id = await escalate_and_ask(h, "signed")
    decided = cli(h, "approve", approval_id, "--operator-key", str(operator.key_file), env=operator.env())
    assert decided.returncode == 0, decided.stderr
    assert f"(operator-key:{key_id})" in decided.stdout
    after = await next_check(h, "signed")
    assert (after["outcome"], after["max_status_requests"]) == ("polled", 3)
    [applied] = audit_of(h, "signed", "extension_approved")
    assert applied["authenticated_by"] == f"operator-key:{key_id}"


async def test_an_operator_key_the_operator_did_not_configure_is_refused(
    tmp_path: Path, fake: FakeProvider
) -> None:
    trusted = make_operator(tmp_path / "keys", "trusted")
    agents_own = make_operator(tmp_path / "keys", "agent")
    h = harness(tmp_path, fake, trusted)
    approval_id = await escalate_and_ask(h, "foreign")
    decided = cli(h, "approve", approval_id, "--operator-key", str(agents_own.key_file), env=trusted.env())
    assert decided.returncode == 2
    assert "is not among the operator public keys" in decided.stderr
    no_keys = cli(h, "approve", approval_id, "--operator-key", str(agents_own.key_file))
    assert no_keys.returncode == 2
    assert "POLLWARDEN_OPERATOR_PUBKEYS: none" in no_keys.stderr
    assert (await next_check(h, "foreign"))["max_status_requests"] == 1


def forge(h: Harness, sql: str, *params: object) -> None:
    """What an agent with write access to the database file could do by hand."""
    db_write(h.db_path, sql, *params)


async def test_with_a_key_required_an_unsigned_decision_written_into_the_database_is_refused(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    h = harness(tmp_path, fake, operator, require_key=True)
    approval_id = await escalate_and_ask(h, "forged")
    forge(
        h,
        "UPDATE approvals SET status = 'approved', decided_by = 'alice', decided_method = 'tty', decided_at = ? "
        "WHERE approval_id = ?",
        time.time(),
        approval_id,
    )
    after = await next_check(h, "forged")
    assert (after["outcome"], after["max_status_requests"]) == ("stopped", 1)
    [refused] = audit_of(h, "forged", "approval_refused")
    assert "not signed with an operator key" in refused["note"]
    assert f"{approval_id}  void" in cli(h, "approvals", "list", "--all").stdout


async def test_a_signed_decision_whose_request_was_edited_afterwards_is_refused(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    h = harness(tmp_path, fake, operator)
    approval_id = await escalate_and_ask(h, "edited")
    decided = cli(h, "approve", approval_id, "--operator-key", str(operator.key_file), env=operator.env())
    assert decided.returncode == 0, decided.stderr
    [row] = db_rows(h.db_path, "SELECT request_json FROM approvals WHERE approval_id = ?", approval_id)
    request_json = row["request_json"]
    request = json.loads(request_json)
    request["extra_status_requests"] = 50
    forge(h, "UPDATE approvals SET request_json = ? WHERE approval_id = ?", json.dumps(request), approval_id)
    after = await next_check(h, "edited")
    assert (after["outcome"], after["max_status_requests"]) == ("stopped", 1)
    [refused] = audit_of(h, "edited", "approval_refused")
    assert "signature does not verify" in refused["note"]


async def test_with_a_key_required_the_cli_refuses_a_terminal_decision_up_front(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    h = harness(tmp_path, fake, operator, require_key=True)
    approval_id = await escalate_and_ask(h, "req")
    code, shown = at_terminal(
        h, "approve", approval_id, typed=approval_id, env={**operator.env(), REQUIRE_ENV: "1"}
    )
    assert code == 2
    assert "requires an operator key for every decision" in shown


async def test_a_cancel_approval_reads_as_a_cancel_and_approve_says_what_happens_next(
    tmp_path: Path, fake: FakeProvider
) -> None:
    operator = make_operator(tmp_path / "keys")
    h = harness(tmp_path, fake, operator)
    h.table["cancel"] = {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"}
    fake.script("cx", [pending("running")])
    async with h.client() as client:
        await client.call_tool(
            "start_operation",
            {"provider": "acme", "operation_id": "op-cx", "provider_job_id": "cx", "max_status_requests": 1},
        )
        view(await client.call_tool("check_status", {"operation_id": "op-cx", "wait_seconds": 30}))
        asked = view(await client.call_tool("cancel_operation", {"operation_id": "op-cx"}))
    assert asked["decision"] == "pending_approval"
    assert "pollwarden" not in asked["message"]
    story = render_story(read_rows(h.db_path, "op-cx"))
    assert any("cancel awaiting operator approval" in line for line in story)
    listed = cli(h, "approvals", "list")
    assert "asks to cancel the job at the provider" in listed.stdout
    assert "+0 s" not in listed.stdout
    decided = cli(
        h, "approve", asked["approval_id"], "--operator-key", str(operator.key_file), env=operator.env()
    )
    assert decided.returncode == 0, decided.stderr
    assert (
        "the agent's next cancel_operation call sends the provider's documented cancel call, once"
        in decided.stdout
    )
    assert [e for e in fake.log() if e["route"] == "cancel"] == []
    async with h.client() as client:
        sent = view(await client.call_tool("cancel_operation", {"operation_id": "op-cx"}))
    assert sent["decision"] == "done"
    [done] = audit_of(h, "cx", "cancel_done")
    assert done["note"].endswith(
        "(authenticated by operator-key:" + load_operator_key(operator.key_file).public.key_id + ")"
    )


async def test_a_denied_extension_says_nothing_changes(tmp_path: Path, fake: FakeProvider) -> None:
    operator = make_operator(tmp_path / "keys")
    h = harness(tmp_path, fake, operator)
    approval_id = await escalate_and_ask(h, "no")
    denied = cli(h, "deny", approval_id, "--operator-key", str(operator.key_file), env=operator.env())
    assert denied.returncode == 0, denied.stderr
    assert "nothing changes; the agent's next check_status still answers stopped" in denied.stdout


def test_operator_key_init_writes_a_private_key_and_never_overwrites_one(tmp_path: Path) -> None:
    out = tmp_path / "op.key"
    made = pollwarden_cli("operator-key", "init", "--out", str(out), "--comment", "alice")
    assert made.code == 0, made.stderr
    assert made.stdout.startswith("pollwarden-ed25519 ")
    assert made.stdout.strip().endswith(" alice")
    assert out.stat().st_mode & 0o777 == 0o600
    before = out.read_bytes()
    again = pollwarden_cli("operator-key", "init", "--out", str(out))
    assert again.code == 2
    assert "already exists" in again.stderr
    assert out.read_bytes() == before
