"""What `tools/list` tells an agent: argument descriptions, the loaded tables, compact output schemas.

Read over the SDK's real in-process client; results are validated against
the published (compacted) output schemas with jsonschema, as a client may.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcp.client import Client

from harness import check, make_harness, track
from pollwarden.surface.server import build_server, controller_factory
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import write_table

# SQLite only: the subject is the tool schemas (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

# Before the output schemas were compacted, tools/list was 71,156 bytes (62,252 of them output schemas).
MAX_TOOLS_LIST_BYTES = 50_000


def listed(tools: Any) -> dict[str, dict[str, Any]]:
    dumped = tools.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {tool["name"]: tool for tool in dumped["tools"]}


async def test_arguments_are_described_and_the_provider_argument_names_the_loaded_tables(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    write_table(h.tables_dir, h.table)
    server = build_server(controller_factory(h.config(), clock=h.clock), provider_names=["acme", "zeta-jobs"])
    async with Client(server) as client:
        tools = listed(await client.list_tools())
    wait = tools["check_status"]["inputSchema"]["properties"]["wait_seconds"]
    limit = tools["list_operations"]["inputSchema"]["properties"]["limit"]
    provider = tools["start_operation"]["inputSchema"]["properties"]["provider"]
    assert "wait" in wait["description"]
    assert "newest first" in limit["description"]
    assert "'acme', 'zeta-jobs'" in provider["description"]
    assert "openai-batch" not in provider["description"]  # only what this server loaded


async def test_tools_list_is_compact_and_results_still_match_their_output_schemas(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("c", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        tools = listed(await client.list_tools())
        started = await track(client, "c")
        checked = await check(client, "c", wait=20)
        listing = await client.call_tool("list_operations", {})
    size = len(json.dumps({"tools": list(tools.values())}, separators=(",", ":")))
    assert size < MAX_TOOLS_LIST_BYTES, size
    every = json.dumps(tools)
    assert '"title"' not in json.dumps([t["outputSchema"] for t in tools.values() if "outputSchema" in t])
    jsonschema.validate(started, tools["start_operation"]["outputSchema"])
    jsonschema.validate(checked, tools["check_status"]["outputSchema"])
    jsonschema.validate(listing.structured_content, tools["list_operations"]["outputSchema"])
    # Each field's prose is said once, in get_operation's schema; the others point there.
    reference = tools["get_operation"]["outputSchema"]["properties"]["retry_after_seconds"]["description"]
    assert every.count(json.dumps(reference)) == 1
    assert "get_operation's output schema" in tools["check_status"]["outputSchema"]["description"]
