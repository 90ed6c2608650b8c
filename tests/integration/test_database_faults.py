"""Database faults: locked past the busy timeout, a read-only file, a missing directory.

Each one reaches the agent as a tool error naming the problem and the fix,
reaches the operator as an exit code and a message on stderr, and leaves every
record as it was. The server runs as a real `pollwarden serve` subprocess.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client import Client

from harness import base_table, error_text, make_harness, make_operator, merge, track, view, write_table
from pollwarden.config import ServerConfig
from pollwarden.core.clock import SystemClock
from pollwarden.flows.controller import Controller
from pollwarden.provider_io.provider_http import ProviderHTTP
from pollwarden.store import DatabaseLocation, open_store
from pollwarden.surface.server import build_server, controller_factory
from pollwarden_providers.table import ProviderTable
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import Rigging, audit_verify, call, pollwarden_cli, read_record, stdio_server

# SQLite file faults; PostgreSQL faults are in test_postgres_faults.py.
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.sqlite_only]

# A short --busy-timeout, so a locked database is reported within the test.
BUSY_TIMEOUT = 0.3
# Holds the write lock from another process until its stdin closes.
LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


def _table(fake: FakeProvider) -> dict[str, Any]:
    return merge(
        base_table(fake.base_url), {"schedule": {"base_delay_seconds": 0.05, "max_delay_seconds": 0.1}}
    )


def _setup(tmp_path: Path, fake: FakeProvider, job_id: str) -> tuple[Path, Path, dict[str, Any]]:
    fake.script(job_id, [pending("running")])
    table = _table(fake)
    tables = tmp_path / "tables"
    write_table(tables, table)
    return tmp_path / "pollwarden.db", tables, table


async def _record_operation(db: Path, table: dict[str, Any], operation_id: str, job_id: str) -> None:
    """Record an operation and a pending approval for it, as a server would, then close the file."""
    clock = SystemClock()
    http = ProviderHTTP(environ={}, now=clock.now)
    try:
        async with open_store(db) as store:
            controller = Controller(
                store=store,
                tables={"acme": ProviderTable.model_validate(table)},
                http=http,
                clock=clock,
                rng=random.Random(1),
                config=ServerConfig(database=DatabaseLocation.sqlite(db)),
            )
            await controller.start_operation(
                provider="acme", operation_id=operation_id, provider_job_id=job_id, deadline_seconds=600
            )
            record = await store.get(operation_id)
            assert record is not None
            await store.open_approval(
                approval_id=f"ap-{operation_id}",
                record=record,
                kind="extension",
                request={"extra_seconds": 60, "extra_status_requests": 1},
                at=clock.now(),
                ttl_seconds=900,
            )
    finally:
        await http.aclose()


@contextmanager
def _lock_held_by_another_process(db: Path) -> Iterator[None]:
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdin is not None
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=10)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait(timeout=5)


@contextmanager
def _read_only(path: Path) -> Iterator[None]:
    """Make `path` read-only to this user: chmod, or for root (who ignores modes) the immutable flag."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    chattr = shutil.which("chattr")
    if (
        chattr is None
        or subprocess.run([chattr, "+i", str(path)], capture_output=True, check=False).returncode
    ):
        pytest.skip("running as root without chattr +i: no way to make a file read-only to root here")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


async def test_a_database_locked_past_the_busy_timeout_is_a_clear_error_for_agent_and_operator_and_changes_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    db, tables, _ = _setup(tmp_path, fake, "lock-job")
    async with stdio_server(
        db, tables, errlog=tmp_path / "server.log", rigging=Rigging(busy_timeout_seconds=BUSY_TIMEOUT)
    ) as client:
        await call(
            client, "start_operation", provider="acme", operation_id="op-lock", provider_job_id="lock-job"
        )
        before = read_record(db, "op-lock")

        with _lock_held_by_another_process(db):
            checked = await client.call_tool("check_status", {"operation_id": "op-lock", "wait_seconds": 1})
            started = await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "op-lock-2", "provider_job_id": "x"}
            )
            operator = pollwarden_cli(
                "approvals", "list", "--db", str(db), "--busy-timeout", str(BUSY_TIMEOUT)
            )

            for text in (error_text(checked), error_text(started), operator.stderr):
                assert f"the database {db} stayed locked by another process for more than 0.3 s" in text
                assert "nothing was changed" in text
                assert "find the process holding it" in text
            assert operator.code == 2
            assert operator.stderr.startswith("pollwarden: ")
            assert fake.status_requests("lock-job") == []

        assert read_record(db, "op-lock") == before
        assert read_record(db, "op-lock-2") is None
        # Once the lock is released the same call works, and counts from where it was.
        view = await call(client, "check_status", operation_id="op-lock", wait_seconds=5)
        assert view["outcome"] == "polled"
        assert view["status_requests_used"] == 1 == len(fake.status_requests("lock-job"))
    assert audit_verify(db).code == 0


