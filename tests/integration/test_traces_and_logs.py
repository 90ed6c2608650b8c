"""Spans of pollwarden's own work and JSON decision logs, read as a collector would read them.

Spans go to the OpenTelemetry SDK's in-memory exporter (the dev extra); the
server is the real one behind the SDK's in-process client, whose request
carries the caller's trace context in ``params._meta.traceparent``. Logs are
the handler `pollwarden --log-format json` installs, writing to a buffer.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harness import check, make_harness, track
from pollwarden.cli.main import log_handler
from pollwarden.ops import decision_log
from tests.support.fake_provider import FakeProvider, pending

# SQLite only: the subject is spans and logs (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

SECRET = "sk-trace-" + "b" * 40
AUTH = {"env": "ACME_TOKEN", "header": "Authorization", "prefix": "Bearer "}
_EXPORTER = InMemorySpanExporter()


class _OnlyWhileTesting(SimpleSpanProcessor):
    """Exports only while a test here runs: the provider stays set for the worker's later tests."""

    active = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.active:
            super().on_end(span)


_PROCESSOR = _OnlyWhileTesting(_EXPORTER)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once: OpenTelemetry allows one) exporting to memory."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_PROCESSOR)
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _PROCESSOR.active = True
    try:
        yield _EXPORTER
    finally:
        _PROCESSOR.active = False
        _EXPORTER.clear()


def named(found: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    [span] = [s for s in found if s.name == name]
    return span


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


async def test_a_check_makes_a_decision_span_with_a_provider_request_span_under_the_callers_trace(
    tmp_path: Path, fake: FakeProvider, spans: InMemorySpanExporter
) -> None:
    fake.script("t", [pending("running")])
    h = make_harness(tmp_path, fake, table={"auth": AUTH}, environ={"ACME_TOKEN": SECRET})
    async with h.client() as client:
        await track(client, "t")
        with trace.get_tracer("the-agent").start_as_current_span("agent step") as agent:
            assert (await check(client, "t", wait=20))["outcome"] == "polled"
    found = spans.get_finished_spans()
    tool = named(found, "tools/call check_status")
    decision = named(found, "pollwarden.decision")
    request = named(found, "GET")
    # The caller's trace continues through params._meta.traceparent into the server's tool span.
    assert tool.context.trace_id == agent.get_span_context().trace_id
    assert parent_of(decision) == tool.context.span_id
    assert parent_of(request) == decision.context.span_id
    assert decision.attributes is not None
    assert decision.attributes["pollwarden.outcome"] == "polled"
    assert decision.attributes["pollwarden.delay_source"] == "local_backoff"
    assert request.kind == trace.SpanKind.CLIENT
    assert request.attributes is not None
    assert request.attributes["http.request.method"] == "GET"
    assert request.attributes["http.response.status_code"] == 200
    assert str(request.attributes["url.full"]).startswith(fake.base_url)
    assert request.attributes["server.address"] == "127.0.0.1"
    every_value = " ".join(str(v) for s in found for v in (s.attributes or {}).values())
    assert SECRET not in every_value  # credentials never become attributes


async def test_a_stopped_operation_shows_its_stop_reason_on_the_decision_span(
    tmp_path: Path, fake: FakeProvider, spans: InMemorySpanExporter
) -> None:
    fake.script("f", [pending("failed")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "f")
        await check(client, "f", wait=20)
        assert (await check(client, "f"))["outcome"] == "stopped"
    decisions = [s for s in spans.get_finished_spans() if s.name == "pollwarden.decision"]
    last = decisions[-1].attributes
    assert last is not None
    assert (last["pollwarden.outcome"], last["pollwarden.stop_reason"]) == ("stopped", "provider_failure")


async def test_json_logs_carry_one_event_per_decision_with_the_audit_fields_and_the_principal(
    tmp_path: Path, fake: FakeProvider
) -> None:
    # The provider echoes the credential as its state: redacted before anything logs it (and an
    # unknown state stops the wait).
    fake.script("j", [pending(SECRET)])
    h = make_harness(tmp_path, fake, table={"auth": AUTH}, environ={"ACME_TOKEN": SECRET})
    buffer = io.StringIO()
    handler = log_handler(stream=buffer, json_lines=True)
    logger = logging.getLogger("pollwarden")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    decision_log.use_json(True)
    try:
        async with h.client() as client:
            await track(client, "j")
            await check(client, "j", wait=20)
            await check(client, "j")
    finally:
        decision_log.use_json(False)
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    decisions = [line for line in lines if line.get("decision") == "check_status"]
    assert [d["outcome"] for d in decisions] == ["polled", "stopped"]
    polled = decisions[0]
    assert polled["operation_id"] == "op-j"
    assert polled["principal"] == "local"
    assert polled["logger"] == "pollwarden.decisions"
    assert (polled["status_requests_used"], polled["http_status"]) == (1, 200)
    assert (polled["status"], polled["stop_reason"]) == ("escalated", "unknown_state")
    assert set(decision_log.DECISION_FIELDS) <= set(polled)
    assert SECRET not in buffer.getvalue()
    assert "[redacted]" in polled["state"]
