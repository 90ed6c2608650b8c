"""The edges of asking a person: a dismissed question, an answer that fits no choice, a late answer.

Every one is told in plain words and none is lost: a question dismissed
without an answer reads as a sentence, an answer outside the offered choices
is refused without the SDK's internal names, and an answer that arrives after
the client stopped waiting for the tool call (2025-11-25, where the question
travels on the back channel while the call is open) is still recorded as the
person's decision, which the agent's next call applies.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client import ClientRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitRequestParams, ElicitResult

from harness import Harness, error_text, make_harness, view
from pollwarden.audit.chain import read_rows
from pollwarden.audit.story import render_story
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is asking a person over MCP (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]
CANCEL_TABLE = {"cancel": {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"}}
# (tool, arguments for op-<job>, the approving answer)
TOOLS = [
    pytest.param(
        "request_extension",
        {"extra_seconds": 600, "extra_status_requests": 2, "reason": "the export is large"},
        {"decision": "approve"},
        id="request_extension",
    ),
    pytest.param("cancel_operation", {}, {"decision": "cancel_at_provider"}, id="cancel_operation"),
]
INTERNAL_NAMES = ("Resolver", "pollwarden.", "_ask", "schema", "Error executing tool", "ValidationError")


def answering(action: str, content: dict[str, Any] | None = None, *, gate: anyio.Event | None = None) -> Any:
    """An elicitation callback: a person who answers `action` (once `gate` opens, if given)."""

    async def person(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        if gate is not None:
            await gate.wait()
        return ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return person


async def stopped_operation(h: Harness, client: Any, job: str) -> dict[str, Any]:
    """An operation whose one-request budget is used: extension and cancel may be asked for."""
    h.fake.script(job, [pending("running")])
    args = {"provider": "acme", "operation_id": f"op-{job}", "provider_job_id": job, "max_status_requests": 1}
    view(await client.call_tool("start_operation", args))
    stopped = view(await client.call_tool("check_status", {"operation_id": f"op-{job}", "wait_seconds": 30}))
    assert stopped["stop_reason"] == "request_budget_exhausted"
    return stopped


def cancels(fake: FakeProvider) -> list[Any]:
    return [e for e in fake.log() if e["route"] == "cancel"]


async def eventually(condition: Callable[[], bool]) -> None:
    """Wait (bounded) for a row the server writes after the client stopped waiting.

    The row lands in the database file, which no event reaches: look again every 10 ms, for 10 s at most.
    """
    for _ in range(1000):
        if condition():
            return
        await anyio.sleep(0.01)
    raise AssertionError("the server did not record it within 10 s")


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(("tool", "extra", "yes"), TOOLS)
async def test_a_question_dismissed_without_an_answer_reads_as_a_sentence_and_changes_nothing(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any], tool: str, extra: dict[str, Any], yes: Any
) -> None:
    h = make_harness(tmp_path, fake, table=CANCEL_TABLE)
    async with h.client(elicitation_callback=answering("cancel"), **era) as client:
        stopped = await stopped_operation(h, client, "dismiss")
        result = view(await client.call_tool(tool, {"operation_id": "op-dismiss", **extra}))
    assert result["decision"] == "cancelled"
    assert result["message"].startswith("The question was dismissed without an answer (cancelled); nothing ")
    assert "not answered (cancelled) the" not in result["message"]
    assert result["operation"]["max_status_requests"] == stopped["max_status_requests"]
    assert cancels(fake) == []


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(("tool", "extra", "yes"), TOOLS)
async def test_an_answer_that_fits_no_offered_choice_is_refused_in_plain_words(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any], tool: str, extra: dict[str, Any], yes: Any
) -> None:
    h = make_harness(tmp_path, fake, table=CANCEL_TABLE)
    async with h.client(elicitation_callback=answering("accept", {"decision": "maybe"}), **era) as client:
        stopped = await stopped_operation(h, client, "odd")
        text = error_text(await client.call_tool(tool, {"operation_id": "op-odd", **extra}))
        after = view(await client.call_tool("get_operation", {"operation_id": "op-odd"}))
    assert "did not match the choices offered" in text
    assert f"call {tool} again" in text
    for name in INTERNAL_NAMES:
        assert name not in text, (name, text)
    assert (after["status"], after["max_status_requests"]) == ("escalated", stopped["max_status_requests"])
    assert cancels(fake) == []


@pytest.mark.both_engines
@pytest.mark.parametrize(("tool", "extra", "yes"), TOOLS)
async def test_an_answer_that_arrives_after_the_client_timed_out_is_recorded_and_used_by_the_next_call(
    tmp_path: Path, fake: FakeProvider, tool: str, extra: dict[str, Any], yes: dict[str, Any]
) -> None:
    gate = anyio.Event()
    h = make_harness(tmp_path, fake, table=CANCEL_TABLE)
    async with h.client(elicitation_callback=answering("accept", yes, gate=gate), mode="legacy") as client:
        await stopped_operation(h, client, "late")
        with pytest.raises(MCPError, match="timed out"):
            await client.call_tool(tool, {"operation_id": "op-late", **extra}, read_timeout_seconds=0.3)
        gate.set()  # the person answers after the client gave up on the call

        def recorded() -> bool:
            return any(row.kind == "approval_granted" for row in read_rows(h.db_path, "op-late"))

        await eventually(recorded)
        if tool == "request_extension":
            # wait_seconds: the approval keeps the table's base delay after the last request.
            applied = view(
                await client.call_tool("check_status", {"operation_id": "op-late", "wait_seconds": 30})
            )
            assert (applied["outcome"], applied["max_status_requests"]) == ("polled", 3)
            # As the README says: the check that applies the extension goes straight on to the check it
            # allows; the extension's own row carries manual_extension, the view the schedule after the poll.
            rows = [
                row for row in read_rows(h.db_path, "op-late") if row.kind in ("extension_approved", "polled")
            ]
            assert [row.kind for row in rows[-2:]] == ["extension_approved", "polled"]
            assert rows[-2].payload_obj["delay_source"] == "manual_extension"
            assert applied["delay_source"] == "local_backoff"
        else:
            sent = view(await client.call_tool("cancel_operation", {"operation_id": "op-late"}))
            assert sent["decision"] == "done"
            assert len(cancels(fake)) == 1
    story = "\n".join(render_story(read_rows(h.db_path, "op-late")))
    assert "answered after the client stopped waiting" in story


async def test_a_late_cancel_answer_to_a_question_about_an_operation_that_changed_since_is_void(
    tmp_path: Path, fake: FakeProvider
) -> None:
    gate = anyio.Event()
    h = make_harness(tmp_path, fake, table=CANCEL_TABLE)
    person = answering("accept", {"decision": "cancel_at_provider"}, gate=gate)
    async with h.client(elicitation_callback=person, mode="legacy") as client:
        await stopped_operation(h, client, "moved")
        with pytest.raises(MCPError, match="timed out"):
            await client.call_tool("cancel_operation", {"operation_id": "op-moved"}, read_timeout_seconds=0.3)
        # Before the person answers, the operation changes: another person approves an extension.
        async with h.client(elicitation_callback=answering("accept", {"decision": "approve"})) as other:
            args = {"operation_id": "op-moved", **TOOLS[0].values[1]}
            extended = view(await other.call_tool("request_extension", args))
        assert extended["decision"] == "approved"
        gate.set()  # the person answers the question about the operation as it was
        await eventually(lambda: any(row.kind == "cancel_void" for row in read_rows(h.db_path, "op-moved")))
    async with h.client() as nobody_to_ask:
        after = view(await nobody_to_ask.call_tool("cancel_operation", {"operation_id": "op-moved"}))
    assert after["decision"] != "done"
    assert cancels(fake) == []
    kinds = [row.kind for row in read_rows(h.db_path, "op-moved")]
    assert "approval_granted" not in kinds[kinds.index("extension_approved") :]


async def test_a_late_dismissal_is_audited_and_changes_nothing(tmp_path: Path, fake: FakeProvider) -> None:
    gate = anyio.Event()
    h = make_harness(tmp_path, fake)
    async with h.client(elicitation_callback=answering("cancel", gate=gate), mode="legacy") as client:
        stopped = await stopped_operation(h, client, "gone")
        args = {"operation_id": "op-gone", **TOOLS[0].values[1]}
        with pytest.raises(MCPError, match="timed out"):
            await client.call_tool("request_extension", args, read_timeout_seconds=0.3)
        gate.set()
        await eventually(
            lambda: any(row.kind == "extension_unanswered" for row in read_rows(h.db_path, "op-gone"))
        )
        after = view(await client.call_tool("check_status", {"operation_id": "op-gone"}))
    assert (after["outcome"], after["max_status_requests"]) == ("stopped", stopped["max_status_requests"])
    story = "\n".join(render_story(read_rows(h.db_path, "op-gone")))
    assert "the client stopped waiting for the answer" in story
