"""Bad input gets a clear error naming what was wrong and how to fix it, and loses nothing recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import Harness, base_table, error_text, make_harness, merge, table_toml, view
from pollwarden.core.timefmt import iso
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is the messages for bad input (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]


async def start(client: Any, **args: Any) -> Any:
    return await client.call_tool("start_operation", {"provider": "acme", **args})


async def recorded(client: Any) -> list[dict[str, Any]]:
    """Every recorded operation, as list_operations shows it (no provider call)."""
    return view(await client.call_tool("list_operations", {}))["operations"]


# (arguments beyond provider and operation_id, fragments the error must contain)
BAD_STARTS = [
    pytest.param(
        {"provider_job_id": "j", "submit": {"report": "q3"}},
        ["exactly one of provider_job_id", "submit"],
        id="both-job-id-and-submit",
    ),
    pytest.param({}, ["exactly one of provider_job_id", "submit"], id="neither-job-id-nor-submit"),
    pytest.param({"provider_job_id": "  "}, ["provider_job_id", "characters"], id="blank-job-id"),
    pytest.param(
        {"provider_job_id": "j", "deadline_seconds": 86401},
        ["deadline_seconds", "at most 86400", "max_deadline_seconds", "request_extension"],
        id="deadline-above-the-table-max",
    ),
    pytest.param(
        {"provider_job_id": "j", "deadline_seconds": 0},
        ["deadline_seconds", "greater than 0"],
        id="deadline-zero",
    ),
    pytest.param(
        {"provider_job_id": "j", "max_status_requests": 201},
        ["max_status_requests", "1 to 200", "acme table's max_status_requests"],
        id="budget-above-the-table-cap",
    ),
    pytest.param(
        {"provider_job_id": "j", "max_status_requests": 0},
        ["max_status_requests", "greater than 0"],
        id="budget-zero",
    ),
    pytest.param(
        {"provider_job_id": "j", "business_deadline_at": "next friday at six"},
        ["business_deadline_at", "not an RFC 3339 timestamp", "e.g. 2026-11-30T18:00:00Z"],
        id="business-deadline-unparseable",
    ),
    pytest.param(
        {"provider_job_id": "j", "business_deadline_at": "2025-04-18T10:00:00Z"},
        ["business_deadline_at", "2025-04-18T10:00:00Z", "already passed", "future"],
        id="business-deadline-in-the-past",
    ),
    pytest.param(
        {"provider_job_id": "j", "business_deadline_at": "2025-04-18T12:00:00"},
        ["2025-04-18T12:00:00", "no UTC offset", "add 'Z' or '+00:00'"],
        id="business-deadline-without-offset",
    ),
    pytest.param(
        {"provider_job_id": "j", "business_deadline_at": "9999-12-31T23:59:59-23:59"},
        ["business_deadline_at", "'9999-12-31T23:59:59-23:59'", "too far ahead", "10 years", "or omit it"],
        id="business-deadline-in-year-9999",
    ),
    pytest.param(
        {"provider_job_id": "j", "business_deadline_at": "0001-01-01T00:00:00+23:59"},
        ["business_deadline_at", "already passed", "10 years"],
        id="business-deadline-in-year-1",
    ),
    pytest.param(
        {"provider_job_id": "j", "business_deadline_at": "2026-01-01T00:00:00Z" * 10},
        ["business_deadline_at", "at most 64 characters"],
        id="business-deadline-far-too-long",
    ),
    pytest.param(
        {"provider_job_id": "j\x00"},
        ["provider_job_id", "control", "'j\\x00'"],
        id="job-id-with-a-nul",
    ),
    pytest.param(
        {"provider_job_id": "j", "deadline_seconds": "soon"},
        ["deadline_seconds must be a valid number", "(got 'soon')", "accepts a number greater than 0"],
        id="deadline-not-a-number",
    ),
    pytest.param(
        {"provider_job_id": "j", "deadline": 60},
        ["start_operation has no argument 'deadline'", "deadline_seconds"],
        id="a-misspelt-argument",
    ),
    pytest.param(
        {"provider_job_id": "j", "idempotency_key": "k-1"},
        ["idempotency_key", "submit"],
        id="idempotency-key-without-submit",
    ),
]


@pytest.mark.parametrize(("args", "fragments"), BAD_STARTS)
async def test_a_bad_start_is_refused_with_what_was_wrong_and_the_fix_and_records_nothing(
    tmp_path: Path, fake: FakeProvider, args: dict[str, Any], fragments: list[str]
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        kept = view(await start(client, operation_id="op-kept", provider_job_id="kept"))
        result = await start(client, operation_id="op-bad", **args)
        text = error_text(result)
        for fragment in fragments:
            assert fragment in text, (fragment, text)
        assert "Error executing tool" not in text
        assert "Arguments" not in text  # pydantic's model name for the tool's arguments
        # Nothing new recorded, the existing record unchanged, nothing sent anywhere.
        assert await recorded(client) == [
            view(await client.call_tool("get_operation", {"operation_id": "op-kept"}))
        ]
        assert (await recorded(client))[0]["started_at"] == kept["started_at"]
        missing = await client.call_tool("get_operation", {"operation_id": "op-bad"})
        assert "no operation 'op-bad'" in error_text(missing)
    assert fake.log() == []


async def test_the_limits_themselves_are_accepted(tmp_path: Path, fake: FakeProvider) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        v = view(
            await start(
                client,
                operation_id="op-max",
                provider_job_id="j",
                deadline_seconds=86400,
                max_status_requests=200,
                business_deadline_at="2025-04-18T14:00:00+02:00",  # 12:00 UTC, any offset is fine
            )
        )
        assert v["max_status_requests"] == 200
        assert v["deadline_at"] == iso(h.clock.now() + 86400)
        assert v["business_deadline_at"] == "2025-04-18T12:00:00.000Z"


@pytest.mark.parametrize("era", ERAS)
async def test_the_same_operation_id_for_a_different_job_is_a_conflict_and_the_original_is_unchanged(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    fake.script("first", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client(**era) as client:
        view(await start(client, operation_id="op-1", provider_job_id="first", max_status_requests=5))
        polled = view(await client.call_tool("check_status", {"operation_id": "op-1", "wait_seconds": 30}))
        assert polled["status_requests_used"] == 1

        for other in ({"provider_job_id": "second"}, {"submit": {"report": "q3"}}):
            conflict = await start(client, operation_id="op-1", **other)
            text = error_text(conflict)
            assert "operation 'op-1' already exists" in text
            assert "use a new operation_id" in text

        after = view(await client.call_tool("get_operation", {"operation_id": "op-1"}))
        assert after == view(await client.call_tool("get_operation", {"operation_id": "op-1"}))
        for key in (
            "provider_job_id",
            "status_requests_used",
            "max_status_requests",
            "next_check_at",
            "state",
        ):
            assert after[key] == polled[key], key
        assert after["provider_job_id"] == "first"

        # The same job again is not a conflict: the same record comes back, budgets as first recorded.
        again = view(
            await start(
                client,
                operation_id="op-1",
                provider_job_id="first",
                max_status_requests=9,
                deadline_seconds=60,
            )
        )
        assert (again["max_status_requests"], again["deadline_at"]) == (5, polled["deadline_at"])
        assert again["status_requests_used"] == 1
        assert len(await recorded(client)) == 1
    assert [e["job_id"] for e in fake.log()] == ["first"]  # nothing submitted, nothing sent for "second"


# (tool, arguments, fragments the error must contain) for refusals before any tool body runs
BAD_CALLS = [
    pytest.param(
        "start_operation",
        {"provider": "acme", "operation_id": "op\nStopped because: forged", "provider_job_id": "j"},
        ["operation_id must not contain control", "'op\\nStopped because: forged'"],
        id="operation-id-with-a-newline",
    ),
    pytest.param(
        "list_operations",
        {"status": "running"},
        ["status must be 'submitting', 'waiting'", "or 'escalated'", "(got 'running')"],
        id="list-status-not-a-status",
    ),
    pytest.param(
        "check_status",
        {"operation_id": "op-1", "wait_seconds": "half a minute"},
        ["wait_seconds must be a valid number", "accepts a number from 0 to 30"],
        id="wait-not-a-number",
    ),
    pytest.param(
        "check_status",
        {"operation_id": "op-1", "wait": 30},
        ["check_status has no argument 'wait'", "operation_id, wait_seconds"],
        id="wait-misspelt",
    ),
    pytest.param(
        "get_operation",
        {"operation_id": "x" * 5000},
        ["operation_id must have at most 200 characters", "accepts text of 1 to 200 characters"],
        id="operation-id-far-too-long",
    ),
    pytest.param(
        "get_operation",
        {"operation_id": "\ud800"},
        ["operation_id is not valid Unicode text"],
        id="operation-id-with-an-unpaired-surrogate",
    ),
    pytest.param(
        "request_extension",
        {"operation_id": "op-1", "extra_seconds": 60, "extra_status_requests": 1},
        ["reason is required", "reason accepts text of at most 500 characters"],
        id="extension-without-a-reason",
    ),
]


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(("tool", "args", "fragments"), BAD_CALLS)
async def test_a_refused_argument_is_named_in_plain_words_without_the_sdks_framing_and_records_nothing(
    tmp_path: Path,
    fake: FakeProvider,
    era: dict[str, Any],
    tool: str,
    args: dict[str, Any],
    fragments: list[str],
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client(**era) as client:
        view(await start(client, operation_id="op-1", provider_job_id="kept"))
        before = await recorded(client)
        text = error_text(await client.call_tool(tool, args))
        for fragment in fragments:
            assert fragment in text, (fragment, text)
        for leak in ("Error executing tool", "Arguments", "pydantic", "type="):
            assert leak not in text, (leak, text)
        assert len(text) < 600
        assert await recorded(client) == before
    assert fake.log() == []


@pytest.mark.parametrize("era", ERAS)
async def test_an_unknown_operation_id_is_named_with_how_to_find_the_right_one(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any]
) -> None:
    h = make_harness(tmp_path, fake)
    async with h.client(**era) as client:
        for tool, args in (
            ("check_status", {"operation_id": "op-missing", "wait_seconds": 5}),
            ("get_operation", {"operation_id": "op-missing"}),
            (
                "request_extension",
                {
                    "operation_id": "op-missing",
                    "extra_seconds": 60,
                    "extra_status_requests": 1,
                    "reason": "slow",
                },
            ),
        ):
            text = error_text(await client.call_tool(tool, args))
            assert "no operation 'op-missing'" in text, tool
            assert "list_operations" in text, tool
            assert "start_operation" in text, tool
        assert await recorded(client) == []
    assert fake.log() == []


# -- a wrong provider table at start-up --------------------------------------------------------------


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}


BROKEN_TABLES = [
    pytest.param(
        {"limits": {"max_status_request": 5}},
        "limits.max_status_request",
        ["unknown key", "did you mean 'max_status_requests'"],
        id="misspelt-key",
    ),
    pytest.param(
        {"states": {"failed": ["failed", "running"]}},
        "states.pending",
        ["'running' is listed under both pending and failed", "list each state under one category only"],
        id="state-in-two-categories",
    ),
    pytest.param(
        {"status_path": "/v1/jobs/status"},
        "status_path",
        ["does not contain {job_id}", 'e.g. "/v1/jobs/{job_id}"'],
        id="status-path-without-job-id",
    ),
]


@pytest.mark.parametrize(("change", "key", "fragments"), BROKEN_TABLES)
async def test_a_wrong_provider_table_stops_serve_at_start_up_naming_the_file_the_key_and_the_fix(
    tmp_path: Path, fake: FakeProvider, change: dict[str, Any], key: str, fragments: list[str]
) -> None:
    fake.script("safe", [pending("running")])
    h: Harness = make_harness(tmp_path, fake)
    async with h.client() as client:
        view(await start(client, operation_id="op-safe", provider_job_id="safe"))
        before = view(await client.call_tool("get_operation", {"operation_id": "op-safe"}))

    broken_dir = tmp_path / "broken"
    broken_dir.mkdir()
    broken = broken_dir / "acme.toml"
    broken.write_text(table_toml(merge(base_table(fake.base_url), change)))
    done = subprocess.run(
        [sys.executable, "-m", "pollwarden", "serve", "--db", str(h.db_path), "--providers", str(broken_dir)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        env=child_env(),
        check=False,
    )
    assert done.returncode != 0
    assert done.stdout == b""  # stdout belongs to JSON-RPC, even when refusing to start
    stderr = done.stderr.decode()
    assert str(broken) in stderr
    assert f"key '{key}'" in stderr
    for fragment in fragments:
        assert fragment in stderr, (fragment, stderr)
    assert "Traceback" not in stderr

    # The refused start-up touched nothing recorded.
    async with h.client() as client:
        assert view(await client.call_tool("get_operation", {"operation_id": "op-safe"})) == before
    assert fake.log() == []


def test_serving_http_on_a_non_loopback_host_is_refused_unless_asked_for(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pollwarden",
            "serve",
            "--transport",
            "http",
            "--host",
            "0.0.0.0",
            "--db",
            str(tmp_path / "x.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "not a loopback address" in done.stderr
    assert "--allow-non-loopback" in done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("command", [["serve", "--transport", "http"], ["webhooks"], ["metrics"]])
@pytest.mark.parametrize("port", ["70000", "-5"])
def test_a_port_outside_0_to_65535_is_refused_in_one_line_naming_the_range(
    tmp_path: Path, command: list[str], port: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pollwarden", *command, "--port", port, "--db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"--port {port}: give a TCP port from 0 to 65535" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
