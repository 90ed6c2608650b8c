"""A whole check_status call fits inside a client's default request timeout: the pure checks.

The checks on real files, servers and processes: tests/integration/test_call_budget.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollwarden.config import MAX_WAIT_SECONDS
from pollwarden.provider_io.provider_http import HttpLimits
from pollwarden.rules.schedule import (
    CALL_BUDGET_SECONDS,
    CALL_MARGIN_SECONDS,
    CLIENT_REQUEST_TIMEOUT_SECONDS,
    wait_bound,
)

DEFAULT_REQUEST_TIMEOUT = HttpLimits().total_timeout_seconds


def test_the_call_budget_leaves_a_margin_under_the_clients_default_timeout() -> None:
    assert CALL_BUDGET_SECONDS + CALL_MARGIN_SECONDS <= CLIENT_REQUEST_TIMEOUT_SECONDS
    # With the default 20 s request cap a call waits at most 30 s.
    assert (
        wait_bound(MAX_WAIT_SECONDS, max_wait=MAX_WAIT_SECONDS, request_timeout=DEFAULT_REQUEST_TIMEOUT) == 30
    )


def test_the_schemas_maximum_wait_is_what_the_server_really_waits_with_the_default_request_cap() -> None:
    # The tool schema's `le` is MAX_WAIT_SECONDS: a larger value would be accepted and silently cut.
    assert (
        wait_bound(float("inf"), max_wait=float("inf"), request_timeout=DEFAULT_REQUEST_TIMEOUT)
        == MAX_WAIT_SECONDS
    )


@given(
    requested=st.floats(min_value=0, max_value=MAX_WAIT_SECONDS),
    request_timeout=st.floats(min_value=0, max_value=120),
)
def test_wait_plus_request_timeout_plus_margin_never_exceeds_the_call_budget(
    requested: float, request_timeout: float
) -> None:
    bound = wait_bound(requested, max_wait=MAX_WAIT_SECONDS, request_timeout=request_timeout)
    assert 0 <= bound <= requested
    if request_timeout + CALL_MARGIN_SECONDS <= CALL_BUDGET_SECONDS:
        assert bound + request_timeout + CALL_MARGIN_SECONDS <= CALL_BUDGET_SECONDS + 1e-9
        # What fits is never cut: the bound only shortens a wait that would not fit.
        if requested + request_timeout + CALL_MARGIN_SECONDS <= CALL_BUDGET_SECONDS:
            # Within float rounding: `room` may come out 0.0 where the sum above just fits.
            assert bound == pytest.approx(requested, abs=1e-9)
    else:
        assert bound == 0  # no room to wait at all: the call sends at once or answers not_yet
