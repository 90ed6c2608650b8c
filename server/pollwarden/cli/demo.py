"""`pollwarden demo`: a small scripted provider on 127.0.0.1, the real server, a real MCP client.

Two jobs: one that queues, runs, answers once with 503 + Retry-After, then
succeeds; one that never finishes and escalates with request_budget_exhausted.
Each decision is printed as it happens, then the audit story of both.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp.client import Client

from pollwarden.audit.chain import audit_key_from_env, read_rows
from pollwarden.audit.story import render_story
from pollwarden.audit.verify import verify_chain
from pollwarden.cli.demo_provider import http, pending, running_demo_provider, succeeded
from pollwarden.config import ServerConfig
from pollwarden.store.location import DatabaseLocation
from pollwarden.surface.server import build_server, controller_factory

DEMO_TABLE = """\
name = "demo-export"
description = "The demo's fake export provider (fast schedule so the demo runs in seconds)."
base_url = "{base_url}"
status_path = "/v1/jobs/{{job_id}}"

[response]
state_field = "state"
request_id_header = "X-Request-Id"

[states]
pending = ["queued", "running"]
succeeded = ["succeeded"]
failed = ["failed"]

[success]
required_fields = ["result_url"]

[fields]
result_url = {{ type = "url", schemes = ["http", "https"] }}

[schedule]
base_delay_seconds = 0.25
max_delay_seconds = 1.0

[fleet]
max_requests_per_second = 4
burst = 2

[limits]
default_deadline_seconds = 60
max_deadline_seconds = 600
default_max_status_requests = 12
max_status_requests = 50
max_transport_failures = 3
"""


def _say(text: str) -> None:
    print(text, flush=True)


def _describe(view: dict[str, Any]) -> str:
    used = f"{view['status_requests_used']}/{view['max_status_requests']}"
    if view["status"] == "waiting":
        http_part = f"HTTP {view['last_http_status']}" if view["last_http_status"] else "no request yet"
        return (
            f"{view['outcome'] or 'started':<8} {http_part:<9} state={view['state'] or '-':<9} requests {used:<6}"
            f" next in {view['retry_after_seconds']:.2f} s ({view['delay_source']})"
        )
    return (
        f"{view['outcome'] or '':<8} HTTP {view['last_http_status']}  state={view['state'] or '-':<9} "
        f"requests {used:<6} -> {view['status']} ({view['stop_reason']})"
    )


async def _drive(client: Client, operation_id: str) -> dict[str, Any]:
    """Call check_status until waiting ends; the server paces every request."""
    while True:
        result = await client.call_tool("check_status", {"operation_id": operation_id, "wait_seconds": 10})
        view: dict[str, Any] = result.structured_content or {}
        if result.is_error or not view:
            raise RuntimeError(f"check_status failed: {result.content}")
        _say(f"  {operation_id}: {_describe(view)}")
        if view["status"] != "waiting":
            return view


def run_demo(db: str | None = None) -> int:
    """Run the demo; return an exit code."""
    with tempfile.TemporaryDirectory(prefix="pollwarden-demo-") as tmp, running_demo_provider() as fake:
        tables = Path(tmp) / "tables"
        tables.mkdir()
        (tables / "demo-export.toml").write_text(DEMO_TABLE.format(base_url=fake.base_url))
        where = DatabaseLocation.parse(db) if db else DatabaseLocation.sqlite(Path(tmp) / "demo.db")
        if where.is_sqlite:
            where = DatabaseLocation.sqlite(where.path.resolve())
        fake.script(
            "exp_71c",
            [
                pending("queued"),
                pending("running"),
                http(503, headers={"Retry-After": "1", "X-Request-Id": "req-503"}, body={"error": "busy"}),
                pending("running"),
                succeeded("exp_71c"),
            ],
        )
        fake.script("exp_stuck", [pending("running")])
        config = ServerConfig(database=where, provider_dirs=(tables,))
        _say(f"fake provider on {fake.base_url}; database {where}")
        done, stuck = anyio.run(_run_jobs, config)
        _say(
            f"\nprovider saw {fake.status_requests('exp_71c')} + {fake.status_requests('exp_stuck')} "
            f"status requests, at most {max(fake.max_in_flight('exp_71c'), fake.max_in_flight('exp_stuck'))} "
            "in flight at once"
        )
        for operation_id in ("demo-export-ok", "demo-export-stuck"):
            _say(f"\naudit story of {operation_id} (pollwarden audit show {operation_id}):")
            for line in render_story(read_rows(where, operation_id)):
                _say(f"  {line}")
        verdict = verify_chain(where, audit_key_from_env())  # the key the demo's server wrote with
        _say(f"\naudit chain: {'OK' if verdict.ok else 'BROKEN'}, {verdict.rows_checked} rows")
        ok = (
            done["status"] == "succeeded"
            and stuck["stop_reason"] == "request_budget_exhausted"
            and verdict.ok
        )
        return 0 if ok else 1


async def _run_jobs(config: ServerConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    server = build_server(controller_factory(config))
    async with Client(server) as client:
        _say("\n1) a job that queues, runs, answers 503 + Retry-After: 1 once, then succeeds")
        await client.call_tool(
            "start_operation",
            {"provider": "demo-export", "operation_id": "demo-export-ok", "provider_job_id": "exp_71c"},
        )
        done = await _drive(client, "demo-export-ok")
        _say(f"  result: {done['result']}")

        _say("\n2) a job that never finishes, with a budget of 5 status requests")
        await client.call_tool(
            "start_operation",
            {
                "provider": "demo-export",
                "operation_id": "demo-export-stuck",
                "provider_job_id": "exp_stuck",
                "max_status_requests": 5,
            },
        )
        stuck = await _drive(client, "demo-export-stuck")
        _say("\n" + "\n".join("  | " + line for line in stuck["escalation"]["message"].splitlines()))
        again = await client.call_tool("check_status", {"operation_id": "demo-export-stuck"})
        view: dict[str, Any] = again.structured_content or {}
        _say(f"  calling check_status again: outcome={view.get('outcome')}, nothing sent")

        _say("\n3) the agent asks for more; this client cannot show a prompt, so an operator decides")
        asked = await client.call_tool(
            "request_extension",
            {
                "operation_id": "demo-export-stuck",
                "extra_seconds": 120,
                "extra_status_requests": 3,
                "reason": "the export is large; give it two more minutes",
            },
        )
        answer: dict[str, Any] = asked.structured_content or {}
        _say(f"  request_extension: {answer.get('decision')}, approval {answer.get('approval_id')}")
        _say(
            "  an operator decides it in the console (pollwarden console --db DB) or with pollwarden approve; "
            "the agent's next check_status applies it"
        )
    return done, stuck


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo(None))
