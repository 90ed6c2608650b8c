"""The 8-process race, CI size: real `pollwarden serve` processes on one database, one operation at a time.

The full run (200 trials) is `python -m benchmarks.stress_race`; this runs the
same code for one trial of each provider scenario.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.race import run_stress

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_eight_processes_racing_on_one_operation_never_exceed_its_budget_or_overlap_requests(
    tmp_path: Path,
) -> None:
    summary = await run_stress(trials=4, processes=8, budget=5, time_limit=60.0, workdir=tmp_path)

    assert summary["violations"] == []
    assert summary["trials"] == 4
    assert set(summary["scenarios"]) == {"never_finishes", "succeeds_on_third", "slow_answers", "flaky_503"}
    for trial in summary["results"]:
        # The provider's own log: within the budget, one at a time, each one reported as `polled`.
        assert trial["provider_requests"] <= trial["budget"]
        assert trial["max_in_flight"] == 1
        assert trial["overlapping"] == 0
        assert trial["polled_answers"] == trial["provider_requests"] == trial["status_requests_used"]
        assert trial["final_status"] != "waiting"
        # Every process really raced: many more calls than requests.
        assert trial["calls"] > 8
    assert summary["max_requests_per_trial"] == 5
    assert summary["audit_verify"].startswith("audit chain OK")
