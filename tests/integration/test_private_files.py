"""Files are private and written safely: the database, its companions, exports, anchors, the data directory.

Owner-only modes; exports and anchors written through an exclusive temporary file and a rename that never
follows a symlink; a database another user owns or others can write is refused.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from harness import error_text, make_harness, view, write_table
from pollwarden.core.errors import StoreError
from pollwarden.core.files import prepare_database_file, private_file_problem, write_private_file
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import call, pollwarden_cli, stdio_server

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]  # about the SQLite file

ROOT = os.geteuid() == 0


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_new_database_and_its_wal_and_shm_are_readable_by_the_owner_only(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("priv", [pending("running")])
    h = make_harness(tmp_path, fake)
    previous = os.umask(0o022)  # the usual umask: new files would be 0644
    try:
        async with h.client() as client:
            view(
                await client.call_tool(
                    "start_operation",
                    {"provider": "acme", "operation_id": "op-priv", "provider_job_id": "priv"},
                )
            )
            companions = [h.db_path.with_name(h.db_path.name + s) for s in ("-wal", "-shm")]
            assert all(p.exists() for p in companions)
            modes = {p.name: mode(p) for p in (h.db_path, *companions)}
    finally:
        os.umask(previous)
    assert modes == {"pollwarden.db": 0o600, "pollwarden.db-wal": 0o600, "pollwarden.db-shm": 0o600}


async def test_the_default_data_directory_is_created_owner_only(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake)
    write_table(h.tables_dir, h.table)
    data_home = tmp_path / "xdg"
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "pollwarden", "serve", "--providers", str(h.tables_dir)],
        env={**env, "XDG_DATA_HOME": str(data_home)},
    )
    async with Client(params) as client:
        assert (await call(client, "list_operations"))["count"] == 0
    directory = data_home / "pollwarden"
    assert mode(directory) == 0o700
    assert mode(directory / "pollwarden.db") == 0o600


async def test_an_own_database_others_can_read_is_made_private(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    db.write_bytes(b"")
    db.chmod(0o644)
    prepare_database_file(db)
    assert mode(db) == 0o600


async def test_a_group_writable_database_is_refused_with_the_fix_for_agent_and_operator(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("gw", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        view(await client.call_tool("list_operations", {}))
    h.db_path.chmod(0o664)
    async with h.client() as client:
        text = error_text(await client.call_tool("list_operations", {}))
    assert f"{h.db_path} is writable by its group or by others (mode 664)" in text
    assert f"chmod 600 {h.db_path}" in text
    operator = pollwarden_cli("approvals", "list", "--db", str(h.db_path))
    assert operator.code == 2
    assert "writable by its group or by others" in operator.stderr
    assert mode(h.db_path) == 0o664  # refused, not silently changed


def test_a_database_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "theirs.db"
    db.write_bytes(b"")
    real = db.stat()
    other = os.stat_result((real.st_mode, *real[1:4], real.st_uid + 1, *real[5:]))
    problem = private_file_problem(db, other)
    assert problem is not None
    assert f"belongs to user id {real.st_uid + 1}, not to this user" in problem


@pytest.mark.skipif(not ROOT, reason="changing a file's owner needs root")
async def test_a_database_chowned_to_another_user_is_refused_before_sqlite_opens_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        view(await client.call_tool("list_operations", {}))
    os.chown(h.db_path, 65534, 65534)
    errlog = tmp_path / "server.log"
    write_table(h.tables_dir, h.table)
    async with stdio_server(h.db_path, h.tables_dir, errlog=errlog) as client:
        text = error_text(await client.call_tool("list_operations", {}))
    assert "belongs to user id 65534, not to this user" in text
    with pytest.raises(StoreError, match="belongs to user id 65534"):
        prepare_database_file(h.db_path)


def test_a_dangling_symlink_in_place_of_the_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "pw.db"
    db.symlink_to(tmp_path / "elsewhere" / "target.db")
    with pytest.raises(StoreError, match="symlink to a missing file"):
        prepare_database_file(db)


async def _database_with_audit(tmp_path: Path, fake: FakeProvider) -> Path:
    fake.script("aud", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        view(
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "op-aud", "provider_job_id": "aud"}
            )
        )
    return h.db_path


async def test_an_export_replaces_a_symlink_at_out_instead_of_writing_through_it(
    tmp_path: Path, fake: FakeProvider
) -> None:
    db = await _database_with_audit(tmp_path, fake)
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "victim.conf"
    victim.write_text("important\n")
    out = shared / "audit.jsonl"
    out.symlink_to(victim)
    exported = pollwarden_cli("audit", "export", "--db", str(db), "--out", str(out))
    assert exported.code == 0, exported.stderr
    assert victim.read_text() == "important\n"
    assert not out.is_symlink()
    assert mode(out) == 0o600
    assert json.loads(out.read_text().splitlines()[0])["operation_id"] == "op-aud"
    assert sorted(p.name for p in shared.iterdir()) == ["audit.jsonl"]  # no temporary file left


async def test_an_anchor_ignores_a_planted_tmp_symlink_and_is_private(
    tmp_path: Path, fake: FakeProvider
) -> None:
    db = await _database_with_audit(tmp_path, fake)
    victim = tmp_path / "victim.conf"
    victim.write_text("important\n")
    out = tmp_path / "head.json"
    out.with_name("head.json.tmp").symlink_to(victim)  # the name the old code wrote to
    anchored = pollwarden_cli("audit", "anchor", "--db", str(db), "--out", str(out))
    assert anchored.code == 0, anchored.stderr
    assert victim.read_text() == "important\n"
    assert mode(out) == 0o600
    assert json.loads(out.read_text())["seq"] >= 1


def test_a_failed_write_leaves_the_target_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("before\n")

    def interrupted_write() -> None:
        with write_private_file(target) as handle:
            handle.write("half")
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        interrupted_write()
    assert target.read_text() == "before\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


async def test_approvals_list_on_a_missing_database_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    listed = pollwarden_cli("approvals", "list", "--db", str(db))
    assert listed.code == 2
    assert f"no database at {db}" in listed.stderr
    assert list(tmp_path.iterdir()) == []
