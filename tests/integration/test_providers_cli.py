"""`pollwarden providers list` and `pollwarden providers check`, as an operator runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import base_table, merge, table_toml
from pollwarden.cli.main import main
from pollwarden_providers import shipped_samples_dir
from tests.support.live import pollwarden_cli

AT = "2026-11-30T12:00:00Z"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def check_samples(
    capsys: pytest.CaptureFixture[str], table: Path | str, *samples: Path, options: tuple[str, ...] = ()
) -> tuple[int, str, str]:
    """`pollwarden providers check TABLE OPTIONS --response S1 --response S2 ...`."""
    responses = [arg for sample in samples for arg in ("--response", str(sample))]
    return run_cli(capsys, "providers", "check", str(table), *options, *responses)


def blocks_of(out: str) -> dict[str, str]:
    """The printed blocks, by their first line (the sample's path)."""
    return {block.split("\n", 1)[0]: block for block in out.split("\n\n")}


def write_table(directory: Path, **overrides: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "acme.toml"
    path.write_text(table_toml(merge(base_table("https://api.acme.example"), overrides)))
    return path


def write_sample(directory: Path, name: str, content: str | dict[str, object]) -> Path:
    path = directory / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_providers_list_shows_each_shipped_table_with_origin_states_and_limits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "providers", "list")

    assert code == 0
    for name in ("openai-batch", "anthropic-message-batches", "replicate-predictions", "github-actions-runs"):
        assert f"\n{name}  (" in f"\n{out}"
    assert "origin        https://api.github.com" in out
    assert "succeeded     completed/success" in out
    assert "job id: owner/repo/run_id" in out
    assert "limits        deadline 90000 s (max 172800), 220 status requests (max 1000)" in out
    assert "headers       anthropic-version: 2023-06-01" in out
    # The commented example table is documentation, not a provider pointing at 127.0.0.1.
    assert "example-export" not in out
    assert "127.0.0.1" not in out


def test_providers_list_adds_the_operators_directory_and_refuses_a_broken_table_precisely(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_table(tmp_path / "mine")
    code, out, _ = run_cli(capsys, "providers", "list", "--providers", str(tmp_path / "mine"))
    assert code == 0
    assert "acme  (" in out

    (tmp_path / "mine" / "acme.toml").write_text(
        (tmp_path / "mine" / "acme.toml").read_text().replace("[states]", "[states]\nrunnin = ['x']")
    )
    code, out, err = run_cli(capsys, "providers", "list", "--providers", str(tmp_path / "mine"))

    assert code == 2
    assert out == ""
    assert "acme.toml: key 'states.runnin': unknown key" in err
    assert "known keys here: pending, succeeded" in err


def test_providers_check_names_the_file_key_and_fix_of_a_wrong_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_table(tmp_path, states={"pending": ["queued", "running"], "failed": ["running"]})

    code, out, err = run_cli(capsys, "providers", "check", str(path))

    assert code == 2
    assert out == ""
    assert f"{path}: key 'states.pending': 'running' is listed under both pending and failed" in err
    assert "list each state under one category only" in err


def test_providers_check_shows_what_the_controller_does_with_each_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_table(tmp_path)
    running = write_sample(tmp_path, "running.json", {"state": "running"})
    hinted = write_sample(tmp_path, "hinted.json", {"state": "running", "poll_after_seconds": 42})
    done = write_sample(tmp_path, "done.json", {"state": "succeeded", "result_url": "https://f.example/r"})
    bare = write_sample(tmp_path, "bare.json", {"state": "succeeded"})
    paused = write_sample(tmp_path, "paused.json", {"state": "paused"})

    code, out, err = check_samples(capsys, path, running, hinted, done, bare, paused, options=("--at", AT))

    assert code == 0, err
    assert out.startswith(f"ok: the table is valid  ({path})")
    blocks = blocks_of(out)
    assert '"running" -> pending' in blocks[str(running)]
    assert "keeps waiting; next status request in 5–10 s (local_backoff)" in blocks[str(running)]
    assert "next status request in 42 s (provider_poll_hint)" in blocks[str(hinted)]
    assert "stops with succeeded" in blocks[str(done)]
    assert "the agent may: fetch_result" in blocks[str(done)]
    assert (
        "stops with integration_failure (state 'succeeded' without the required field(s) result_url)"
        in (blocks[str(bare)])
    )
    assert '"paused" -> unknown' in blocks[str(paused)]
    assert "the agent may: request_extension" in blocks[str(paused)]
    assert f"evaluated at  {AT.replace('Z', '.000Z')}" in blocks[str(paused)]


def test_providers_check_reads_a_raw_http_answer_as_curl_i_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_table(tmp_path)
    throttled = write_sample(
        tmp_path,
        "throttled.http",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many Requests\r\nRetry-After: 30\r\n"
        "Content-Type: application/json\r\n\r\n{}",
    )
    gone = write_sample(tmp_path, "gone.http", "HTTP/2 404\nx-request-id: req-9\n\n")
    forbidden = write_sample(tmp_path, "forbidden.http", "HTTP/1.1 403 Forbidden\n\n")

    options = ("--at", AT, "--started-seconds-ago", "10")
    code, out, _ = check_samples(capsys, path, throttled, gone, forbidden, options=options)

    assert code == 0
    blocks = blocks_of(out)
    assert "state         none read from the HTTP 429 answer" in blocks[str(throttled)]
    assert "next status request in 30 s (provider_retry_after)" in blocks[str(throttled)]
    # 10 s after start is inside the table's 30 s not-found grace window.
    assert "keeps waiting" in blocks[str(gone)]
    assert "stops with authorization_denied" in blocks[str(forbidden)]


def test_a_404_outside_the_grace_window_is_shown_as_an_integration_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_table(tmp_path)
    gone = write_sample(tmp_path, "gone.http", "HTTP/1.1 404 Not Found\n\n")

    code, out, _ = check_samples(capsys, path, gone, options=("--at", AT))

    assert code == 0
    assert "stops with integration_failure (HTTP 404 for job sample 60 s after start" in out


def test_an_unreadable_sample_is_named_and_the_others_are_still_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_table(tmp_path)
    broken = write_sample(tmp_path, "broken.http", "HTTP/1.1 200 OK\nno colon here\n\n{}")
    running = write_sample(tmp_path, "running.json", {"state": "running"})

    code, out, err = check_samples(capsys, path, tmp_path / "missing.json", broken, running)

    assert code == 1
    assert f"{tmp_path / 'missing.json'}: cannot be read" in err
    assert "header line 2 'no colon here' is not 'Name: value'" in err
    assert '"running" -> pending' in out


def test_a_body_that_is_not_json_is_shown_as_the_integration_failure_it_would_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_table(tmp_path)
    html = write_sample(tmp_path, "login.json", "<html>please log in</html>")

    code, out, _ = check_samples(capsys, path, html)

    assert code == 0
    assert "stops with integration_failure (unreadable status body: body is not valid JSON" in out


def test_providers_check_accepts_a_shipped_name_and_its_samples(capsys: pytest.CaptureFixture[str]) -> None:
    samples = shipped_samples_dir() / "github-actions-runs"

    code, out, _ = check_samples(
        capsys,
        "github-actions-runs",
        samples / "completed-failure.json",
        samples / "undocumented-completed-rerequested_weird.json",
        options=("--at", AT),
    )

    assert code == 0
    assert '"completed/failure" -> failed' in out
    assert "stops with provider_failure" in out
    assert "conclusion 'rerequested_weird' is not listed under [refine.completed]" in out


def test_an_unknown_name_or_a_bad_time_is_refused_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "providers", "check", "openai-batches")
    assert code == 2
    assert "is neither a table file nor the name of a loaded provider" in err
    assert "openai-batch" in err

    code, _, err = run_cli(capsys, "providers", "check", "openai-batch", "--at", "yesterday")
    assert code == 2
    assert "--at:" in err


def test_the_installed_command_runs_providers_check() -> None:
    sample = shipped_samples_dir() / "openai-batch" / "in_progress.json"

    done = pollwarden_cli("providers", "check", "openai-batch", "--at", AT, "--response", str(sample))

    assert done.code == 0, done.stderr
    assert "keeps waiting; next status request in 30–60 s (local_backoff)" in done.stdout


def test_check_shows_kept_fields_counts_a_person_who_must_act_and_the_new_table_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    openai = shipped_samples_dir() / "openai-batch"
    github = shipped_samples_dir() / "github-actions-runs"

    code, out, _ = check_samples(
        capsys,
        "openai-batch",
        openai / "expired.json",
        openai / "completed-all-failed.json",
        options=("--at", AT),
    )
    blocks = blocks_of(out)
    expired = blocks[str(openai / "expired.json")]
    all_failed = blocks[str(openai / "completed-all-failed.json")]
    code_gh, out_gh, _ = check_samples(
        capsys, "github-actions-runs", github / "waiting.json", options=("--at", AT)
    )

    assert code == 0
    assert code_gh == 0
    assert "success needs output_file_id (string file-[A-Za-z0-9_-]{1,128})" in out
    assert "expiry        expires_at + 3600 s grace; finalizing, cancelling may end after it" in out
    assert "counts        succeeded <- request_counts.completed" in out
    assert "kept          output_file_id, error_file_id (fetch_result)" in expired
    assert "counts        succeeded 3218, errored 0, total 5000" in expired
    assert "stops with provider_failure" in all_failed
    assert "the agent may: fetch_result" in all_failed
    assert "stops with awaiting_review: a person must act at the provider: https://github.com/" in out_gh
    assert "(Review deployments" in out_gh
    assert "the agent may: request_extension, cancel_operation" in out_gh
    assert "at least 60 s" in out_gh
