"""Every tool argument, swept: a call either works or is refused by naming the argument.

Hypothesis draws arguments from each tool's own input schema, as the server
lists it to the real SDK client: values inside the schema (near its bounds),
values outside it (wrong types, out of range, far too long), hostile text
(control characters, invisible format characters, unpaired surrogates, huge
numbers) and absurd times. Whatever comes in, a refused call reads as plain
language naming one of the tool's arguments, never the SDK's "Error executing
tool" framing or an internal name, and writes nothing to the database.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.client import Client

from harness import db_snapshot, make_harness, track, view
from tests.support.fake_provider import FakeProvider, pending

# Bad input is refused before the store is reached: the SQLite copy covers it (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

ERAS = [pytest.param({}, id="2026-07-28"), pytest.param({"mode": "legacy"}, id="2025-11-25")]
# Words that mean the SDK's framing, a crash or an internal name reached the agent.
LEAKS = re.compile(
    r"(?i:Error executing tool|internal error|Traceback|pydantic|\[type=|pollwarden\.|mcp\.|sqlite|\.py\b|"
    r"Exception|NoneType|object has no attribute)|[a-z]Arguments\b"
)
KNOWN_IDS = ["op-job-1", "op-stopped"]  # one waiting, one stopped (see prepare)

HOSTILE_TEXT = st.sampled_from(
    [
        "",
        " ",
        "a\x00b",
        "line\nStopped because: forged",
        "\u202eevil",  # right-to-left override
        "\ud800",  # an unpaired surrogate
        "x" * 5000,
        "😀" * 300,
        "../../etc/passwd",
        "op-job-1\r\n",
    ]
)
ABSURD_NUMBERS = st.sampled_from([0, -1, -0.0, 1e-300, 1e308, -1e308, 2**63, 2**64 + 1, 10**30, 0.5])


def rfc3339_times() -> st.SearchStrategy[str]:
    """Times from year 1 to 9999 with any offset up to ±23:59, plus near misses of the format."""
    offsets = st.one_of(
        st.just("Z"),
        st.builds(
            lambda sign, h, m: f"{sign}{h:02d}:{m:02d}",
            st.sampled_from("+-"),
            st.integers(0, 23),
            st.integers(0, 59),
        ),
        st.just(""),
    )
    return st.builds(
        lambda y, mo, d, h, mi, s, off: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{off}",
        st.sampled_from([1, 1970, 2025, 2026, 2035, 2036, 9999]) | st.integers(1, 9999),
        st.integers(1, 12),
        st.integers(1, 31),
        st.integers(0, 24),
        st.integers(0, 59),
        st.integers(0, 60),
        offsets,
    )


def _in_schema(option: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Values of one schema branch, with its bounds and just past them."""
    kind = option.get("type")
    if "enum" in option:
        return st.sampled_from(option["enum"])
    if kind in ("number", "integer"):
        edges = [
            option[k] + d
            for k in ("minimum", "maximum", "exclusiveMinimum")
            if k in option
            for d in (-1, 0, 1)
        ]
        if kind == "integer":
            return st.sampled_from([int(e) for e in edges] or [0]) | st.integers(-(2**70), 2**70)
        return st.sampled_from(edges or [0.0]) | st.floats(allow_nan=False, allow_infinity=False)
    if kind == "string":
        limit = option.get("maxLength")
        around = [limit - 1, limit, limit + 1] if limit else [0, 1]
        return st.text(max_size=40) | st.sampled_from(around).map(lambda n: "o" * n)
    if kind == "object":
        return st.dictionaries(
            st.text(max_size=8), st.none() | st.booleans() | st.integers() | st.text(max_size=10), max_size=4
        )
    if kind == "boolean":
        return st.booleans()
    return st.none()


