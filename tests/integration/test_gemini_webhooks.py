"""Gemini pushes: the shipped `gemini-batch` table receives its Standard Webhooks (issue 30, item 12).

The samples follow Gemini's documented thin envelope
(https://ai.google.dev/gemini-api/docs/webhooks, see samples/SOURCES.md); a
batch event wakes the batch it names, anything else is acknowledged and
ignored. `pollwarden providers list` shows every table's webhook: its scheme,
the name of its secret variable (never the value) and the events that wake.
"""

from __future__ import annotations

import json

import pytest

from pollwarden.cli.main import main
from pollwarden.provider_io.webhooks import standard_signature_headers, verify
from pollwarden_providers import load_table, shipped_samples_dir, shipped_tables_dir
from pollwarden_providers.webhook import read_event

# SQLite only: the subject is Gemini's webhook envelope (tests/conftest.py).
pytestmark = pytest.mark.one_engine

SAMPLES = shipped_samples_dir() / "gemini-batch" / "webhooks"
SECRET = "whsec_" + "dGVzdC1zZWNyZXQtZm9yLXBvbGx3YXJkZW4td2ViaG9va3M="


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        ("batch.succeeded.json", ("batch.succeeded", True, "abc123")),
        ("batch.failed.json", ("batch.failed", True, "abc123")),
        ("video.generated.json", ("video.generated", False, None)),
    ],
)
def test_gemini_batch_events_wake_the_batch_they_name_and_others_are_ignored(
    sample: str, expected: tuple[str, bool, str | None]
) -> None:
    table = load_table(shipped_tables_dir() / "gemini-batch.toml")
    assert table.webhook is not None
    assert (table.webhook.scheme, table.webhook.secret_env) == ("standard", "GEMINI_WEBHOOK_SECRET")
    body = json.loads((SAMPLES / sample).read_text())
    event = read_event(table.webhook, body, {})
    assert (event.event_type, event.wakes, event.job_id) == expected


def test_a_gemini_sample_signed_per_standard_webhooks_verifies_and_a_tampered_one_does_not() -> None:
    from pollwarden.provider_io.webhooks import Refused

    table = load_table(shipped_tables_dir() / "gemini-batch.toml")
    assert table.webhook is not None
    body = (SAMPLES / "batch.succeeded.json").read_bytes()
    now = 1_796_040_000
    headers = standard_signature_headers(SECRET, "msg_gemini_1", now, body)
    assert verify(table.webhook, SECRET, headers, body, now=now).event_id == "msg_gemini_1"
    with pytest.raises(Refused):
        verify(table.webhook, SECRET, headers, body.replace(b"abc123", b"abc124"), now=now)


def test_providers_check_reads_a_saved_gemini_webhook_body(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["providers", "check", "gemini-batch", "--webhook", str(SAMPLES / "batch.succeeded.json")])
    out = capsys.readouterr().out
    assert code == 0
    assert "event 'batch.succeeded' for job 'abc123'" in out


def test_providers_list_shows_each_tables_webhook_scheme_secret_variable_and_events_never_the_secret(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("OPENAI_WEBHOOK_SECRET", SECRET)
    code = main(["providers", "list"])
    out = capsys.readouterr().out
    assert code == 0
    blocks = {block.split("  (", 1)[0]: block for block in out.split("\n\n")}
    expected = {
        "gemini-batch": "standard, secret from $GEMINI_WEBHOOK_SECRET, wakes on batch.succeeded, batch.failed, "
        "batch.cancelled, batch.expired",
        "openai-batch": "standard, secret from $OPENAI_WEBHOOK_SECRET, wakes on batch.completed, batch.failed, "
        "batch.cancelled, batch.expired",
        "github-actions-runs": "github, secret from $GITHUB_WEBHOOK_SECRET, wakes on workflow_run.completed",
    }
    for name, line in expected.items():
        assert f"  webhook       {line}\n" in blocks[name] + "\n", blocks[name]
    assert "webhook" not in blocks["anthropic-message-batches"]  # no [webhook]: no line
    assert "dGVzdC1zZWNyZXQ" not in out  # the secret's value is never shown
