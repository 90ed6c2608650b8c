"""The README's first steps, tried as a new user would: each stumbling block says what to do instead.

Commands run as the user runs them (`python -m pollwarden …`, a real file
system in a temp dir); an optional extra is made missing by hiding its
package from the child interpreter, never by uninstalling it.
"""

from __future__ import annotations

import logging
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness import base_table, merge
from pollwarden.cli.main import build_parser, serve_config
from pollwarden.cli.webhooks import warn_without_standard_webhooks
from pollwarden_providers import load_tables
from tests.support.live import pollwarden_cli, write_table

HIDE_AND_RUN = "import sys; sys.modules[{module!r}] = None; from pollwarden.cli.main import main; sys.exit(main(sys.argv[1:]))"


def run_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`pollwarden ARGS` in a child interpreter where `module` cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", HIDE_AND_RUN.format(module=module), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_console_without_its_extra_says_how_to_install_it_from_a_clone(tmp_path: Path) -> None:
    done = run_without("jinja2", "console", "--db", str(tmp_path / "demo.db"))
    assert done.returncode == 2
    assert "jinja2 is missing" in done.stderr
    assert ".venv/bin/pip install -e '.[console]'" in done.stderr


def test_a_db_in_the_missing_data_directory_is_created_owner_only_as_the_default_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POLLWARDEN_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "fresh-home" / ".local" / "share"))
    data = tmp_path / "fresh-home" / ".local" / "share" / "pollwarden"
    serve_config(build_parser().parse_args(["serve", "--db", str(data / "pollwarden.db")]))
    assert data.is_dir()
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    typo = tmp_path / "elsewhere" / "pollwarden.db"
    serve_config(build_parser().parse_args(["serve", "--db", str(typo)]))
    assert not typo.parent.exists()  # any other missing directory is still refused when opened


def test_the_webhook_receiver_on_a_mistyped_database_refuses_and_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    done = pollwarden_cli("webhooks", "--db", str(typo), "--port", "0")
    assert done.code == 2
    assert f"no database at {typo}; nothing was created" in done.stderr
    assert not typo.exists()


def test_without_the_webhooks_extra_the_receiver_warns_at_start_up_naming_the_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    signed = {
        "webhook": {
            "scheme": "standard",
            "secret_env": "ACME_WEBHOOK_SECRET",
            "job_id_fields": ["id"],
            "events": ["job.completed"],
        }
    }
    write_table(tmp_path / "tables", merge(base_table("http://127.0.0.1:9"), signed))
    tables = load_tables([tmp_path / "tables"])
    monkeypatch.setitem(sys.modules, "standardwebhooks", None)
    with caplog.at_level(logging.WARNING, logger="pollwarden"):
        warn_without_standard_webhooks(tables)
    [warning] = [r.getMessage() for r in caplog.records if "standardwebhooks" in r.getMessage()]
    assert "acme" in warning
    assert "openai-batch" in warning  # the shipped tables that sign this way too
    assert ".venv/bin/pip install -e '.[webhooks]'" in warning
    monkeypatch.delitem(sys.modules, "standardwebhooks")
    caplog.clear()
    warn_without_standard_webhooks(tables)  # with the extra: nothing to say
    assert caplog.records == []
