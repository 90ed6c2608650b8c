"""/healthz, /readyz and `pollwarden doctor`: a deployment tells whether it can serve, on both engines.

/readyz is served by the receiver app `pollwarden webhooks` runs (the same
routes sit beside /mcp and in the console), on 127.0.0.1, over a real SQLite
file or PostgreSQL schema that the test then takes away.
"""

from __future__ import annotations

import io
import os
import re
import sqlite3
import time
from pathlib import Path

import anyio
import httpx2
import psycopg
import pytest

import pg_support
from harness import Harness, make_harness, track
from pollwarden.cli.doctor import FAIL, cmd_doctor, diagnose
from pollwarden.cli.main import build_parser
from pollwarden.store import Engine
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import pollwarden_cli, write_table
from tests.support.ops_http import receiver_on_loopback

AUTH = {"env": "ACME_TOKEN", "header": "Authorization", "prefix": "Bearer "}


def take_the_database_away(tmp: Path, engine: Engine) -> None:
    """SQLite: delete the file (and its WAL) under the running server; PostgreSQL: drop the schema."""
    if engine == Engine.SQLITE:
        for name in ("pollwarden.db", "pollwarden.db-wal", "pollwarden.db-shm"):
            (tmp / name).unlink(missing_ok=True)
        return
    with psycopg.connect(pg_support.server_url(), autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {pg_support.schema_for(tmp)} CASCADE")


@pytest.mark.anyio
async def test_readyz_answers_200_while_the_database_serves_and_503_once_it_is_gone(
    tmp_path: Path, fake: FakeProvider, database_engine: Engine
) -> None:
    fake.script("r", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "r")
    async with receiver_on_loopback(h) as web:
        ready = await web.get("/readyz")
        assert (ready.status_code, ready.json()["status"]) == (200, "ready")
        take_the_database_away(tmp_path, database_engine)
        gone = await web.get("/readyz")
        assert (gone.status_code, gone.json()["status"]) == (503, "not_ready")
        assert gone.json()["reason"]
        alive = await web.get("/healthz")  # the process still serves: only readiness failed
        assert (alive.status_code, alive.json()) == (200, {"status": "ok"})
        scraped = await web.get("/metrics")
        assert scraped.status_code == 200
        assert "pollwarden_database_up 0.0" in scraped.text


async def one_operation(h: Harness, job: str) -> None:
    async with h.client() as client:
        await track(client, job)


def test_doctor_says_a_credential_is_set_without_printing_any_of_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    secret = "sk-doctor-" + "a" * 40
    h = make_harness(tmp_path, fake, table={"auth": AUTH}, environ={"ACME_TOKEN": secret})
    anyio.run(one_operation, h, "d")
    args = build_parser().parse_args(["doctor", "--db", h.database.url, "--providers", str(h.tables_dir)])
    out = io.StringIO()
    os.environ["ACME_TOKEN"] = secret
    try:
        code = cmd_doctor(args, out)
    finally:
        del os.environ["ACME_TOKEN"]
    report = out.getvalue()
    assert code == 0, report
    assert "ok   credential acme: ACME_TOKEN is set" in report
    assert "reachable and migrated" in report
    assert secret not in report
    assert secret[:12] not in report


@pytest.mark.sqlite_only
def test_doctor_fails_on_a_missing_database_file_and_creates_none(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    args = build_parser().parse_args(["doctor", "--db", str(missing)])
    out = io.StringIO()
    assert cmd_doctor(args, out) == 1
    assert f"{FAIL} database: no database at {missing}" in out.getvalue()
    assert not missing.exists()


@pytest.mark.sqlite_only
@pytest.mark.parametrize("kind", ["empty file", "another program's database"])
def test_doctor_reads_a_sqlite_file_that_is_not_pollwardens_and_changes_nothing_in_it(
    tmp_path: Path, kind: str
) -> None:
    other = tmp_path / "other.db"
    if kind == "empty file":
        other.touch()
    else:
        with sqlite3.connect(other) as conn:
            conn.execute("CREATE TABLE x (a)")
    other.chmod(0o644)
    before = other.read_bytes(), other.stat().st_mode
    args = build_parser().parse_args(["doctor", "--db", str(other)])
    out = io.StringIO()
    assert cmd_doctor(args, out) == 1
    assert f"{FAIL} database: {other} is not a pollwarden database" in out.getvalue()
    assert (other.read_bytes(), other.stat().st_mode) == before  # not migrated, not re-moded


@pytest.mark.postgres_only
def test_doctor_fails_a_clock_skewed_from_the_database_server(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake)
    anyio.run(one_operation, h, "k")
    skewed = diagnose(h.config(), {}, clock=lambda: time.time() + 30)
    [clock] = [f for f in skewed if f.topic == "clock"]
    assert clock.level == FAIL
    assert re.search(r"\+(29\.9|30)", clock.detail), clock.detail  # 30 s ahead, less the round trip
    fine = diagnose(h.config(), {})
    assert [f.level for f in fine if f.topic == "clock"] == ["ok"]


@pytest.mark.anyio
async def test_pollwarden_metrics_serves_a_stdio_deployments_database_and_never_creates_one(
    tmp_path: Path, fake: FakeProvider
) -> None:
    from tests.integration.test_restart_and_transports import child_process, free_port, wait_until_listening

    fake.script("m", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "m")
    write_table(h.tables_dir, h.table)
    port = free_port()
    log = tmp_path / "metrics.log"
    args = ["-m", "pollwarden", "metrics", "--db", h.database.url, "--providers", str(h.tables_dir)]
    with child_process([*args, "--port", str(port)], log) as proc:
        await wait_until_listening(proc, port, log)
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as web:
            scraped = await web.get("/metrics")
            ready = await web.get("/readyz")
    assert 'pollwarden_operations{status="waiting",stop_reason=""} 1.0' in scraped.text
    assert ready.status_code == 200
    typo = tmp_path / "typo.db"
    refused = pollwarden_cli("metrics", "--db", str(typo), "--port", "0")
    assert refused.code == 2
    assert not typo.exists()
