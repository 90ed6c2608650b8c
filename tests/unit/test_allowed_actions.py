"""README "Stop reasons, and what may happen next": what the agent may call next, by stop reason — and what the server refuses."""

from __future__ import annotations

import pytest

from harness import operation_record, provider_table
from pollwarden.config import ExtensionCaps
from pollwarden.core.records import status_for
from pollwarden.rules.extensions import plan_extension
from pollwarden.surface.views import allowed_actions, operation_view
from pollwarden_providers.table import ProviderTable

EXPECTED: dict[str, tuple[list[str], list[str]]] = {
    # stop reason: (without [cancel], with [cancel])
    "succeeded": (["fetch_result"], ["fetch_result"]),
    "deadline_exceeded": (["request_extension"], ["request_extension", "cancel_operation"]),
    "request_budget_exhausted": (["request_extension"], ["request_extension", "cancel_operation"]),
    "rate_limited": (["request_extension"], ["request_extension", "cancel_operation"]),
    "unknown_state": (["request_extension"], ["request_extension"]),
    "delivery_ambiguous": (["request_extension"], ["request_extension"]),
    "authorization_denied": ([], []),
    "integration_failure": ([], []),
    "provider_failure": ([], []),
    "cancelled": ([], []),
    "expired": ([], []),
}


def _table(with_cancel: bool) -> ProviderTable:
    return provider_table({"cancel": {"path": "/v1/jobs/{job_id}/cancel"}} if with_cancel else {})


@pytest.mark.parametrize("stop_reason", sorted(EXPECTED))
@pytest.mark.parametrize("with_cancel", [False, True], ids=["no-cancel", "with-cancel"])
def test_each_stop_reason_allows_exactly_the_documented_actions(stop_reason: str, with_cancel: bool) -> None:
    record = operation_record(status=status_for(stop_reason), stop_reason=stop_reason)
    table = _table(with_cancel)
    expected = EXPECTED[stop_reason][1 if with_cancel else 0]
    assert allowed_actions(record, table) == expected
    shown = operation_view(record, table, now=1600.0)
    assert shown.allowed_actions == expected
    if shown.status == "escalated":
        assert shown.escalation is not None
        offered = {o.action for o in shown.escalation.options} - {"inspect_provider_console"}
        # After a refusal a person fixes the cause and an operator reopens (never the agent).
        reopen = (
            {"operator_reopen"} if stop_reason in ("authorization_denied", "integration_failure") else set()
        )
        assert offered == set(expected) | reopen
        assert "continue?" not in shown.escalation.message.lower()


@pytest.mark.parametrize("stop_reason", sorted(EXPECTED))
def test_request_extension_is_refused_exactly_where_the_table_does_not_allow_it(stop_reason: str) -> None:
    record = operation_record(status=status_for(stop_reason), stop_reason=stop_reason)
    plan = plan_extension(
        record, _table(True), ExtensionCaps(), extra_seconds=900, extra_status_requests=4, reason="r"
    )
    assert plan.allowed == ("request_extension" in EXPECTED[stop_reason][0])
    if not plan.allowed:
        assert plan.refusal is not None
        assert "allowed actions" in plan.refusal


def test_a_waiting_operation_may_only_be_checked() -> None:
    record = operation_record(status_requests_used=1, stopped_at=None)
    assert allowed_actions(record, _table(True)) == ["check_status"]


def test_a_submission_whose_fate_is_unknown_allows_nothing() -> None:
    record = operation_record(status="escalated", stop_reason="delivery_ambiguous", provider_job_id=None)
    assert allowed_actions(record, _table(True)) == []


@pytest.mark.parametrize("stop_reason", ["unknown_state", "request_budget_exhausted", "awaiting_review"])
def test_the_safe_options_line_names_each_option_once(stop_reason: str) -> None:
    record = operation_record(status=status_for(stop_reason), stop_reason=stop_reason)
    shown = operation_view(record, _table(True), now=1600.0)
    assert shown.escalation is not None
    safe = next(line for line in shown.escalation.message.splitlines() if line.startswith("Safe options: "))
    extension = next(o for o in shown.escalation.options if o.action == "request_extension")
    head = extension.label.partition(": ")[0]
    assert safe.count(head) == 1, safe
