"""A canary credential reaches the provider, and nothing else: not tool output, the database, the audit,
the logs or an error message — even when the provider echoes it back.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from mcp_types import CallToolResult

from harness import Harness, db_rows, error_text, make_harness, view
from pollwarden.audit.chain import export_jsonl
from tests.support.fake_provider import FakeProvider, Step, failed, http, pending

# SQLite only: the subject is where a credential may appear; the tests marked both_engines read the database too (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

WITH_AUTH: dict[str, Any] = {"auth": {"env": "ACME_TOKEN", "header": "Authorization", "prefix": "Bearer "}}


def db_snapshot_values(db: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    tables = db_rows(
        db, "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
    )
    return [(t["table_name"], db_rows(db, f'SELECT * FROM "{t["table_name"]}"')) for t in tables]


def db_bytes(h: Harness) -> bytes:
    """The database file and its -wal and -shm companions, as stored on disk (PostgreSQL: every stored value)."""
    if not h.database.is_sqlite:
        values = [
            value for _, rows in db_snapshot_values(h.database) for row in rows for value in row.values()
        ]
        return "\n".join(str(v) for v in values).encode()
    paths = [
        h.db_path,
        h.db_path.with_name(h.db_path.name + "-wal"),
        h.db_path.with_name(h.db_path.name + "-shm"),
    ]
    return b"".join(path.read_bytes() for path in paths if path.exists())


def text_of(result: CallToolResult) -> str:
    content = " ".join(getattr(block, "text", "") for block in result.content)
    return content + json.dumps(result.structured_content)


@pytest.mark.both_engines
async def test_a_canary_credential_reaches_the_provider_and_appears_nowhere_else(
    tmp_path: Path, fake: FakeProvider, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    canary = f"canary-{uuid.uuid4()}"
    # The provider echoes the credential everywhere it can: a header, the body, an error, a Location.
    fake.script(
        "job_0001",
        [
            Step(
                body={"state": "running", "echo": f"Bearer {canary}"},
                headers={"X-Request-Id": f"req-{canary}"},
            ),
            failed(f"invalid token Bearer {canary}"),
        ],
    )
    fake.script("leaky", [http(302, headers={"Location": f"http://127.0.0.1:9/steal/{canary}?t={canary}"})])
    h = make_harness(tmp_path, fake, table=WITH_AUTH, environ={"ACME_TOKEN": canary})
    outputs: list[str] = []
    async with h.client() as client:

        async def call(name: str, args: dict[str, Any]) -> CallToolResult:
            result = await client.call_tool(name, args)
            outputs.append(text_of(result))
            return result

        started = view(
            await call("start_operation", {"provider": "acme", "operation_id": "op-c", "submit": {"n": 1}})
        )
        assert started["provider_job_id"] == "job_0001"
        first = view(await call("check_status", {"operation_id": "op-c", "wait_seconds": 30}))
        assert first["provider_request_id"] == "req-[redacted]"
        ended = view(await call("check_status", {"operation_id": "op-c", "wait_seconds": 30}))
        assert ended["error"] == "invalid token Bearer [redacted]"
        await call(
            "start_operation", {"provider": "acme", "operation_id": "op-l", "provider_job_id": "leaky"}
        )
        redirected = view(await call("check_status", {"operation_id": "op-l", "wait_seconds": 30}))
        assert redirected["stop_reason"] == "integration_failure"
        conflict = await call(
            "start_operation", {"provider": "acme", "operation_id": "op-c", "submit": {"n": 2}}
        )
        assert "different provider, job or payload" in error_text(conflict)
        await call("get_operation", {"operation_id": "op-c"})
        await call("list_operations", {})
        for uri in ("pollwarden://operations/op-c", "pollwarden://operations/op-c/audit"):
            outputs.append(str(await client.read_resource(uri)))
        while_open = db_bytes(h)

    sent = fake.log()
    assert len(sent) == 4
    assert all(entry["headers"]["authorization"] == f"Bearer {canary}" for entry in sent)

    exported = io.StringIO()
    assert export_jsonl(h.db_path, exported) > 0
    captured = capsys.readouterr()
    logged = caplog.text + " ".join(repr(r.args) + str(r.exc_info) for r in caplog.records)
    needle = canary.encode()
    assert needle not in while_open
    assert needle not in db_bytes(h)
    for where, text in {
        "tool output": "\n".join(outputs),
        "audit export": exported.getvalue(),
        "logs": logged,
        "stdout/stderr": captured.out + captured.err,
    }.items():
        assert canary not in text, f"the canary leaked into the {where}"
    assert "[redacted]" in "\n".join(outputs)


async def test_a_missing_credential_is_a_clear_error_at_start_with_nothing_sent_or_recorded(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake, table=WITH_AUTH, environ={})
    async with h.client() as client:
        for args in ({"provider_job_id": "j1"}, {"submit": {"n": 1}}):
            result = await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": "op-m", **args}
            )
            text = error_text(result)
            assert "ACME_TOKEN" in text
            assert "environment variable" in text
        listed = view(await client.call_tool("list_operations", {}))
    assert listed["count"] == 0
    assert fake.log() == []


async def test_a_credential_with_a_line_break_is_refused_without_showing_its_value(
    tmp_path: Path, fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    canary = f"canary-{uuid.uuid4()}"
    h = make_harness(tmp_path, fake, table=WITH_AUTH, environ={"ACME_TOKEN": f"{canary}\r\nX-Evil: 1"})
    async with h.client() as client:
        result = await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-n", "provider_job_id": "j1"}
        )
    text = error_text(result)
    assert "ACME_TOKEN" in text
    assert "line break" in text
    assert canary not in text
    assert canary not in caplog.text
    assert fake.log() == []


def _spellings_absent(secret: str, text: str) -> list[str]:
    """Which recognisable part of `secret` survives in `text`, in any spelling (empty when none)."""
    found: list[str] = []
    core = secret.split("/")[1].split("+")[0]  # the uuid: unchanged by JSON escaping or percent-encoding
    if core in text:
        found.append("the credential (raw, JSON-escaped or percent-encoded)")
    for blob in (secret, f"user:{secret}"):
        encoded = base64.b64encode(blob.encode()).decode()
        if encoded[8:-8] in text or encoded[8:-8].translate(str.maketrans("+/", "-_")) in text:
            found.append(f"base64 of {blob[:5]}…")
    return found


@pytest.mark.both_engines
async def test_an_echoed_credential_is_redacted_in_every_spelling_everywhere(
    tmp_path: Path, fake: FakeProvider, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = f"sk/{uuid.uuid4()}+Zz9"
    escaped = secret.replace("/", "\\/").replace("+", "\\u002B")  # valid JSON, not what json.dumps writes
    percent = quote(secret, safe="")
    basic = base64.b64encode(f"user:{secret}".encode()).decode()
    fake.script(
        "echo1",
        [
            Step(
                raw_body_text=json.dumps(
                    {"state": "running", "seen": f"percent {percent}", "auth": f"Basic {basic}"}
                ),
                headers={"X-Request-Id": f"req-{percent}"},
            ),
            Step(raw_body_text='{"state": "failed", "error": "bad token ' + escaped + '"}'),
        ],
    )
    fake.script(
        "echo2",
        [
            Step(
                raw_body_text='{"state": "succeeded", "result_url": "https://files.example/x?t='
                + escaped
                + "&b="
                + basic.replace("/", "\\/")
                + '"}'
            )
        ],
    )
    h = make_harness(tmp_path, fake, table=WITH_AUTH, environ={"ACME_TOKEN": secret})
    outputs: list[str] = []
    async with h.client() as client:
        for job in ("echo1", "echo2"):
            await client.call_tool(
                "start_operation", {"provider": "acme", "operation_id": f"op-{job}", "provider_job_id": job}
            )
        for _ in range(2):
            outputs.append(
                text_of(
                    await client.call_tool("check_status", {"operation_id": "op-echo1", "wait_seconds": 30})
                )
            )
        ended = view(await client.call_tool("get_operation", {"operation_id": "op-echo1"}))
        assert ended["stop_reason"] == "provider_failure"
        assert "[redacted]" in str(ended["error"])
        outputs.append(
            text_of(await client.call_tool("check_status", {"operation_id": "op-echo2", "wait_seconds": 30}))
        )
        fetched = await client.call_tool("fetch_result", {"operation_id": "op-echo2"})
        assert view(fetched)["decision"] == "done"
        outputs.append(text_of(fetched))
        for uri in ("pollwarden://operations/op-echo1/audit", "pollwarden://operations/op-echo2"):
            outputs.append(str(await client.read_resource(uri)))
    exported = io.StringIO()
    export_jsonl(h.db_path, exported)
    captured = capsys.readouterr()
    logged = caplog.text + " ".join(repr(r.args) for r in caplog.records)
    assert len(fake.status_requests("echo1")) == 2
    for where, text in {
        "tool output": "\n".join(outputs),
        "database": db_bytes(h).decode("utf-8", "replace"),
        "audit export": exported.getvalue(),
        "logs": logged,
        "stdout/stderr": captured.out + captured.err,
    }.items():
        assert _spellings_absent(secret, text) == [], f"the credential leaked into the {where}"


async def test_the_database_drivers_debug_log_never_prints_sql_parameters(
    tmp_path: Path, fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.script("sqlp", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await client.call_tool(
            "start_operation",
            {"provider": "acme", "operation_id": "op-sql-canary", "provider_job_id": "sqlp"},
        )
    driver = [r for r in caplog.records if r.name.startswith("aiosqlite") and r.levelno < logging.INFO]
    assert driver == []
    assert "INSERT" not in caplog.text


async def test_a_non_ascii_credential_is_a_configuration_error_that_shows_none_of_it_and_costs_nothing(
    tmp_path: Path, fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "tök€n-4f9c2a71"
    fake.script("na1", [pending("running")])
    good = make_harness(tmp_path, fake, table=WITH_AUTH, environ={"ACME_TOKEN": "plain-ascii-token"})
    async with good.client() as client:
        await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-na1", "provider_job_id": "na1"}
        )
    # The same database under a server whose credential cannot be sent in a header.
    bad = make_harness(tmp_path, fake, table=WITH_AUTH, environ={"ACME_TOKEN": secret}, clock=good.clock)
    async with bad.client() as client:
        started = await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-na2", "provider_job_id": "na2"}
        )
        checked = await client.call_tool("check_status", {"operation_id": "op-na1", "wait_seconds": 30})
        after = view(await client.call_tool("get_operation", {"operation_id": "op-na1"}))
        listed = view(await client.call_tool("list_operations", {}))
    for result in (started, checked):
        text = error_text(result)
        assert "ACME_TOKEN" in text
        assert "printable ASCII" in text
        for fragment in ("ö", "€", "4f9c2a71", "position", "codec"):
            assert fragment not in text
    assert listed["count"] == 1  # op-na2 was never recorded
    assert (after["status_requests_used"], after["transport_failures_used"]) == (0, 0)
    assert fake.log() == []
    for fragment in ("ö", "€", "4f9c2a71"):
        assert fragment not in caplog.text


def _entities(text: str, style: str) -> str:
    """`text` as HTML entities: decimal (`&#115;`), hex (`&#X73`, no semicolon) or named where one exists."""
    if style == "decimal":
        return "".join(f"&#{ord(c)};" for c in text)
    if style == "hex":
        return "".join(f"&#X{ord(c):x}" for c in text)
    return text.replace("/", "&sol;").replace("+", "&plus;").replace("-", "&#45;")


async def test_an_echoed_credential_as_html_entities_or_in_another_case_is_redacted(
    tmp_path: Path, fake: FakeProvider
) -> None:
    secret = f"sk/{uuid.uuid4()}+Zz9"
    echoes = {
        "decimal": _entities(secret, "decimal"),
        "hex": _entities(secret, "hex"),
        "named": _entities(secret, "named"),
        "upper": secret.upper(),
        "mixed": "".join(c.upper() if i % 2 else c for i, c in enumerate(secret)),
    }
    fake.script(
        "html",
        [Step(raw_body_text=json.dumps({"state": "failed", "error": " | ".join(echoes.values())}))],
    )
    h = make_harness(tmp_path, fake, table=WITH_AUTH, environ={"ACME_TOKEN": secret})
    async with h.client() as client:
        await client.call_tool(
            "start_operation", {"provider": "acme", "operation_id": "op-html", "provider_job_id": "html"}
        )
        shown = text_of(
            await client.call_tool("check_status", {"operation_id": "op-html", "wait_seconds": 30})
        )
        ended = view(await client.call_tool("get_operation", {"operation_id": "op-html"}))
    assert str(ended["error"]).count("[redacted]") == len(echoes)
    core = secret.split("/")[1].split("+")[0].lower()
    for where, text in {"tool output": shown, "database": db_bytes(h).decode("utf-8", "replace")}.items():
        readable = html.unescape(html.unescape(text)).lower()
        assert core not in readable, f"the credential reached the {where}"