async def test_a_read_only_database_file_is_a_clear_error_for_agent_and_operator_and_changes_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    db, tables, table = _setup(tmp_path, fake, "ro-job")
    await _record_operation(db, table, "op-ro", "ro-job")
    before = read_record(db, "op-ro")

    with _read_only(db):
        async with stdio_server(db, tables, errlog=tmp_path / "server.log") as client:
            # Reading still works; anything that would write says why it cannot.
            assert (await call(client, "get_operation", operation_id="op-ro"))["status"] == "waiting"
            checked = await client.call_tool("check_status", {"operation_id": "op-ro", "wait_seconds": 1})
            started = await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "op-ro-2", "provider_job_id": "y"}
            )
        # A decision needs a person or an operator key; the key gets it as far as the write.
        key = make_operator(tmp_path / "keys")
        operator = pollwarden_cli(
            "approve", "ap-op-ro", "--db", str(db), "--operator-key", str(key.key_file), env=key.env()
        )
        verify_read_only = audit_verify(db)

        for text in (error_text(checked), error_text(started), operator.stderr):
            assert f"the database {db} is read-only" in text
            assert "nothing was changed" in text
            assert "give the server write access to the file and its directory" in text
        assert operator.code == 2
        assert operator.stderr.startswith("pollwarden: ")
        # The operator can still read and verify the audit of a read-only copy.
        assert verify_read_only.code == 0

    assert read_record(db, "op-ro") == before
    assert read_record(db, "op-ro-2") is None
    assert fake.status_requests("ro-job") == []
    assert audit_verify(db).code == 0


async def test_a_missing_database_directory_is_a_clear_error_for_agent_and_operator_and_creates_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    _, tables, _ = _setup(tmp_path, fake, "gone-job")
    db = tmp_path / "no-such-dir" / "pollwarden.db"
    errlog = tmp_path / "server.log"
    async with stdio_server(db, tables, errlog=errlog) as client:
        errors = [
            error_text(await client.call_tool(tool, arguments))
            for tool, arguments in (
                (
                    "start_operation",
                    {"provider": "acme", "operation_id": "op-gone", "provider_job_id": "gone-job"},
                ),
                ("check_status", {"operation_id": "op-gone"}),
                ("list_operations", {}),
            )
        ]
    operator = pollwarden_cli("approvals", "list", "--db", str(db))

    # The server stays up and tells the agent, on every call, what is wrong and how to fix it.
    for text in errors:
        assert f"the directory {db.parent} for the database does not exist" in text
        assert "create it, or point --db / POLLWARDEN_DB at a writable location" in text
        assert "restart the pollwarden server" in text
    # The operator sees it in the server's log, and from any command, with exit code 2.
    assert (
        f"database unusable: the directory {db.parent} for the database does not exist" in errlog.read_text()
    )
    assert operator.code == 2
    assert operator.stderr.startswith(
        f"pollwarden: the directory {db.parent} for the database does not exist"
    )
    assert not db.parent.exists()
    assert fake.status_requests("gone-job") == []


async def test_an_answer_the_locked_file_cannot_take_is_held_and_recorded_by_the_next_check_never_sent_again(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("held", [pending("running"), pending("running")])
    h = make_harness(tmp_path, fake)
    h.busy_timeout_seconds = BUSY_TIMEOUT
    write_table(h.tables_dir, h.table)
    db = h.database.path
    holding: list[Any] = []

    def lock_before_the_answer_is_recorded(step: str) -> None:
        if step == "before_persist" and not holding:
            holder = _lock_held_by_another_process(db)
            holder.__enter__()  # the request was sent and answered; now the file is locked
            holding.append(holder)

    factory = controller_factory(
        h.config(),
        clock=h.clock,
        rng=h.rng,
        environ=h.environ,
        on_boundary=lock_before_the_answer_is_recorded,
    )
    async with Client(build_server(factory)) as client:
        await track(client, "held")
        h.clock.advance(10)
        try:
            told = await client.call_tool("check_status", {"operation_id": "op-held"})
        finally:
            holding[0].__exit__(None, None, None)
        text = error_text(told)
        assert "the status request for 'op-held' was sent and the provider answered" in text
        assert "nothing was sent" not in text
        assert len(fake.status_requests("held")) == 1
        after = view(await client.call_tool("check_status", {"operation_id": "op-held"}))
        assert (after["outcome"], after["state"], after["status_requests_used"]) == ("not_yet", "running", 1)
        h.clock.advance(after["retry_after_seconds"])
        again = view(await client.call_tool("check_status", {"operation_id": "op-held"}))
        assert (again["outcome"], again["status_requests_used"]) == ("polled", 2)
    assert len(fake.status_requests("held")) == 2
