"""Provider tables: the shipped example loads, wrong tables are refused with file, key and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from pollwarden_providers import (
    ProviderTable,
    TableError,
    example_tables_dir,
    load_table,
    load_tables,
    shipped_tables_dir,
)

MINIMAL = """\
name = "acme-export"
base_url = "https://api.acme.example"
status_path = "/v1/exports/{job_id}"

[states]
pending = ["queued", "running"]
succeeded = ["succeeded"]
failed = ["failed"]
cancelled = ["cancelled"]
expired = ["expired"]
"""


def write(directory: Path, filename: str, text: str) -> Path:
    """Write one table file and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    path.write_text(text, encoding="utf-8")
    return path


def refusal(tmp_path: Path, text: str, filename: str = "acme.toml") -> TableError:
    """Load `text` as a table file and return the TableError it must raise."""
    path = write(tmp_path, filename, text)
    with pytest.raises(TableError) as caught:
        load_table(path)
    error = caught.value
    assert error.file == str(path)
    assert str(error).startswith(f"{path}: ")
    assert error.fix
    return error


@pytest.fixture
def acme(tmp_path: Path) -> ProviderTable:
    return load_table(write(tmp_path, "acme.toml", MINIMAL))


def test_the_example_table_loads_with_the_documented_values() -> None:
    path = example_tables_dir() / "example-export.toml"
    table = load_table(path)

    assert table.name == "example-export"
    assert table.source == str(path)
    assert table.origin == "http://127.0.0.1:8765"
    assert table.status_path == "/v1/jobs/{job_id}"
    assert table.submit is not None
    assert table.submit.path == "/v1/jobs"
    assert table.submit.idempotency_header == "Idempotency-Key"
    assert table.submit.job_id_field == "id"
    assert table.cancel is not None
    assert table.cancel.path == "/v1/jobs/{job_id}/cancel"
    assert table.response.request_id_header == "X-Request-Id"
    assert table.states.pending == ("queued", "running")
    assert table.success.required_fields == ("result_url",)
    assert table.not_found.grace_seconds == 30
    assert (table.schedule.base_delay_seconds, table.schedule.max_delay_seconds) == (5, 120)
    assert table.limits.default_max_status_requests == 12
    assert table.limits.max_deadline_seconds == 86400


def test_load_tables_includes_the_shipped_tables_unless_told_not_to(tmp_path: Path) -> None:
    write(tmp_path / "mine", "acme.toml", MINIMAL)

    with_shipped = load_tables([tmp_path / "mine"])
    without_shipped = load_tables([tmp_path / "mine"], include_shipped=False)

    assert list(with_shipped) == [
        "anthropic-message-batches",
        "gemini-batch",
        "github-actions-runs",
        "mistral-batch",
        "openai-batch",
        "replicate-predictions",
        "acme-export",
    ]
    assert list(without_shipped) == ["acme-export"]
    assert without_shipped["acme-export"].source == str(tmp_path / "mine" / "acme.toml")


def test_an_unknown_key_is_refused_naming_the_key_and_the_known_keys(tmp_path: Path) -> None:
    error = refusal(tmp_path, MINIMAL + '\n[response]\nstate_feild = "status"\n')

    assert error.key == "response.state_feild"
    assert "remove it or check the spelling; known keys here:" in error.fix
    assert "state_field" in error.fix
    assert "response.state_feild" in str(error)


def test_an_unknown_top_level_section_is_refused_with_the_top_level_keys(tmp_path: Path) -> None:
    error = refusal(tmp_path, MINIMAL + "\n[reponse]\nstate_field = 'state'\n")

    assert error.key == "reponse"
    assert "response" in error.fix
    assert "status_path" in error.fix


def test_source_cannot_be_set_from_the_toml_file(tmp_path: Path) -> None:
    error = refusal(tmp_path, 'source = "/etc/passwd"\n' + MINIMAL)

    assert error.key == "source"


def test_a_state_listed_in_two_categories_is_refused_naming_the_file_and_key(tmp_path: Path) -> None:
    text = MINIMAL.replace('failed = ["failed"]', 'failed = ["failed", "queued"]')
    path = tmp_path / "acme.toml"

    error = refusal(tmp_path, text)

    assert error.key == "states.pending"
    assert str(error) == (
        f"{path}: key 'states.pending': 'queued' is listed under both pending and failed"
        " — list each state under one category only"
    )


