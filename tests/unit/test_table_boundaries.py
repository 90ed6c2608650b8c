"""A provider table can only send its own credential to its own origin, and cannot stall or crash the loader: the pure checks.

The checks on real files, servers and processes: tests/integration/test_table_boundaries.py.
"""

from __future__ import annotations

import pytest

from harness import base_table, merge
from pollwarden_providers import AuthSpec, ProviderTable
from pollwarden_providers.request_building import (
    MissingCredentialError,
    auth_headers,
    job_id_from_location,
    match_path,
)


def test_a_table_built_in_code_around_the_loader_still_cannot_send_an_own_variable() -> None:
    valid = ProviderTable.model_validate(base_table("https://api.acme.example"))
    own = AuthSpec.model_construct(
        env="POLLWARDEN_AUDIT_KEY", header="X-Key", prefix="", shared_with_origins=()
    )
    table = valid.model_copy(update={"auth": own})  # model_copy does not validate

    with pytest.raises(MissingCredentialError, match="never sent to a provider"):
        auth_headers(table, {"POLLWARDEN_AUDIT_KEY": "audit-key-secret"})


def test_a_crafted_location_is_matched_segment_by_segment() -> None:
    table = ProviderTable.model_validate(
        merge(
            base_table("https://api.acme.example"),
            {
                "status_path": "/v1/jobs/{owner}/x-{repo}/{run_id}.json",
                "job_id_parts": ["owner", "repo", "run_id"],
                "submit": None,
            },
        )
    )
    crafted = "https://api.acme.example/v1/jobs/" + "a" * 200_000 + "/x-" + "-" * 200_000 + "/7.jso"

    assert job_id_from_location(table, crafted) is None
    assert (
        job_id_from_location(table, "https://api.acme.example/v1/jobs/octo/x-hello/42.json")
        == "octo/hello/42"
    )
    assert match_path("/v1/jobs/{job_id}", "/v1/jobs/a/b") is None
