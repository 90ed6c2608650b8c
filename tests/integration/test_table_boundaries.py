"""A provider table can only send its own credential to its own origin, and cannot stall or crash the loader.

The pure checks are tests/unit/test_table_boundaries.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import base_table, merge, table_toml
from pollwarden_providers import TableError, load_table, load_tables


def write(
    directory: Path, overrides: dict[str, Any], name: str = "acme", base_url: str = "https://api.acme.example"
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(table_toml(merge(base_table(base_url, name=name), overrides)))
    return path


def refusal(tmp_path: Path, overrides: dict[str, Any]) -> TableError:
    with pytest.raises(TableError) as caught:
        load_table(write(tmp_path, overrides))
    return caught.value


@pytest.mark.parametrize("variable", ["POLLWARDEN_AUDIT_KEY", "POLLWARDEN_OPERATOR_TOKEN", "pollwarden_db"])
def test_a_table_can_never_send_one_of_pollwardens_own_variables(tmp_path: Path, variable: str) -> None:
    error = refusal(tmp_path, {"auth": {"env": variable, "header": "Authorization"}})

    assert error.key == "auth.env"
    assert "pollwarden's own variables" in error.problem


@pytest.mark.parametrize(
    "header",
    [
        "Host",
        "Transfer-Encoding",
        "Connection",
        "Proxy-Authorization",
        "X-Forwarded-For",
        "Forwarded",
        "TE",
        "Via",
    ],
)
def test_the_auth_header_cannot_be_a_hop_by_hop_or_routing_header(tmp_path: Path, header: str) -> None:
    error = refusal(tmp_path, {"auth": {"env": "ACME_TOKEN", "header": header}})

    assert error.key == "auth.header"
    assert "hop-by-hop, routing or framing" in error.problem


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "X-Api-Key",
        "Api-Key",
        "Cookie",
        "X-Auth-Token",
        "X-Client-Secret",
        "X-Password",
        "Session-Token",
    ],
)
def test_fixed_headers_cannot_carry_a_credential_and_the_value_is_not_echoed(
    tmp_path: Path, name: str
) -> None:
    error = refusal(tmp_path, {"headers": {name: "sk-live-very-secret-value"}})

    assert "names a credential" in error.problem
    assert "sk-live-very-secret-value" not in str(error)
    assert "[auth]" in error.fix


def test_fixed_headers_that_carry_no_credential_still_load(tmp_path: Path) -> None:
    table = load_table(
        write(tmp_path, {"headers": {"anthropic-version": "2023-06-01", "Accept": "application/json"}})
    )

    assert table.headers["anthropic-version"] == "2023-06-01"


def test_a_table_reusing_another_tables_credential_for_another_origin_is_refused(tmp_path: Path) -> None:
    write(
        tmp_path,
        {"auth": {"env": "OPENAI_API_KEY", "header": "Authorization", "prefix": "Bearer "}},
        name="proxy",
    )

    with pytest.raises(TableError) as caught:
        load_tables([tmp_path])

    error = caught.value
    assert error.key == "auth.env"
    assert "$OPENAI_API_KEY is also the credential of 'openai-batch'" in error.problem
    assert "https://api.openai.com" in error.problem
    assert 'shared_with_origins = ["https://api.openai.com"]' in error.fix


def test_reusing_a_credential_for_another_origin_loads_when_the_table_says_so(tmp_path: Path) -> None:
    auth = {
        "env": "OPENAI_API_KEY",
        "header": "Authorization",
        "shared_with_origins": ["https://API.openai.com:443"],
    }
    write(tmp_path, {"auth": auth}, name="proxy")

    tables = load_tables([tmp_path])

    assert tables["proxy"].shares_credential_with("https://api.openai.com")


def test_two_tables_on_the_same_origin_may_share_a_credential(tmp_path: Path) -> None:
    auth = {"env": "ACME_TOKEN", "header": "Authorization"}
    write(tmp_path, {"auth": auth}, name="acme-a")
    write(tmp_path, {"auth": auth}, name="acme-b")

    assert {"acme-a", "acme-b"} <= set(load_tables([tmp_path]))


@pytest.mark.parametrize(
    "status_path",
    ["/v1/jobs/{owner}{repo}/{run_id}", "/v1/jobs/{owner}-{repo}/{run_id}", "/v1/{owner}/{repo}{run_id}"],
)
def test_placeholders_sharing_a_path_segment_are_refused(tmp_path: Path, status_path: str) -> None:
    error = refusal(
        tmp_path, {"status_path": status_path, "job_id_parts": ["owner", "repo", "run_id"], "submit": None}
    )

    assert error.key == "status_path"
    assert "could not be told apart" in error.problem
    assert "own path segment" in error.fix


def test_a_pathologically_nested_toml_file_is_a_clear_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text('name = "deep"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n")

    with pytest.raises(TableError) as caught:
        load_table(path)

    assert str(path) in str(caught.value)
    assert "too deeply" in caught.value.problem


def test_a_moderately_nested_toml_file_is_refused_before_validation(tmp_path: Path) -> None:
    path = tmp_path / "nested.toml"
    path.write_text('name = "nested"\nx = ' + "[" * 40 + "1" + "]" * 40 + "\n")

    with pytest.raises(TableError) as caught:
        load_table(path)

    assert "deeper than 16 levels" in caught.value.problem


def test_a_table_sending_another_tables_webhook_secret_as_its_credential_is_refused(tmp_path: Path) -> None:
    write(
        tmp_path,
        {"auth": {"env": "GITHUB_WEBHOOK_SECRET", "header": "Authorization", "prefix": "Bearer "}},
        name="leaky",
    )

    with pytest.raises(TableError) as caught:
        load_tables([tmp_path])

    error = caught.value
    assert error.key == "auth.env"
    assert "$GITHUB_WEBHOOK_SECRET is a webhook signing secret" in error.problem
    assert "'github-actions-runs'" in error.problem
    assert "variables of their own" in error.fix


def test_a_webhook_secret_naming_another_tables_credential_is_refused(tmp_path: Path) -> None:
    webhook = {
        "scheme": "standard",
        "secret_env": "OPENAI_API_KEY",
        "job_id_fields": ["data.id"],
        "events": ["job.completed"],
    }
    write(tmp_path, {"webhook": webhook}, name="signer")

    with pytest.raises(TableError) as caught:
        load_tables([tmp_path])

    assert "$OPENAI_API_KEY is a webhook signing secret" in caught.value.problem
    assert "'signer'" in caught.value.problem
