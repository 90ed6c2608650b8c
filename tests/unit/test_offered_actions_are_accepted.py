"""Every stop reason offers only what the tools then accept (issue 30, item 5).

For each stop reason — and after the business deadline, and with the operator's
limit of extensions used up — the view's allowed actions and escalation options
are checked against the tools' own pure plans: a request_extension offered is
one `plan_extension` accepts with exactly the offered arguments; one that would
be refused is neither listed nor offered.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from harness import operation_record, provider_table
from pollwarden.config import ExtensionCaps
from pollwarden.core.records import OperationRecord
from pollwarden.core.timefmt import parse_iso
from pollwarden.core.vocabulary import StopReason, status_for
from pollwarden.rules.extensions import offered_extension_refusal, plan_extension
from pollwarden.surface.views import OperationView, allowed_actions, operation_view, suggested_extension

NOW = 1600.0
CAPS = ExtensionCaps()
TABLE = provider_table(
    {
        "cancel": {"path": "/v1/jobs/{job_id}/cancel", "method": "POST"},
        "results": {"failed": ["result_url"]},
    }
)
SITUATIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "business deadline passed": {"business_deadline_at": 1400.0},
    "business deadline ended waiting": {"business_deadline_at": 1700.0},
    "extensions used up": {"extensions_used": CAPS.max_extensions_per_operation},
}


def stopped(reason: StopReason, **changes: Any) -> OperationRecord:
    return operation_record(
        status=status_for(reason),
        stop_reason=reason,
        stop_detail="why",
        stopped_at=1500.0,
        updated_at=1500.0,
        submit_payload_json='{"input": "x"}',
        **changes,
    )


def shown(record: OperationRecord) -> OperationView:
    return operation_view(
        record,
        TABLE,
        now=NOW,
        suggestion=suggested_extension(CAPS.max_extra_seconds, CAPS.max_extra_status_requests),
        extension_check=partial(offered_extension_refusal, table=TABLE, caps=CAPS, now=NOW),
    )


def accepted(record: OperationRecord, arguments: dict[str, object]) -> str | None:
    """Why plan_extension refuses these arguments, or None when it accepts them."""
    business = arguments.get("new_business_deadline_at")
    plan = plan_extension(
        record,
        TABLE,
        CAPS,
        extra_seconds=float(arguments["extra_seconds"]),  # type: ignore[arg-type]
        extra_status_requests=int(arguments["extra_status_requests"]),  # type: ignore[call-overload]
        reason="",
        new_business_deadline_at=parse_iso(business) if isinstance(business, str) else None,
        now=NOW,
    )
    return None if plan.allowed else plan.refusal


@pytest.mark.parametrize("situation", list(SITUATIONS))
@pytest.mark.parametrize("reason", list(StopReason))
def test_every_offered_action_is_one_the_tools_accept_and_no_refused_one_is_listed(
    reason: StopReason, situation: str
) -> None:
    record = stopped(reason, **SITUATIONS[situation])
    view = shown(record)
    offered = [o for o in (view.escalation.options if view.escalation else [])]
    for option in offered:
        if option.action in ("inspect_provider_console", "operator_reopen"):
            continue  # a person's own step, not a tool call
        assert option.action in view.allowed_actions, (option.action, view.allowed_actions)
        if option.action == "request_extension":
            assert accepted(record, option.arguments) is None, option.arguments
    base = allowed_actions(record, TABLE)
    if "request_extension" in base:
        arguments: dict[str, object] = next(
            (o.arguments for o in offered if o.action == "request_extension"),
            {"extra_seconds": 900.0, "extra_status_requests": 4},
        )
        refusal = accepted(record, arguments)
        assert ("request_extension" in view.allowed_actions) == (refusal is None), refusal
    # Whatever else is listed is listed by the same rule the tools check.
    assert set(view.allowed_actions) <= set(base)


def test_after_the_business_deadline_the_offer_is_a_new_business_deadline_a_person_sets() -> None:
    record = stopped(StopReason.DEADLINE_EXCEEDED, business_deadline_at=1400.0)
    view = shown(record)
    assert view.escalation is not None
    [option] = [o for o in view.escalation.options if o.action == "request_extension"]
    assert "set a new business deadline" in option.label
    assert parse_iso(str(option.arguments["new_business_deadline_at"])) > NOW
    assert "set a new business deadline" in view.escalation.message
    without = {k: v for k, v in option.arguments.items() if k != "new_business_deadline_at"}
    refusal = accepted(record, without)
    assert refusal is not None
    assert "new_business_deadline_at" in refusal


def test_with_every_extension_used_request_extension_is_neither_listed_nor_offered() -> None:
    record = stopped(StopReason.REQUEST_BUDGET_EXHAUSTED, extensions_used=CAPS.max_extensions_per_operation)
    view = shown(record)
    assert "request_extension" not in view.allowed_actions
    assert view.escalation is not None
    assert all(o.action != "request_extension" for o in view.escalation.options)
    assert "extend waiting once" not in view.escalation.message


def test_while_a_person_may_not_be_asked_again_request_extension_is_neither_listed_nor_offered() -> None:
    from pollwarden.rules.questions import Ask, may_ask

    record = stopped(StopReason.REQUEST_BUDGET_EXHAUSTED)
    declined = may_ask([Ask(1550.0, declined=True)], [], now=NOW, last_answer_at=1400.0)
    later = may_ask([Ask(1550.0, declined=True)], [], now=1550.0 + 900.0, last_answer_at=1400.0)
    args = {"operation_id": record.operation_id, "extra_seconds": 900.0, "extra_status_requests": 4}
    check = partial(offered_extension_refusal, table=TABLE, caps=CAPS, now=NOW)
    assert "a person declined at" in (check(record, args, asked=declined) or "")
    assert check(record, args, asked=later) is None
    view = operation_view(record, TABLE, now=NOW, extension_check=partial(check, asked=declined))
    assert "request_extension" not in view.allowed_actions
    assert view.escalation is not None
    assert all(o.action != "request_extension" for o in view.escalation.options)