def test_a_table_without_pending_or_succeeded_states_is_refused(tmp_path: Path) -> None:
    no_pending = refusal(tmp_path, MINIMAL.replace('pending = ["queued", "running"]\n', ""))
    no_succeeded = refusal(tmp_path, MINIMAL.replace('succeeded = ["succeeded"]\n', ""))

    assert no_pending.key == "states.pending"
    assert no_succeeded.key == "states.succeeded"


def test_a_state_with_surrounding_spaces_is_refused_because_matching_is_exact(tmp_path: Path) -> None:
    error = refusal(tmp_path, MINIMAL.replace('"running"', '" running"'))

    assert error.key == "states.pending"


def test_a_status_path_without_job_id_is_refused(tmp_path: Path) -> None:
    error = refusal(tmp_path, MINIMAL.replace("/v1/exports/{job_id}", "/v1/exports/latest"))

    assert error.key == "status_path"
    assert "{job_id}" in error.problem
    assert "{job_id}" in error.fix


@pytest.mark.parametrize(
    "status_path",
    ["/v1/{job_id}/{job_id}", "/v1/{account}/{job_id}", "v1/exports/{job_id}", "//evil.example/{job_id}"],
)
def test_a_status_path_must_be_a_plain_path_with_job_id_once(tmp_path: Path, status_path: str) -> None:
    error = refusal(tmp_path, MINIMAL.replace("/v1/exports/{job_id}", status_path))

    assert error.key == "status_path"


def test_a_cancel_path_without_job_id_is_refused(tmp_path: Path) -> None:
    error = refusal(tmp_path, MINIMAL + '\n[cancel]\npath = "/v1/exports/cancel"\n')

    assert error.key == "cancel.path"


def test_a_submit_path_must_start_with_a_slash(tmp_path: Path) -> None:
    error = refusal(tmp_path, MINIMAL + '\n[submit]\npath = "v1/exports"\n')

    assert error.key == "submit.path"


@pytest.mark.parametrize(
    "base_url",
    [
        "https://api.acme.example/v1",
        "https://api.acme.example/v1/",
        "https://api.acme.example?region=eu",
        "https://api.acme.example#top",
        "ftp://api.acme.example",
        "api.acme.example",
        "https://",
    ],
)
def test_a_base_url_that_is_more_or_less_than_an_origin_is_refused(tmp_path: Path, base_url: str) -> None:
    error = refusal(tmp_path, MINIMAL.replace("https://api.acme.example", base_url))

    assert error.key == "base_url"


def test_a_base_url_with_userinfo_is_refused_without_echoing_the_password(tmp_path: Path) -> None:
    text = MINIMAL.replace("https://api.acme.example", "https://robot:hunter2@api.acme.example")

    error = refusal(tmp_path, text)

    assert error.key == "base_url"
    assert "hunter2" not in str(error)
    assert "hunter2" not in repr(error.__cause__)


def test_the_origin_is_lower_cased_and_omits_the_default_port(tmp_path: Path) -> None:
    def origin(base_url: str) -> str:
        path = write(tmp_path, "acme.toml", MINIMAL.replace("https://api.acme.example", base_url))
        return load_table(path).origin

    assert origin("HTTPS://API.Acme.Example:443/") == "https://api.acme.example"
    assert origin("http://127.0.0.1:80") == "http://127.0.0.1"
    assert origin("http://127.0.0.1:8765") == "http://127.0.0.1:8765"
    assert origin("http://[::1]:8765") == "http://[::1]:8765"


def test_bad_toml_syntax_is_refused_naming_the_line_and_column(tmp_path: Path) -> None:
    error = refusal(tmp_path, MINIMAL.replace('name = "acme-export"', "name = acme-export"))

    assert (error.line, error.column) == (1, 8)
    assert "line 1, column 8" in str(error)


def test_a_missing_key_is_refused_with_add_it(tmp_path: Path) -> None:
    error = refusal(tmp_path, MINIMAL.replace('status_path = "/v1/exports/{job_id}"\n', ""))

    assert error.key == "status_path"
    assert error.fix.startswith("add it")


def test_a_wrong_type_is_refused_with_the_expected_form(tmp_path: Path) -> None:
    error = refusal(tmp_path, MINIMAL + '\n[schedule]\nbase_delay_seconds = "5"\n')

    assert error.key == "schedule.base_delay_seconds"
    assert "valid number" in error.problem
    assert "seconds > 0" in error.fix


