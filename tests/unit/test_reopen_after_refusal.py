"""No identical request after a refusal until an operator says the cause is fixed (issue 12, item 3): the pure checks.

The checks on real files, servers and processes: tests/integration/test_reopen_after_refusal.py.
"""

from __future__ import annotations

from harness import operation_record
from pollwarden.rules.job_identity import reopen_next_check_at


def test_a_reopened_operation_never_sends_before_a_retry_after_still_in_force() -> None:
    record = operation_record(
        status="escalated",
        stop_reason="authorization_denied",
        last_http_at=1000.0,
        retry_after_seconds=120.0,
        not_before_at=1120.0,
    )
    assert reopen_next_check_at(record, 1010.0) == 1120.0
    assert reopen_next_check_at(record, 1200.0) == 1200.0
    assert (
        reopen_next_check_at(operation_record(last_http_at=1000.0, retry_after_seconds=None), 1010.0)
        == 1010.0
    )
