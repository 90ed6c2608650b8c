"""Operations belong to a principal: over real HTTP with tokens, another principal's operation is an unknown id.

Three principals from a token file: alice and bob (pollwarden:agent) and ops (pollwarden:operator).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp.client import Client, ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult

from harness import db_rows, db_snapshot, make_harness, view
from pollwarden.access.auth import TokenFileVerifier, hash_token
from pollwarden.access.operator_keys import OperatorPolicy
from pollwarden.access.principals import PrincipalLogFilter
from pollwarden.audit.chain import read_rows
from pollwarden.core.untrusted import OneLineFormatter
from pollwarden.store import open_store
from tests.integration.test_http_auth import AGENT, OPERATOR, Served, add_token, served
from tests.support.auth_helpers import bearer_client
from tests.support.fake_provider import FakeProvider, failed, pending, succeeded

pytestmark = pytest.mark.anyio

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]


@dataclass
class Team:
    s: Served
    tokens: dict[str, str]

    @asynccontextmanager
    async def as_(self, who: str, **kwargs: Any) -> AsyncGenerator[Client]:
        async with bearer_client(self.s.url, self.tokens[who], **kwargs) as client:
            yield client


@asynccontextmanager
async def team(
    tmp_path: Path,
    fake: FakeProvider,
    *,
    approval_mode: str = "elicitation",
    operator: OperatorPolicy | None = None,
    **table: Any,
) -> AsyncGenerator[Team]:
    path = tmp_path / "tokens"
    tokens = {
        "alice": add_token(path, "alice", AGENT),
        "bob": add_token(path, "bob", AGENT),
        "ops": add_token(path, "ops", OPERATOR),
        "carol": add_token(path, "carol", OPERATOR),
    }
    h = make_harness(tmp_path, fake, table=table)
    h.approval_mode = approval_mode
    if operator is not None:
        h.operator = operator
    async with served(h, lambda _: TokenFileVerifier(path)) as s:
        yield Team(s, tokens)


def start_args(op: str, job: str, **extra: Any) -> dict[str, Any]:
    return {"provider": "acme", "operation_id": op, "provider_job_id": job, **extra}


def answer_text(result: Any) -> str:
    return json.dumps(
        {"error": result.is_error, "content": [getattr(b, "text", None) for b in result.content]},
        sort_keys=True,
    )


async def test_two_principals_may_use_the_same_operation_id_without_colliding(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("job-a", [succeeded(result_url="https://example.com/a")])
    fake.script("job-b", [pending("running")])
    async with team(tmp_path, fake) as t:
        async with t.as_("alice") as alice:
            a = view(await alice.call_tool("start_operation", start_args("report-1", "job-a")))
        async with t.as_("bob") as bob:
            b = view(await bob.call_tool("start_operation", start_args("report-1", "job-b")))
            again = view(await bob.call_tool("get_operation", {"operation_id": "report-1"}))
        assert a["operation_id"] == b["operation_id"] == again["operation_id"] == "report-1"
        assert again["status"] == "waiting"
        rows = db_rows(
            t.s.h.database, "SELECT operation_id, owner, provider_job_id FROM operations ORDER BY 1"
        )
        assert [tuple(r.values()) for r in rows] == [
            ("@alice/report-1", "alice", "job-a"),
            ("@bob/report-1", "bob", "job-b"),
        ]


@pytest.mark.parametrize("era", ERAS)
async def test_another_principals_operation_answers_every_tool_and_resource_exactly_as_an_unknown_id(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("secret-job", [pending("running")])
    async with team(tmp_path, fake) as t:
        async with t.as_("alice") as alice:
            view(await alice.call_tool("start_operation", start_args("secret", "secret-job")))
        async with t.as_("bob", **era) as bob:

            async def answers(op: str) -> list[str]:
                out: list[str] = []
                for tool, args in (
                    ("check_status", {"operation_id": op}),
                    ("get_operation", {"operation_id": op}),
                    ("fetch_result", {"operation_id": op}),
                    ("cancel_operation", {"operation_id": op}),
                    (
                        "request_extension",
                        {"operation_id": op, "extra_seconds": 60, "extra_status_requests": 1, "reason": "x"},
                    ),
                ):
                    result = await bob.call_tool(tool, args)
                    out.append(answer_text(result).replace(op, "<id>"))
                for uri in (f"pollwarden://operations/{op}", f"pollwarden://operations/{op}/audit"):
                    try:
                        await bob.read_resource(uri)
                        out.append("read")
                    except Exception as exc:
                        out.append(f"{type(exc).__name__}: {exc}".replace(op, "<id>"))
                return out

            theirs = await answers("secret")
            unknown = await answers("never-was")
            assert theirs == unknown
            assert all("no operation '<id>'" in a for a in theirs), theirs
            listed = view(await bob.call_tool("list_operations", {}))
            assert listed == {"operations": [], "count": 0}
            # The stored form names nothing either.
            assert await answers("@alice/secret") == [
                a.replace("<id>", "<id>") for a in await answers("@x/y")
            ]
        assert fake.status_requests("secret-job") == []  # nothing bob did reached the provider


async def test_an_agent_lists_only_its_own_operations_and_an_operator_reads_every_one(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("ja", [pending("running")])
    fake.script("jb", [pending("running")])
    async with team(tmp_path, fake) as t:
        async with t.as_("alice") as alice:
            view(await alice.call_tool("start_operation", start_args("mine", "ja")))
            mine = view(await alice.call_tool("list_operations", {}))
        async with t.as_("bob") as bob:
            view(await bob.call_tool("start_operation", start_args("mine", "jb")))
        assert [o["operation_id"] for o in mine["operations"]] == ["mine"]
        async with t.as_("ops") as ops:
            everything = view(await ops.call_tool("list_operations", {}))
            ids = sorted(o["operation_id"] for o in everything["operations"])
            assert ids == ["@alice/mine", "@bob/mine"]
            theirs = view(await ops.call_tool("get_operation", {"operation_id": "@bob/mine"}))
            assert theirs["operation_id"] == "@bob/mine"
            story = await ops.read_resource("pollwarden://operations/%40bob%2Fmine/audit")
            assert "tracking" in str(story) or "job jb" in str(story)


def auto_approve() -> Any:
    async def callback(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="accept", content={"decision": "approve"})

    return callback


async def test_an_agent_never_approves_its_own_extension_and_another_operator_decides_over_http(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("stuck", [pending("running")])
    async with team(tmp_path, fake) as t:
        async with t.as_("carol", mode="legacy", elicitation_callback=auto_approve()) as carol:
            view(await carol.call_tool("start_operation", start_args("long", "stuck", max_status_requests=1)))
            stopped = view(
                await carol.call_tool("check_status", {"operation_id": "long", "wait_seconds": 30})
            )
            assert stopped["stop_reason"] == "request_budget_exhausted"
            asked = view(
                await carol.call_tool(
                    "request_extension",
                    {
                        "operation_id": "long",
                        "extra_seconds": 600,
                        "extra_status_requests": 2,
                        "reason": "big",
                    },
                )
            )
            # Her client would approve anything: it is never asked. An operator must decide.
            assert asked["decision"] == "pending_approval"
            approval_id = asked["approval_id"]
            own = await carol.call_tool(
                "decide_approval", {"approval_id": approval_id, "decision": "approve"}
            )
            assert own.is_error
            assert "about your own operation" in answer_text(own)
        async with t.as_("alice") as alice:
            agent = await alice.call_tool(
                "decide_approval", {"approval_id": approval_id, "decision": "approve"}
            )
            assert agent.is_error
            assert "is for operators (a bearer token with the pollwarden:operator scope" in answer_text(agent)
        async with t.as_("ops") as ops:
            pending_list = view(await ops.call_tool("list_approvals", {}))
            assert [(a["approval_id"], a["owner"]) for a in pending_list["approvals"]] == [
                (approval_id, "carol")
            ]
            decided = view(
                await ops.call_tool("decide_approval", {"approval_id": approval_id, "decision": "approve"})
            )
            assert decided["status"] == "approved"
        async with t.as_("carol") as carol:
            resumed = view(await carol.call_tool("check_status", {"operation_id": "long"}))
            assert resumed["status"] == "waiting"
            assert resumed["max_status_requests"] == 3
        (row,) = db_rows(
            t.s.h.database,
            "SELECT decided_by, decided_method FROM approvals WHERE approval_id = ?",
            approval_id,
        )
        assert (row["decided_by"], row["decided_method"]) == ("ops", "http-operator")
        # The decision is in carol's story: who decided (the operator's principal) and how it was authenticated.
        decided_rows = [
            r
            for r in read_rows(t.s.h.db_path, "@carol/long")
            if r.payload_obj.get("note") == f"{approval_id} by ops"
        ]
        assert [r.payload_obj["authenticated_by"] for r in decided_rows] == ["http-operator"]
        assert decided_rows[0].payload_obj["principal"] == "carol"  # whose operation it is


async def test_over_stdio_the_caller_is_the_local_user_who_owns_and_sees_everything(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("local-job", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        view(await client.call_tool("start_operation", start_args("op-l", "local-job")))
        refused = await client.call_tool("decide_approval", {"approval_id": "ap-x", "decision": "approve"})
        assert refused.is_error
        assert "an agent does not decide approvals" in answer_text(refused)
        chosen = await client.call_tool("start_operation", start_args("@alice/x", "local-job"))
        assert chosen.is_error
        assert "must not start with '@'" in answer_text(chosen)
    rows = db_rows(h.database, "SELECT operation_id, owner FROM operations")
    assert rows == [{"operation_id": "op-l", "owner": "local"}]


async def test_one_job_has_one_budget_across_principals_and_another_principal_learns_only_that_it_is_tracked(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("shared-job", [pending("running")])
    async with team(tmp_path, fake) as t:
        async with t.as_("alice") as alice:
            first = view(await alice.call_tool("start_operation", start_args("a-1", "shared-job")))
            again = view(await alice.call_tool("start_operation", start_args("a-2", "shared-job")))
        async with t.as_("bob") as bob:
            refused = await bob.call_tool("start_operation", start_args("b-1", "shared-job"))
            listed = view(await bob.call_tool("list_operations", {}))
        assert first["operation_id"] == "a-1"
        # alice's second id is answered with her first operation: no second budget for her.
        assert (again["operation_id"], again["requested_operation_id"]) == ("a-1", "a-2")
        # bob gets no second budget or lease either (issue 30): told the job is tracked and that an
        # operator may share it, and nothing about alice's operation.
        text = answer_text(refused)
        assert refused.is_error
        assert "already tracked on this server under another principal" in text
        assert "An operator may share" in text
        assert "a-1" not in text
        assert "running" not in text
        assert listed["operations"] == []
    assert fake.status_requests("shared-job") == []


async def test_audit_rows_and_log_lines_carry_the_principal_and_never_a_token_or_its_hash(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("audited", [pending("running")])
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(PrincipalLogFilter())
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s [%(principal)s]: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    previous = root.level
    root.setLevel(logging.DEBUG)
    try:
        async with team(tmp_path, fake) as t:
            async with t.as_("alice") as alice:
                view(await alice.call_tool("start_operation", start_args("audited", "audited")))
                t.s.h.clock.advance(60)
                view(await alice.call_tool("check_status", {"operation_id": "audited"}))
                story = str(await alice.read_resource("pollwarden://operations/audited/audit"))
            with pytest.raises(Exception):  # noqa: B017, PT011 (a refused token; the log is what is checked)
                async with bearer_client(t.s.url, t.tokens["bob"] + "-forged") as forged:
                    await forged.list_tools()
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
    assert "for 'alice'" in story or "for alice" in story
    payloads = [
        json.loads(r["payload"]) for r in db_rows(t.s.h.database, "SELECT payload FROM audit ORDER BY seq")
    ]
    assert payloads
    assert all(p["principal"] == "alice" for p in payloads)
    logged = stream.getvalue()
    assert "[alice]: start_operation @alice/audited for alice: waiting" in logged
    secrets = [*t.tokens.values(), *(hash_token(v) for v in t.tokens.values())]
    secrets += [s.removeprefix("sha256:") for s in secrets if s.startswith("sha256:")]
    database = repr(db_snapshot(t.s.h.database))  # every row of every table, on either engine
    for secret in secrets:
        assert secret not in logged
        assert secret not in database


async def test_an_operator_token_cannot_decide_where_the_operator_requires_a_signed_decision(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("keyed", [pending("running")])
    async with team(tmp_path, fake, operator=OperatorPolicy(require_key=True)) as t:
        async with t.as_("alice") as alice:
            view(await alice.call_tool("start_operation", start_args("k", "keyed", max_status_requests=1)))
            view(await alice.call_tool("check_status", {"operation_id": "k", "wait_seconds": 30}))
            extension = {"operation_id": "k", "extra_seconds": 60, "extra_status_requests": 1, "reason": "x"}
            approval_id = view(await alice.call_tool("request_extension", extension))["approval_id"]
        async with t.as_("ops") as ops:
            refused = await ops.call_tool(
                "decide_approval", {"approval_id": approval_id, "decision": "approve"}
            )
        assert refused.is_error
        assert "signed with an operator key" in answer_text(refused)
        (row,) = db_rows(t.s.h.database, "SELECT status FROM approvals WHERE approval_id = ?", approval_id)
        assert row["status"] == "pending"


PAYLOAD = {"report": "q3", "format": "csv"}


async def asked_question(t: Team, operation_id: str) -> str:
    """The question the approval about `operation_id` puts to a person (what an operator and the card show)."""
    async with open_store(t.s.h.database) as store:
        (approval,) = await store.list_approvals(operation_id=operation_id)
    return str(approval.request["question"])


async def test_a_payload_that_failed_for_another_principal_needs_a_person_who_is_not_told_whose_it_was(
    tmp_path: Path, fake: FakeProvider
) -> None:
    def submissions() -> int:
        return len([e for e in fake.log() if e["route"] == "submit"])

    def submit(op: str) -> dict[str, Any]:
        return {"provider": "acme", "operation_id": op, "submit": PAYLOAD}

    def hides_alice(text: str) -> None:
        assert "alice" not in text
        assert '"first"' not in text
        assert "/first" not in text
        assert "disk full" not in text

    # Tool confirmation would let the local user's client approve it: an authenticated agent's never does.
    async with team(tmp_path, fake, approval_mode="tool-confirmation") as t:
        fake.script_new_jobs([failed("disk full")])
        async with t.as_("alice") as alice:
            view(await alice.call_tool("start_operation", submit("first")))
            ended = view(await alice.call_tool("check_status", {"operation_id": "first", "wait_seconds": 30}))
            assert ended["status"] == "failed"
        fake.script_new_jobs([pending("running")])
        # The provider saw this payload fail, whoever sent it: bob's same payload waits for a person too
        # (issue 30 item 3), and nothing he is shown names alice's operation, her or its facts.
        async with t.as_("bob") as bob:
            held = view(await bob.call_tool("start_operation", submit("b-1")))
            assert held["status"] == "submitting"
            assert "A person must decide" in held["message"]
            hides_alice(json.dumps(held))
            assert submissions() == 1
        question = await asked_question(t, "@bob/b-1")
        assert "already ended without success on this server for another principal" in question
        hides_alice(question)
        async with t.as_("ops") as ops:
            listed = view(await ops.call_tool("list_approvals", {}))["approvals"]
            assert [(a["operation_id"], a["owner"], a["kind"]) for a in listed] == [
                ("@bob/b-1", "bob", "resubmission")
            ]
            view(
                await ops.call_tool(
                    "decide_approval", {"approval_id": listed[0]["approval_id"], "decision": "deny"}
                )
            )
        async with t.as_("bob") as bob:
            denied = view(await bob.call_tool("start_operation", submit("b-1")))
            story = str(await bob.read_resource("pollwarden://operations/b-1/audit"))
        assert denied["status"] == "submitting"
        assert (
            "denied resubmitting a payload that ended on this server for another principal"
            in denied["message"]
        )
        hides_alice(json.dumps(denied))
        hides_alice(story)
        assert submissions() == 1
        # alice's own resubmission names her earlier operation to her, and an operator approves it.
        async with t.as_("alice") as alice:
            mine = view(await alice.call_tool("start_operation", submit("again")))
            assert mine["status"] == "submitting"
            assert submissions() == 1
        assert 'It was submitted before as "@alice/first"' in await asked_question(t, "@alice/again")
        async with t.as_("ops") as ops:
            listed = view(await ops.call_tool("list_approvals", {}))["approvals"]
            assert [(a["operation_id"], a["owner"], a["kind"]) for a in listed] == [
                ("@alice/again", "alice", "resubmission")
            ]
            view(
                await ops.call_tool(
                    "decide_approval", {"approval_id": listed[0]["approval_id"], "decision": "approve"}
                )
            )
        async with t.as_("alice") as alice:
            sent = view(await alice.call_tool("start_operation", submit("again")))
        assert (sent["operation_id"], sent["status"]) == ("again", "waiting")
        assert submissions() == 2
        approved = [r for r in read_rows(t.s.h.db_path, "@alice/again") if r.kind == "resubmission_approved"]
        assert [(r.payload_obj["approved_by"], r.payload_obj["authenticated_by"]) for r in approved] == [
            ("ops", "http-operator")
        ]


def send_anyway() -> Any:
    async def callback(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="accept", content={"decision": "send"})

    return callback


async def test_a_status_request_a_table_guards_waits_for_an_operator_over_http_whatever_the_agents_client_answers(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("guarded", [pending("running")])
    every = {"every_status_request": True}
    async with team(tmp_path, fake, approval_mode="tool-confirmation", approval=every) as t:
        async with t.as_("alice", mode="legacy", elicitation_callback=send_anyway()) as alice:
            view(await alice.call_tool("start_operation", start_args("g", "guarded")))
            held = view(await alice.call_tool("check_status", {"operation_id": "g", "wait_seconds": 30}))
        assert held["outcome"] == "not_yet"
        assert "A person must decide" in held["message"]
        assert fake.status_requests("guarded") == []
        async with t.as_("ops") as ops:
            listed = view(await ops.call_tool("list_approvals", {}))["approvals"]
            assert [(a["operation_id"], a["owner"], a["kind"]) for a in listed] == [
                ("@alice/g", "alice", "status_request")
            ]
            decision = {"approval_id": listed[0]["approval_id"], "decision": "approve"}
            view(await ops.call_tool("decide_approval", decision))
        async with t.as_("alice") as alice:
            sent = view(await alice.call_tool("check_status", {"operation_id": "g", "wait_seconds": 30}))
        assert sent["outcome"] == "polled"
        assert len(fake.status_requests("guarded")) == 1
        approved = [r for r in read_rows(t.s.h.db_path, "@alice/g") if r.kind == "status_request_approved"]
        assert [(r.payload_obj["decided_by"], r.payload_obj["authenticated_by"]) for r in approved] == [
            ("ops", "http-operator")
        ]


async def test_one_payload_in_flight_is_one_job_per_principal_without_revealing_another_principals_operation(
    tmp_path: Path, fake: FakeProvider
) -> None:
    def submit(op: str) -> dict[str, Any]:
        return {"provider": "acme", "operation_id": op, "submit": PAYLOAD}

    fake.script_new_jobs([pending("running")])
    async with team(tmp_path, fake) as t:
        async with t.as_("alice") as alice:
            first = view(await alice.call_tool("start_operation", submit("a-1")))
            again = view(await alice.call_tool("start_operation", submit("a-2")))
        async with t.as_("bob") as bob:
            theirs = view(await bob.call_tool("start_operation", submit("b-1")))
    assert (first["operation_id"], first["status"]) == ("a-1", "waiting")
    # alice's second id is answered with her payload in flight: no second submission for her.
    assert (again["operation_id"], again["requested_operation_id"]) == ("a-1", "a-2")
    # bob's same payload is his own job: sent, and nothing names alice's operation.
    assert (theirs["operation_id"], theirs["status"]) == ("b-1", "waiting")
    assert theirs.get("requested_operation_id") is None
    assert "a-1" not in json.dumps(theirs)
    assert len([e for e in fake.log() if e["route"] == "submit"]) == 2