@pytest.mark.parametrize(
    ("section", "key", "why"),
    [
        ("[schedule]\nbase_delay_seconds = 0", "schedule.base_delay_seconds", "zero delay"),
        ("[schedule]\nbase_delay_seconds = inf", "schedule.base_delay_seconds", "infinite delay"),
        ("[schedule]\nbase_delay_seconds = 200", "schedule.base_delay_seconds", "base above max"),
        ("[limits]\nmax_rate_limited = true", "limits.max_rate_limited", "boolean budget"),
        (
            "[limits]\ndefault_deadline_seconds = 90000",
            "limits.default_deadline_seconds",
            "default above cap",
        ),
        ("[fleet]\nmax_requests_per_second = 5\nburst = 0", "fleet.burst", "empty bucket"),
        ("[cancel]\npath = '/c/{job_id}'\nmethod = 'GET'", "cancel.method", "undocumented method"),
    ],
)
def test_out_of_range_values_are_refused_at_their_key(
    tmp_path: Path, section: str, key: str, why: str
) -> None:
    error = refusal(tmp_path, MINIMAL + "\n" + section + "\n")

    assert error.key == key, why


def test_fractional_seconds_are_accepted(tmp_path: Path) -> None:
    text = MINIMAL + (
        "\n[schedule]\nbase_delay_seconds = 0.01\nmax_delay_seconds = 0.25\n"
        "\n[not_found]\ngrace_seconds = 0.5\nretention_seconds = 1.5\n"
        "\n[limits]\ndefault_deadline_seconds = 0.75\nmax_deadline_seconds = 2.5\n"
        "\n[fleet]\nmax_requests_per_second = 0.5\n"
    )

    table = load_table(write(tmp_path, "acme.toml", text))

    assert table.schedule.base_delay_seconds == 0.01
    assert table.schedule.max_delay_seconds == 0.25
    assert table.not_found.grace_seconds == 0.5
    assert table.not_found.retention_seconds == 1.5
    assert table.limits.default_deadline_seconds == 0.75
    assert table.fleet is not None
    assert table.fleet.max_requests_per_second == 0.5


def test_two_files_declaring_the_same_name_are_refused_naming_both_files(tmp_path: Path) -> None:
    first = write(tmp_path / "one", "acme.toml", MINIMAL)
    second = write(tmp_path / "two", "acme-again.toml", MINIMAL)

    with pytest.raises(TableError) as caught:
        load_tables([tmp_path / "one", tmp_path / "two"], include_shipped=False)

    assert caught.value.file == str(second)
    assert caught.value.key == "name"
    assert str(first) in str(caught.value)
    assert str(second) in str(caught.value)


def test_a_table_reusing_a_shipped_name_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "copy.toml", MINIMAL.replace("acme-export", "openai-batch"))

    with pytest.raises(TableError) as caught:
        load_tables([tmp_path])

    assert str(shipped_tables_dir() / "openai-batch.toml") in str(caught.value)


def test_the_example_table_is_documentation_not_a_loaded_provider(tmp_path: Path) -> None:
    assert "example-export" not in load_tables([])
    assert not (shipped_tables_dir() / "example-export.toml").exists()
    # Copied into an operator's directory, it loads like any table.
    copy = tmp_path / "mine" / "example-export.toml"
    copy.parent.mkdir()
    copy.write_text((example_tables_dir() / "example-export.toml").read_text())
    assert load_tables([copy.parent])["example-export"].origin == "http://127.0.0.1:8765"


def test_a_missing_table_directory_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"

    with pytest.raises(TableError) as caught:
        load_tables([missing], include_shipped=False)

    assert caught.value.file == str(missing)
    assert str(missing) in str(caught.value)


@pytest.mark.parametrize(
    ("state", "category"),
    [
        ("queued", "pending"),
        ("running", "pending"),
        ("succeeded", "succeeded"),
        ("failed", "failed"),
        ("cancelled", "cancelled"),
        ("expired", "expired"),
    ],
)
def test_a_listed_state_maps_to_its_category(acme: ProviderTable, state: str, category: str) -> None:
    assert acme.category_of(state) == category


@pytest.mark.parametrize(
    "state",
    ["paused", "needs_payment", "awaiting_review", "Running", "RUNNING", "running ", " running", ""],
)
def test_an_unlisted_or_differently_spelled_state_is_unknown(acme: ProviderTable, state: str) -> None:
    assert acme.category_of(state) == "unknown"


@pytest.mark.parametrize(
    "state", [None, 3, 0, True, 1.5, ["running"], ("running",), {"state": "running"}, b"running"]
)
def test_a_non_string_state_is_unknown(acme: ProviderTable, state: object) -> None:
    assert acme.category_of(state) == "unknown"


def test_a_loaded_table_is_frozen(acme: ProviderTable) -> None:
    with pytest.raises(ValueError, match="frozen"):
        acme.name = "other"  # type: ignore[misc]
