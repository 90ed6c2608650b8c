"""The expected terminal state recorded at start decides how an end answer is read (issue 12, item 7).

Pure: `interpret_status_answer` on a record and a table, no store. While the
table lists exactly the success states the operation recorded, the table's
reading stands; once they changed, an end answer the recorded contract does not
cover stops as `integration_failure` for a person, never as a plain success or
failure.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from harness import base_table, merge, operation_record
from pollwarden.rules.job_identity import expected_terminal_state_of
from pollwarden.rules.status_answer import ProviderAnswer, interpret_status_answer
from pollwarden_providers.table import ProviderTable

RECORD = operation_record(status="waiting", stop_reason=None, stopped_at=None, status_requests_used=2)


def _table(states: dict[str, list[str]]) -> ProviderTable:
    return ProviderTable.model_validate(merge(base_table("http://127.0.0.1:9"), {"states": states}))


def _answer(body: dict[str, Any]) -> ProviderAnswer:
    return ProviderAnswer(200, {}, json.dumps(body).encode(), received_at=1500.0)


OK = {"result_url": "https://r.example/x"}


@pytest.mark.parametrize(
    ("states", "state", "stop_reason"),
    [
        ({}, "succeeded", "succeeded"),  # the table as recorded: its word stands
        ({}, "failed", "provider_failure"),
        ({"succeeded": ["succeeded", "done"]}, "succeeded", "succeeded"),  # still an expected success
        ({"succeeded": ["succeeded", "done"]}, "done", "integration_failure"),  # a success nobody expected
        ({"succeeded": ["succeeded", "done"]}, "failed", "provider_failure"),  # a documented failure
        ({"succeeded": ["done"], "failed": ["failed", "succeeded"]}, "succeeded", "integration_failure"),
        (
            {"succeeded": ["done"], "pending": ["queued", "running", "succeeded"]},
            "succeeded",
            "integration_failure",
        ),
    ],
)
def test_an_end_answer_is_read_by_the_table_only_while_its_success_states_are_the_recorded_ones(
    states: dict[str, list[str]], state: str, stop_reason: str
) -> None:
    table = _table(states)
    decided = interpret_status_answer(RECORD, table, _answer({"state": state, **OK}), rng=random.Random(1))
    assert decided.stop_reason == stop_reason
    if stop_reason == "integration_failure":
        assert decided.stop_detail is not None
        assert decided.stop_detail.startswith("unexpected terminal state: ")
        assert "recorded expecting succeeded." in decided.stop_detail
        assert decided.result is None


def test_the_recorded_expected_terminal_state_lists_the_tables_success_states_refined_ones_too() -> None:
    table = ProviderTable.model_validate(
        merge(
            base_table("http://127.0.0.1:9"),
            {
                "states": {"succeeded": ["succeeded"], "pending": ["queued", "running"]},
                "refine": {
                    "completed": {"field": "conclusion", "succeeded": ["success"], "failed": ["failure"]}
                },
            },
        )
    )
    assert expected_terminal_state_of(table) == "succeeded,completed/success"
