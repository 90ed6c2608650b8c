"""A denial is an answer (issue 30, item 10): one open question per operation, and no asking again for nothing.

Found by trying it: after a person declined, the agent was told "Allowed next: request_extension" with no
limit, and declined 8 times, the person was asked 8 times; without elicitation, 8 calls made 8 pending
approvals for one operation, an operator approved two, both were told "approved", and the second silently
became void. Both protocol eras; the one open question on both engines.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from mcp_types import TextResourceContents

from harness import make_harness, make_operator, view
from pollwarden.core.clock import FakeClock
from pollwarden.rules.questions import ASK_AGAIN_AFTER_SECONDS, MAX_QUESTIONS_PER_OPERATION
from pollwarden.store import open_store
from tests.integration.test_app_card import apps_client
from tests.integration.test_approvals import ERAS, Person, _cli, _exhaust, _extend  # pyright: ignore[reportPrivateUsage]
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is what the agent and the person are told (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


@pytest.mark.parametrize("era", ERAS)
async def test_a_person_who_declined_is_not_asked_again_for_nothing_and_at_most_three_times_in_all(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    person = Person("accept", {"decision": "deny"})
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=person, **era) as client:
        await _exhaust(h, client, "no8")
        first = view(await client.call_tool("request_extension", _extend("no8")))
        assert first["decision"] == "denied"
        # Told, and shown, that asking again needs something new.
        assert "request_extension" not in first["operation"]["allowed_actions"]
        assert "A denial is an answer" in first["message"]
        answers = [view(await client.call_tool("request_extension", _extend("no8"))) for _ in range(7)]
        assert len(person.questions) == 1  # declined once: asked once, not 8 times
        for refused in answers:
            assert refused["decision"] == "refused"
            assert "a person declined at" in refused["message"]
            assert "request_extension" not in refused["operation"]["allowed_actions"]
        # A later time is something new, up to the bound.
        again: dict[str, Any] = {}
        for asked in range(2, MAX_QUESTIONS_PER_OPERATION + 1):
            h.clock.advance(ASK_AGAIN_AFTER_SECONDS)
            again = view(await client.call_tool("request_extension", _extend("no8")))
            assert again["decision"] == "denied"
            assert len(person.questions) == asked
        # The last question allowed was declined: the agent is told no more are asked, not when to ask again.
        assert "nothing more is asked: a person takes over" in again["message"]
        assert "request_extension again" not in again["message"]
        assert "request_extension" not in again["operation"]["allowed_actions"]
        h.clock.advance(ASK_AGAIN_AFTER_SECONDS)
        bounded = view(await client.call_tool("request_extension", _extend("no8")))
    assert bounded["decision"] == "refused"
    assert f"the limit ({MAX_QUESTIONS_PER_OPERATION})" in bounded["message"]
    assert len(person.questions) == MAX_QUESTIONS_PER_OPERATION


@pytest.mark.parametrize("era", ERAS)
async def test_a_new_answer_from_the_provider_is_something_new_to_ask_about(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    person = Person("accept", {"decision": "deny"})
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=person, **era) as client:
        await _exhaust(h, client, "moved")
        assert view(await client.call_tool("request_extension", _extend("moved")))["decision"] == "denied"
        person.content = {"decision": "approve"}
        assert view(await client.call_tool("request_extension", _extend("moved")))["decision"] == "refused"
        # An operator grants a request by other means is not modelled here; a later time is.
        h.clock.advance(ASK_AGAIN_AFTER_SECONDS)
        granted = view(await client.call_tool("request_extension", _extend("moved", requests=1)))
        assert granted["decision"] == "approved"
        fake.script("moved", [pending("running")])
        polled = view(
            await client.call_tool("check_status", {"operation_id": "op-moved", "wait_seconds": 30})
        )
        assert polled["stop_reason"] == "request_budget_exhausted"
        # The job moved since the last answer: asking right away is allowed.
        person.content = {"decision": "deny"}
        assert view(await client.call_tool("request_extension", _extend("moved")))["decision"] == "denied"
    assert len(person.questions) == 3


@pytest.mark.both_engines
@pytest.mark.parametrize("era", ERAS)
async def test_without_elicitation_eight_asks_leave_one_open_question_and_its_approval_applies(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    h = make_harness(tmp_path, fake, clock=FakeClock(time.time()))
    h.operator = make_operator(h.tmp / "operator").policy()  # the server trusts the key _cli signs with
    async with h.client(**era) as client:
        await _exhaust(h, client, "open8")
        answers = [view(await client.call_tool("request_extension", _extend("open8"))) for _ in range(8)]
        ids = {a["approval_id"] for a in answers}
        assert len(ids) == 1
        assert [a["decision"] for a in answers] == ["pending_approval"] * 8
        assert "already waits for an operator" in answers[1]["message"]
        async with open_store(h.database) as store:
            pending_ids = [a.approval_id for a in await store.list_approvals(status="pending")]
        assert pending_ids == list(ids)
        decided = _cli(h, "approve", ids.pop(), "--by", "ops-alice")
        assert decided.returncode == 0, decided.stderr
        applied = view(
            await client.call_tool("check_status", {"operation_id": "op-open8", "wait_seconds": 30})
        )
    assert applied["outcome"] == "polled"
    assert applied["max_status_requests"] == 6


async def test_a_question_asked_about_the_operation_as_it_was_leaves_the_pending_list(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        stopped = await _exhaust(h, client, "stale")
        async with open_store(h.database) as store:
            record = await store.get("op-stale")
            assert record is not None
            before = dataclasses.replace(record, version=record.version - 1)
            stale = await store.open_approval(
                approval_id="ap-stale",
                record=before,
                kind="extension",
                request={},
                at=h.clock.now(),
                ttl_seconds=900,
            )
            asked = view(await client.call_tool("request_extension", _extend("stale")))
            assert asked["decision"] == "pending_approval"
            assert asked["approval_id"] != stale.approval_id
            pending_ids = [a.approval_id for a in await store.list_approvals(status="pending")]
            voided = await store.get_approval("ap-stale")
    assert stopped["stop_reason"] == "request_budget_exhausted"
    assert pending_ids == [asked["approval_id"]]
    assert voided is not None
    assert voided.status == "void"


def offers_extension(shown: dict[str, Any]) -> bool:
    """Whether a view lists request_extension, or offers it among its escalation's options."""
    escalation: dict[str, Any] = shown.get("escalation") or {}
    options = [str(o["action"]) for o in escalation.get("options", [])]
    listed = "request_extension" in shown["allowed_actions"]
    assert listed == ("request_extension" in options), shown
    return listed


