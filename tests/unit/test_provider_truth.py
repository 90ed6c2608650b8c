"""Provider truth: typed results, partial results and counts, a person who must act, expiry grace, rate limits: the pure checks.

The checks on real files, servers and processes: tests/integration/test_provider_truth.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pollwarden_providers.interpret import field_problem
from pollwarden_providers.table_results import FieldSpec, pattern_problem


@pytest.mark.parametrize(
    ("spec", "value", "problem"),
    [
        pytest.param({"type": "string", "pattern": "file-[A-Za-z0-9]+"}, "file-abc123", None, id="id-ok"),
        pytest.param(
            {"type": "string", "pattern": "file-[A-Za-z0-9]+"}, "https://x.example/f", "pattern", id="id-bad"
        ),
        pytest.param({"type": "string"}, 42, "string", id="string-not-a-number"),
        pytest.param({"type": "integer", "minimum": 0}, 3, None, id="integer-ok"),
        pytest.param({"type": "integer"}, True, "integer", id="bool-is-not-an-integer"),
        pytest.param({"type": "integer", "minimum": 0}, -1, "minimum", id="integer-below-minimum"),
        pytest.param({"type": "url"}, "https://files.example/r.csv", None, id="url-ok"),
        pytest.param({"type": "url"}, "http://files.example/r.csv", "scheme https", id="url-wrong-scheme"),
        pytest.param({"type": "url"}, "javascript:alert(1)", "scheme", id="url-javascript"),
        pytest.param({"type": "url"}, "https://user:pw@files.example/r", "user name", id="url-with-userinfo"),
        pytest.param({"type": "url"}, "https://files.example/a b", "spaces", id="url-with-space"),
        pytest.param({"type": "list"}, ["https://a.example/1.png"], None, id="list-ok"),
        pytest.param({"type": "object"}, ["x"], "object", id="object-not-a-list"),
        pytest.param({"type": "any"}, {"text": "hi"}, None, id="any-ok"),
    ],
)
def test_a_field_value_is_checked_against_its_declared_type(
    spec: dict[str, Any], value: object, problem: str | None
) -> None:
    found = field_problem(FieldSpec.model_validate(spec), value)

    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


@pytest.mark.parametrize(
    "pattern",
    ["(a+)+", "[a-z]+[0-9]+", "a|b", "x*?", "^file-.+$", "(?i)file", "\\1"],
)
def test_a_pattern_that_could_backtrack_is_refused(pattern: str) -> None:
    assert pattern_problem(pattern) is not None


@pytest.mark.parametrize(
    "pattern",
    [
        "file-[A-Za-z0-9_-]{1,128}",
        "msgbatch_[A-Za-z0-9]+",
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    ],
)
def test_literal_text_with_one_open_repeat_is_an_allowed_pattern(pattern: str) -> None:
    assert pattern_problem(pattern) is None
