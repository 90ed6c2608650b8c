"""Job ids compared in the table's canonical form (issue 30, item 3): `[job_id]` in the table format."""

from __future__ import annotations

from pathlib import Path

from harness import acme_refusal, acme_table
from pollwarden_providers import load_table, shipped_tables_dir


def test_one_github_run_written_three_ways_is_one_job() -> None:
    github = load_table(shipped_tables_dir() / "github-actions-runs.toml")
    forms = {
        github.canonical_job_id(j) for j in ("octo-org/hello/42", "Octo-Org/Hello/42", "octo-org/hello/042")
    }
    assert forms == {"octo-org/hello/42"}
    # Another run, another repository: other jobs.
    assert github.canonical_job_id("octo-org/hello/43") != "octo-org/hello/42"
    assert github.canonical_job_id("octo-org/hello-2/42") != "octo-org/hello/42"


def test_a_table_without_a_job_id_section_compares_ids_exactly(tmp_path: Path) -> None:
    table = acme_table(tmp_path, {})
    assert table.canonical_job_id("Job-042") == "Job-042"


def test_declared_parts_are_lower_cased_or_read_as_integers_and_others_are_kept(tmp_path: Path) -> None:
    table = acme_table(tmp_path, {"job_id": {"integer": ["job_id"]}})
    assert table.canonical_job_id("007") == "7"
    assert table.canonical_job_id("7a") == "7a"  # not an integer: kept as written
    assert table.canonical_job_id("٣") == "٣"  # only ASCII digits are an integer
    folded = acme_table(tmp_path, {"job_id": {"case_insensitive": ["job_id"]}})
    assert folded.canonical_job_id("Batch-ABC") == "batch-abc"


def test_a_job_id_section_naming_a_part_the_id_does_not_have_is_refused_naming_the_key(
    tmp_path: Path,
) -> None:
    error = acme_refusal(tmp_path, {"job_id": {"case_insensitive": ["owner"]}})
    text = str(error)
    assert "job_id.case_insensitive" in text
    assert "'owner' is not a part of this table's job id (job_id)" in text
    both = str(acme_refusal(tmp_path, {"job_id": {"case_insensitive": ["job_id"], "integer": ["job_id"]}}))
    assert "both as case_insensitive and as integer" in both