def for_property(name: str, schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Values for one argument: in the schema, outside it, hostile, and named cases that go deep."""
    options = schema.get("anyOf") or [schema]
    inside = st.one_of([_in_schema(o) for o in options])
    outside = st.one_of(
        HOSTILE_TEXT,
        ABSURD_NUMBERS,
        st.just(None),
        st.just(True),
        st.lists(st.integers(), max_size=2),
        st.just({"nested": {"deep": [1, 2, 3]}}),
    )
    named: dict[str, st.SearchStrategy[Any]] = {
        "provider": st.sampled_from(["acme", "acme", "openai-batch", "nope", "ACME", "acme "]),
        "operation_id": st.sampled_from(KNOWN_IDS) | st.builds(lambda: f"op-new-{uuid.uuid4().hex[:8]}"),
        "provider_job_id": st.sampled_from(["job-1", "a/b", ".", "..", "%2F", "x" * 256, "x" * 257]),
        "business_deadline_at": rfc3339_times()
        | st.sampled_from(["9999-12-31T23:59:59-23:59", "now", "2026"]),
        "submit": st.just({"report": "sales"}),
        "idempotency_key": st.sampled_from(["k-1", "a b", "k" * 256, "é"]),
        "reason": st.sampled_from(["the export is large", "x" * 501]),
    }
    choices = [inside, outside]
    if name in named:
        choices = [named[name], named[name], *choices]
    return st.one_of(choices)


def valid_arguments(tool: str) -> dict[str, Any]:
    """A call of `tool` that works, so one changed argument is what decides the answer."""
    fresh = f"op-new-{uuid.uuid4().hex[:8]}"
    return {
        "start_operation": {"provider": "acme", "operation_id": fresh, "provider_job_id": "job-1"},
        "check_status": {"operation_id": KNOWN_IDS[0], "wait_seconds": 0},
        "request_extension": {
            "operation_id": KNOWN_IDS[1],
            "extra_seconds": 60,
            "extra_status_requests": 1,
            "reason": "the export is large",
        },
        "list_operations": {"limit": 5},
    }.get(tool, {"operation_id": KNOWN_IDS[1]})


@st.composite
def arguments_for(draw: st.DrawFn, tool: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """A working call with up to three arguments changed: redrawn, removed, or a stray one added."""
    properties: Mapping[str, Any] = schema.get("properties") or {}
    args = valid_arguments(tool)
    for name in draw(st.lists(st.sampled_from(sorted(properties)), max_size=3, unique=True)):
        if draw(st.integers(0, 5)) == 0:
            args.pop(name, None)
        else:
            args[name] = draw(for_property(name, properties[name]), label=name)
    if draw(st.integers(0, 9)) == 0:
        args["not_an_argument"] = draw(for_property("not_an_argument", {}))
    return args


def database_snapshot(db: Any) -> tuple[Any, ...]:
    """Everything a refused call must leave as it was."""
    return db_snapshot(db)


def assert_refusal_reads_well(tool: str, schema: Mapping[str, Any], args: dict[str, Any], text: str) -> None:
    assert text.strip(), (tool, args)
    assert len(text) <= 1000, f"{tool}({args!r}) was refused at length: {text[:300]}…"
    leak = LEAKS.search(text)
    assert leak is None, f"{tool}({args!r}) leaked {leak.group(0)!r}: {text}"
    names = set(schema.get("properties") or {}) | {"not_an_argument"}
    named = [n for n in names if re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", text)]
    assert named, f"{tool}({args!r}) was refused without naming an argument: {text}"


@pytest.mark.parametrize("era", ERAS)
@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_every_tool_call_either_works_or_is_refused_naming_its_argument_and_records_nothing(
    tmp_path: Path, fake: FakeProvider, era: dict[str, Any], data: st.DataObject
) -> None:
    fake.reset()
    fake.script("job-1", [pending("running")])
    fake.script("stopped", [pending("running")])
    h = make_harness(tmp_path / uuid.uuid4().hex, fake, table={"limits": {"default_max_status_requests": 1}})
    h.tmp.mkdir(parents=True)
    async with h.client(**era) as client:
        await prepare(client, h)
        schemas = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
        for _ in range(40):
            tool = data.draw(st.sampled_from(sorted(schemas)), label="tool")
            args = data.draw(arguments_for(tool, schemas[tool]), label=f"{tool} arguments")
            before = database_snapshot(h.db_path)
            result = await client.call_tool(tool, args)
            if result.is_error:
                text = " ".join(getattr(block, "text", "") for block in result.content)
                assert_refusal_reads_well(tool, schemas[tool], args, text)
                assert database_snapshot(h.db_path) == before, (
                    f"{tool}({args!r}) was refused but wrote: {text}"
                )
            else:
                assert isinstance(result.structured_content, dict), (tool, args)


async def prepare(client: Client, h: Any) -> None:
    """One operation still waiting, one stopped (its one-request budget used): refusals of both kinds."""
    await track(client, "job-1")
    await track(client, "stopped")
    h.clock.advance(10)
    stopped = view(await client.call_tool("check_status", {"operation_id": "op-stopped"}))
    assert stopped["stop_reason"] == "request_budget_exhausted"
