"""A database file replaced or deleted under a running server is detected before anything is sent.

The server checks, before each write transaction, that its path still names
the file it opened (device and inode). If not, the call is refused with an
error saying what happened and what to do, and no request goes out: counting
on in an unlinked file would lose every count at the next restart.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from harness import error_text, make_harness, track
from tests.support.fake_provider import FakeProvider, pending

pytestmark = pytest.mark.anyio


def _database_files(db: Path) -> list[Path]:
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]


async def test_a_database_deleted_under_a_running_server_refuses_the_next_check_and_sends_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("gone", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "gone")
        for path in _database_files(h.db_path):
            path.unlink(missing_ok=True)
        h.clock.advance(10)  # the first check is allowed
        checked = await client.call_tool("check_status", {"operation_id": "op-gone"})
        started = await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-new", "provider_job_id": "new"}
        )

    for text in (error_text(checked), error_text(started)):
        assert f"the database file {h.db_path} was deleted while this server was running" in text
        assert "nothing was changed and no request was sent" in text
        assert "restart the pollwarden server" in text
    assert fake.status_requests("gone") == []
    assert not h.db_path.exists()  # nothing was written to a new file either


async def test_a_database_replaced_under_a_running_server_refuses_the_next_check_and_sends_nothing(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("swapped", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "swapped")
        # Someone restores an old copy over the live file (a new inode at the same path).
        copy = tmp_path / "copy.db"
        with sqlite3.connect(h.db_path) as live, sqlite3.connect(copy) as backup:
            live.backup(backup)
        shutil.move(copy, h.db_path)
        h.clock.advance(10)
        checked = await client.call_tool("check_status", {"operation_id": "op-swapped"})

    text = error_text(checked)
    assert f"the database file {h.db_path} was replaced by another file while this server was running" in text
    assert "no request was sent" in text
    assert fake.status_requests("swapped") == []
