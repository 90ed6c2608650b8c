"""The account an operation polls under, and when its request was sent (issue 12, items 7 and 9).

An operation records the table's origin and credential variable when it
starts. If either changed since (the table edited, the server started with
another `[auth] env`), the next check stops with `account_context_changed`
and sends nothing, instead of polling under another account; a person
restores it and an operator reopens. The view and the audit's first row show
both. The expected terminal state (the table's success states when the
operation started) is checked the same way: once the table's success states
changed, an end answer is not read at the edited table's word (a new success
state is no success, the expected one filed elsewhere no failure) and stops
for a person. The record keeps when each status request was sent beside when
its answer came.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from harness import check, make_harness, make_operator, track, view
from pollwarden.audit.chain import read_rows
from pollwarden.core.clock import FakeClock
from pollwarden.core.timefmt import parse_iso
from tests.integration.test_operator_decisions import cli
from tests.support.fake_provider import FakeProvider, failed, pending, succeeded

# SQLite only: the subject is which account a table names and what the view shows (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

WITH_AUTH: dict[str, Any] = {"auth": {"env": "ACME_TOKEN", "header": "Authorization", "prefix": "Bearer "}}
SECRET = "s3cr3t-token-value"


@pytest.mark.parametrize(
    ("before", "after", "what"),
    [
        pytest.param({}, WITH_AUTH, "credential", id="credential-added"),
        pytest.param(WITH_AUTH, {"auth": {"env": "OTHER_TOKEN"}}, "credential", id="credential-renamed"),
        pytest.param({}, {"base_url": "localhost"}, "origin", id="origin"),
    ],
)
async def test_a_changed_account_context_stops_the_next_check_and_sends_nothing(
    tmp_path: Path, fake: FakeProvider, before: dict[str, Any], after: dict[str, Any], what: str
) -> None:
    fake.script("acct", [pending("running")])
    operator = make_operator(tmp_path / "keys")
    h = make_harness(
        tmp_path,
        fake,
        table=before,
        environ={"ACME_TOKEN": SECRET, "OTHER_TOKEN": SECRET},
        clock=FakeClock(time.time()),
    )
    h.operator = operator.policy()
    recorded_env = "ACME_TOKEN" if before else None
    async with h.client() as client:
        started = await track(client, "acct")
        assert (started["account_origin"], started["account_credential_env"]) == (fake.base_url, recorded_env)
        assert (await check(client, "acct", wait=30))["outcome"] == "polled"
    original = dict(h.table)
    changed = dict(after)
    if changed.get("base_url") == "localhost":
        changed["base_url"] = fake.base_url.replace("127.0.0.1", "localhost")
    h.table = {**h.table, **changed}
    if "auth" in changed and "auth" in original:
        h.table["auth"] = {**original["auth"], **changed["auth"]}
    async with h.client() as client:
        stopped = await check(client, "acct", wait=30)
        assert (stopped["outcome"], stopped["status"], stopped["stop_reason"]) == (
            "stopped",
            "escalated",
            "account_context_changed",
        )
        assert stopped["status_requests_used"] == 1
        assert stopped["allowed_actions"] == []
        # What was recorded stays in the view; the detail names both, never a credential's value.
        assert (stopped["account_origin"], stopped["account_credential_env"]) == (fake.base_url, recorded_env)
        assert f"recorded for origin {fake.base_url}" in stopped["stop_detail"]
        assert ("credential $" if what == "credential" else "origin http://localhost") in stopped[
            "stop_detail"
        ]
        assert SECRET not in str(stopped)
        assert [o["action"] for o in stopped["escalation"]["options"]] == [
            "operator_reopen",
            "inspect_provider_console",
        ]
        assert (await check(client, "acct", wait=30))["outcome"] == "stopped"
    assert len(fake.status_requests("acct")) == 1

    # Reopened while the table still says another account: the next check stops again.
    reopen = ("reopen", "op-acct", "--reason", "checked", "--operator-key", str(operator.key_file))
    assert cli(h, *reopen, env=operator.env()).returncode == 0
    async with h.client() as client:
        assert (await check(client, "acct", wait=30))["stop_reason"] == "account_context_changed"
    # Restored and reopened: it polls again, under the account it was recorded for.
    h.table = original
    assert cli(h, *reopen, env=operator.env()).returncode == 0
    async with h.client() as client:
        resumed = await check(client, "acct", wait=30)
        assert (resumed["outcome"], resumed["status_requests_used"]) == ("polled", 2)
    assert len(fake.status_requests("acct")) == 2
    rows = read_rows(h.db_path, "op-acct")
    assert [r.payload_obj["stop_reason"] for r in rows if r.kind == "stopped"] == [
        "account_context_changed"
    ] * 2


async def test_the_first_audit_row_and_the_view_name_the_origin_and_the_credential_variable(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("who", [pending("running")])
    h = make_harness(tmp_path, fake, table=WITH_AUTH, environ={"ACME_TOKEN": SECRET})
    async with h.client() as client:
        started = await track(client, "who")
        seen = view(await client.call_tool("get_operation", {"operation_id": "op-who"}))
    for shown in (started, seen):
        assert (shown["account_origin"], shown["account_credential_env"]) == (fake.base_url, "ACME_TOKEN")
        assert shown["expected_terminal_state"] == ["succeeded"]
    first = read_rows(h.db_path, "op-who")[0]
    assert first.kind == "tracking"
    assert (
        first.payload_obj["account_origin"],
        first.payload_obj["account_credential_env"],
        first.payload_obj["expected_terminal_state"],
    ) == (fake.base_url, "ACME_TOKEN", "succeeded")
    assert SECRET not in first.payload


SUCCESS_STATES_CHANGED: list[Any] = [
    pytest.param(
        {"states": {"succeeded": ["succeeded", "done"]}},
        succeeded(state="done"),
        ("escalated", "integration_failure"),
        "the acme table now counts done as success",
        id="a-new-success-state-is-no-success",
    ),
    pytest.param(
        {"states": {"succeeded": ["done"], "failed": ["failed", "succeeded"]}},
        succeeded(),
        ("escalated", "integration_failure"),
        "succeeded was the expected success, but the acme table now files it as failed",
        id="the-expected-success-filed-as-failure-is-no-failure",
    ),
    pytest.param(
        {"states": {"succeeded": ["succeeded", "done"]}},
        succeeded(),
        ("succeeded", "succeeded"),
        None,
        id="the-expected-success-still-succeeds",
    ),
    pytest.param(
        {"states": {"succeeded": ["succeeded", "done"]}},
        failed(),
        ("failed", "provider_failure"),
        None,
        id="a-documented-failure-still-fails",
    ),
]


@pytest.mark.parametrize(("edit", "answer", "ends", "detail"), SUCCESS_STATES_CHANGED)
async def test_an_end_answer_is_checked_against_the_expected_terminal_state_recorded_at_start(
    tmp_path: Path,
    fake: FakeProvider,
    edit: dict[str, Any],
    answer: Any,
    ends: tuple[str, str],
    detail: str | None,
) -> None:
    fake.script("end", [pending("running"), answer])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        started = await track(client, "end")
        assert started["expected_terminal_state"] == ["succeeded"]
        assert (await check(client, "end", wait=30))["outcome"] == "polled"
    h.table = {**h.table, "states": {**h.table["states"], **edit["states"]}}
    async with h.client() as client:
        stopped = await check(client, "end", wait=30)
        assert (stopped["outcome"], stopped["status"], stopped["stop_reason"]) == ("polled", *ends)
        assert stopped["expected_terminal_state"] == ["succeeded"]  # what was recorded, not the new table
        if detail is None:
            return
        assert detail in stopped["stop_detail"]
        assert "recorded expecting succeeded." in stopped["stop_detail"]
        assert stopped["result"] is None
        assert stopped["allowed_actions"] == []
        assert stopped["message"].startswith("Waiting stopped: integration_failure. Do not poll again")
        assert stopped["escalation"]["options"][0]["action"] == "operator_reopen"
        again = await check(client, "end", wait=30)
        assert (again["outcome"], again["status_requests_used"]) == ("stopped", 2)
        refused = view(await client.call_tool("fetch_result", {"operation_id": "op-end"}))
        assert (refused["decision"], refused["result"]) == ("refused", None)
    assert len(fake.status_requests("end")) == 2
    last = [r.payload_obj for r in read_rows(h.db_path, "op-end") if r.kind == "polled"][-1]
    assert (last["state"], last["stop_reason"]) == (
        "done" if "done" in detail else "succeeded",
        "integration_failure",
    )


class TickingClock(FakeClock):
    """A fake clock that moves 0.25 s every time it is read, so a request takes time to answer."""

    def now(self) -> float:
        self.t += 0.25
        return self.t


async def test_the_record_keeps_when_the_status_request_was_sent_beside_when_its_answer_came(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("rt", [pending("queued"), pending("running")])
    clock = TickingClock()
    h = make_harness(tmp_path, fake, clock=clock)
    async with h.client() as client:
        started = await track(client, "rt")
        assert started["request_sent_at"] is None
        first = await check(client, "rt", wait=30)
        second = await check(client, "rt", wait=30)
    for polled in (first, second):
        assert polled["outcome"] == "polled"
        sent, answered = parse_iso(polled["request_sent_at"]), parse_iso(polled["last_http_at"])
        assert parse_iso(started["started_at"]) < sent < answered
    assert parse_iso(first["last_http_at"]) < parse_iso(second["request_sent_at"])
    rows = [r.payload_obj for r in read_rows(h.db_path, "op-rt") if r.kind == "polled"]
    assert [(r["request_sent_at"], r["answered_at"]) for r in rows] == [
        (first["request_sent_at"], first["last_http_at"]),
        (second["request_sent_at"], second["last_http_at"]),
    ]


async def test_the_submission_requests_send_time_is_kept_beside_the_status_requests(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script_new_jobs([pending("queued"), pending("running")])
    clock = TickingClock()
    h = make_harness(tmp_path, fake, clock=clock)
    async with h.client() as client:
        args = {"provider": "acme", "operation_id": "op-sub-time", "submit": {"report": "q3"}}
        submitted = view(await client.call_tool("start_operation", args))
        polled = view(
            await client.call_tool("check_status", {"operation_id": "op-sub-time", "wait_seconds": 30})
        )
    sent = parse_iso(submitted["submit_sent_at"])
    assert parse_iso(submitted["started_at"]) < sent < parse_iso(submitted["last_http_at"])
    assert submitted["request_sent_at"] is None  # no status request yet
    # A status request keeps the submission's time and adds its own.
    assert polled["outcome"] == "polled"
    assert polled["submit_sent_at"] == submitted["submit_sent_at"]
    assert parse_iso(submitted["last_http_at"]) < parse_iso(polled["request_sent_at"])
    rows = {r.kind: r.payload_obj for r in read_rows(h.db_path, "op-sub-time")}
    assert rows["submission_recorded"]["submit_sent_at"] is None  # recorded before anything was sent
    assert rows["submit_sending"]["submit_sent_at"] == submitted["submit_sent_at"]
    assert (rows["submitted"]["submit_sent_at"], rows["submitted"]["answered_at"]) == (
        submitted["submit_sent_at"],
        submitted["last_http_at"],
    )
    assert rows["polled"]["submit_sent_at"] == submitted["submit_sent_at"]
    assert [e["route"] for e in fake.log() if e["method"] == "POST"] == ["submit"]
