"""README "Stop reasons, and what may happen next": what the agent may call next, by stop reason — and what the server refuses."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from harness import base_table, merge
from pollwarden.config import ExtensionCaps
from pollwarden.extensions import plan_extension
from pollwarden.records import OperationRecord, status_for
from pollwarden.views import allowed_actions, operation_view
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
    overrides: dict[str, Any] = {"cancel": {"path": "/v1/jobs/{job_id}/cancel"}} if with_cancel else {}
    return ProviderTable.model_validate(merge(base_table("http://127.0.0.1:9"), overrides))


def _record(**changes: Any) -> OperationRecord:
    base = OperationRecord(
        operation_id="op",
        provider="acme",
        provider_job_id="job-1",
        account_context="http://127.0.0.1:9 as anonymous",
        request_fingerprint="f",
        idempotency_key=None,
        expected_terminal_state="succeeded",
        status="waiting",
        stop_reason=None,
        stop_detail=None,
        state="running",
        category="pending",
        started_at=1000.0,
        deadline_at=3400.0,
        business_deadline_at=None,
        max_status_requests=12,
        max_transport_failures=3,
        max_rate_limited=3,
        status_requests_used=12,
        transport_failures_used=0,
        rate_limited_used=0,
        polls_completed=12,
        next_check_at=1005.0,
        delay_source="local_backoff",
        retry_after_seconds=None,
        last_http_status=200,
        last_http_at=1500.0,
        provider_request_id=None,
        provider_expires_at=None,
        error=None,
        result_json=None,
        lease_owner=None,
        lease_expires_at=None,
        extensions_used=0,
        stopped_at=1500.0,
        submit_payload_json=None,
        created_at=1000.0,
        updated_at=1500.0,
        version=5,
        fleet_slot_at=None,
    )
    return replace(base, **changes)


@pytest.mark.parametrize("stop_reason", sorted(EXPECTED))
@pytest.mark.parametrize("with_cancel", [False, True], ids=["no-cancel", "with-cancel"])
def test_each_stop_reason_allows_exactly_the_documented_actions(stop_reason: str, with_cancel: bool) -> None:
    record = _record(status=status_for(stop_reason), stop_reason=stop_reason)
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
    record = _record(status=status_for(stop_reason), stop_reason=stop_reason)
    plan = plan_extension(
        record, _table(True), ExtensionCaps(), extra_seconds=900, extra_status_requests=4, reason="r"
    )
    assert plan.allowed == ("request_extension" in EXPECTED[stop_reason][0])
    if not plan.allowed:
        assert plan.refusal is not None
        assert "allowed actions" in plan.refusal


def test_a_waiting_operation_may_only_be_checked() -> None:
    record = _record(status_requests_used=1, stopped_at=None)
    assert allowed_actions(record, _table(True)) == ["check_status"]


def test_a_submission_whose_fate_is_unknown_allows_nothing() -> None:
    record = _record(status="escalated", stop_reason="delivery_ambiguous", provider_job_id=None)
    assert allowed_actions(record, _table(True)) == []


@pytest.mark.parametrize("stop_reason", ["unknown_state", "request_budget_exhausted", "awaiting_review"])
def test_the_safe_options_line_names_each_option_once(stop_reason: str) -> None:
    record = _record(status=status_for(stop_reason), stop_reason=stop_reason)
    shown = operation_view(record, _table(True), now=1600.0)
    assert shown.escalation is not None
    safe = next(line for line in shown.escalation.message.splitlines() if line.startswith("Safe options: "))
    extension = next(o for o in shown.escalation.options if o.action == "request_extension")
    head = extension.label.partition(": ")[0]
    assert safe.count(head) == 1, safe
