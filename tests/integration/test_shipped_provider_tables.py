"""The shipped provider tables: they load, cite their documentation, and read every documented state right."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from harness import Harness, SteppedRandom, view
from pollwarden.core.clock import FakeClock
from pollwarden.core.timefmt import parse_iso
from pollwarden.provider_io.table_check import preview_answer, read_sample
from pollwarden_providers import ProviderTable, load_tables, shipped_samples_dir, shipped_tables_dir
from tests.support.fake_provider import FakeProvider, Step

# SQLite only: the subject is the shipped provider tables (tests/conftest.py).
pytestmark = pytest.mark.one_engine

SHIPPED = (
    "openai-batch",
    "anthropic-message-batches",
    "replicate-predictions",
    "github-actions-runs",
    "gemini-batch",
    "mistral-batch",
)
# Every sample is evaluated at this time (see each expected.toml).
EVALUATED_AT = parse_iso("2026-11-30T12:00:00Z")


def shipped() -> dict[str, ProviderTable]:
    return load_tables([])


def expectations(name: str) -> dict[str, dict[str, Any]]:
    with (shipped_samples_dir() / name / "expected.toml").open("rb") as handle:
        return tomllib.load(handle)["samples"]


def sample_cases() -> list[tuple[str, str]]:
    return [(name, sample) for name in SHIPPED for sample in sorted(expectations(name))]


def test_every_shipped_table_loads_and_each_real_provider_is_among_them() -> None:
    tables = shipped()

    assert set(SHIPPED) <= set(tables)
    assert tables["openai-batch"].origin == "https://api.openai.com"
    assert tables["anthropic-message-batches"].headers == {"anthropic-version": "2023-06-01"}
    assert tables["github-actions-runs"].job_id_parts == ("owner", "repo", "run_id")


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_table_cites_the_providers_documentation(name: str) -> None:
    text = (shipped_tables_dir() / f"{name}.toml").read_text()

    cited = [line for line in text.splitlines() if line.startswith("#") and "https://" in line]

    assert len(cited) >= 2, f"{name}.toml should cite the pages its states and calls come from"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_documented_state_has_a_sample_and_every_sample_is_expected(name: str) -> None:
    table = shipped()[name]
    expected = expectations(name)
    files = {
        path.name for path in (shipped_samples_dir() / name).iterdir() if path.suffix in (".json", ".http")
    }

    sampled_states = {case.get("state") for case in expected.values()}
    assert files == set(expected)
    assert set(table.documented_states()) <= sampled_states
    assert any(case.get("category") == "unknown" for case in expected.values()), "one undocumented state"


@pytest.mark.parametrize(("name", "sample"), sample_cases())
def test_each_sample_is_classified_and_decided_as_documented(name: str, sample: str) -> None:
    table = shipped()[name]
    expected = expectations(name)[sample]
    answer = read_sample(shipped_samples_dir() / name / sample, received_at=EVALUATED_AT)

    preview = preview_answer(table, answer, started_at=EVALUATED_AT - 60)

    assert (preview.state, preview.category, preview.outcome) == (
        expected.get("state"),
        expected.get("category"),
        expected["outcome"],
    ), preview.detail
    if "wait_seconds" in expected:
        assert preview.next_check_in == (expected["wait_seconds"], expected["wait_seconds"])
        assert preview.delay_source == expected["delay_source"]
    if "kept" in expected:
        assert set(preview.fields) == set(expected["kept"])
    if "counts" in expected:
        assert preview.counts == expected["counts"]
    if "allowed" in expected:
        assert preview.allowed_actions == tuple(expected["allowed"])
    if "where" in expected:
        assert preview.person_must_act_at is not None
        assert expected["where"] in preview.person_must_act_at
    if "detail" in expected:
        assert expected["detail"] in preview.detail


def test_the_undocumented_states_stop_and_offer_only_an_extension() -> None:
    for name in SHIPPED:
        for sample, case in expectations(name).items():
            if case.get("category") != "unknown":
                continue
            answer = read_sample(shipped_samples_dir() / name / sample, received_at=EVALUATED_AT)
            preview = preview_answer(shipped()[name], answer, started_at=EVALUATED_AT - 60)
            assert preview.outcome == "unknown_state"
            assert preview.allowed_actions == ("request_extension",)


# Each shipped table drives a whole operation through the SDK client against the
# fake provider, which answers with that provider's own samples. Only the origin
# and the path prefix change (the fake serves /v1/jobs/...).
E2E: dict[str, tuple[str, str, str, str]] = {
    # name: (pending sample, success sample, job id before the id the body repeats, credential variable)
    "openai-batch": ("in_progress.json", "completed.json", "", "OPENAI_API_KEY"),
    "anthropic-message-batches": ("in_progress.json", "ended.json", "", "ANTHROPIC_API_KEY"),
    "replicate-predictions": ("processing.json", "succeeded.json", "", "REPLICATE_API_TOKEN"),
    "github-actions-runs": ("in_progress.json", "completed-success.json", "acme/widgets/", "GITHUB_TOKEN"),
    "gemini-batch": ("BATCH_STATE_RUNNING.json", "BATCH_STATE_SUCCEEDED.json", "", "GEMINI_API_KEY"),
    "mistral-batch": ("RUNNING.json", "SUCCESS.json", "", "MISTRAL_API_KEY"),
}


def local_copy(table: ProviderTable, base_url: str) -> dict[str, Any]:
    data = tomllib.loads(Path(table.source).read_text())
    prefix = "/v1/jobs/" + "/".join(f"{{{part}}}" for part in table.job_id_parts)
    data.update(name=f"{table.name}-local", base_url=base_url, status_path=prefix)
    data.pop("submit", None)
    data.pop("fleet", None)
    # The copy uses the shipped table's credential variable on another origin: allowed only when said.
    data["auth"]["shared_with_origins"] = [table.origin]
    if "cancel" in data:
        data["cancel"]["path"] = prefix + "/cancel"
    return data


def body_of(name: str, sample: str) -> dict[str, Any]:
    return json.loads((shipped_samples_dir() / name / sample).read_text())


@pytest.mark.anyio
@pytest.mark.parametrize("name", SHIPPED)
async def test_each_shipped_table_drives_an_operation_to_its_result(
    tmp_path: Path, fake: FakeProvider, name: str
) -> None:
    table = shipped()[name]
    pending_sample, success_sample, job_prefix, variable = E2E[name]
    pending_body, success_body = body_of(name, pending_sample), body_of(name, success_sample)
    # Gemini names a batch "batches/<id>"; the others repeat the id in "id".
    job_id = job_prefix + str(success_body.get("id") or success_body["name"].rsplit("/", 1)[-1])
    fake.script(job_id, [Step(body=pending_body), Step(body=success_body)])
    h = Harness(
        tmp=tmp_path,
        fake=fake,
        clock=FakeClock(EVALUATED_AT - 60),
        rng=SteppedRandom(1.0),
        table=local_copy(table, fake.base_url),
        environ={variable: "test-credential-123"},
    )
    provider = f"{name}-local"
    async with h.client() as client:
        start = {"provider": provider, "operation_id": "op", "provider_job_id": job_id}
        started = view(await client.call_tool("start_operation", start))
        h.clock.advance(parse_iso(started["next_check_at"]) - h.clock.now())
        first = view(await client.call_tool("check_status", {"operation_id": "op"}))
        h.clock.advance(parse_iso(first["next_check_at"]) - h.clock.now())
        second = view(await client.call_tool("check_status", {"operation_id": "op"}))
        result = view(await client.call_tool("fetch_result", {"operation_id": "op"}))

    assert first["status"] == "waiting", first
    assert second["stop_reason"] == "succeeded", second
    assert set(table.success.required_fields) <= set(result["result"])
    assert set(result["result"]) <= {*table.success.required_fields, *table.success.required_one_of}
    assert result["partial"] is False
    sent = fake.requests_for(job_id)
    assert len(sent) == 2
    auth = table.auth
    assert auth is not None
    assert all(entry["headers"][auth.header.lower()] == auth.prefix + "test-credential-123" for entry in sent)
    for header, value in table.headers.items():
        assert all(entry["headers"][header.lower()] == value for entry in sent)