async def test_after_a_denial_no_view_offers_request_extension_until_asking_again_is_allowed(
    tmp_path: Path, fake: FakeProvider
) -> None:
    person = Person("accept", {"decision": "deny"})
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=person) as client, apps_client(h) as host:

        async def every_view() -> list[dict[str, Any]]:
            op = {"operation_id": "op-views"}
            listed = view(await client.call_tool("list_operations", {}))["operations"]
            (content,) = (await client.read_resource("pollwarden://operations/op-views")).contents
            assert isinstance(content, TextResourceContents)
            resource = json.loads(content.text)
            card = view(await host.call_tool("app_card_state", op))["operation"]
            return [
                view(await client.call_tool("get_operation", op)),
                view(await client.call_tool("check_status", op)),
                *[o for o in listed if o["operation_id"] == "op-views"],
                resource,
                card,
            ]

        stopped = await _exhaust(h, client, "views")
        assert offers_extension(stopped)
        assert all(offers_extension(v) for v in await every_view())
        denied = view(await client.call_tool("request_extension", _extend("views")))
        assert denied["decision"] == "denied"
        # Declined: every view leaves request_extension out, as the refusal would say (issue 30 item 10).
        after = await every_view()
        assert len(after) == 5
        assert not any(offers_extension(v) for v in after)
        assert all("extend waiting once" not in v["escalation"]["message"] for v in after)
        # A refusal of another tool names the same allowed actions.
        fetched = view(await client.call_tool("fetch_result", {"operation_id": "op-views"}))
        assert fetched["decision"] == "refused"
        assert "request_extension" not in fetched["message"]
        assert "request_extension" not in fetched["allowed_actions"]
        # From the time asking again is allowed, every view offers it again, and the call is accepted.
        h.clock.advance(ASK_AGAIN_AFTER_SECONDS)
        assert all(offers_extension(v) for v in await every_view())
        assert view(await client.call_tool("request_extension", _extend("views")))["decision"] == "denied"
        assert len(person.questions) == 2
