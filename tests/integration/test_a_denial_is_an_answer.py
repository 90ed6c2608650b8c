"""A denial is an answer (issue 30, item 10): one open question per operation, and no asking again for nothing.

Found by trying it: after a person declined, the agent was told "Allowed next: request_extension" with no
limit, and declined 8 times, the person was asked 8 times; without elicitation, 8 calls made 8 pending
approvals for one operation, an operator approved two, both were told "approved", and the second silently
became void. Both protocol eras; the one open question on both engines.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from harness import make_harness, make_operator, view
from pollwarden.clock import FakeClock
from pollwarden.questions import ASK_AGAIN_AFTER_SECONDS, MAX_QUESTIONS_PER_OPERATION
from pollwarden.store import open_store
from tests.integration.test_approvals import ERAS, Person, _cli, _exhaust, _extend
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
        for asked in range(2, MAX_QUESTIONS_PER_OPERATION + 1):
            h.clock.advance(ASK_AGAIN_AFTER_SECONDS)
            again = view(await client.call_tool("request_extension", _extend("no8")))
            assert again["decision"] == "denied"
            assert len(person.questions) == asked
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
