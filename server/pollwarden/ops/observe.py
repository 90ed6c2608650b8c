"""What this process measures about its own work: Prometheus instruments and OpenTelemetry spans.

Metrics use ``prometheus-client`` (the optional extra ``pollwarden[metrics]``):
without it every function here records nothing, so the embedded default stays
light. Spans use ``opentelemetry-api`` only (already a dependency of the MCP
SDK): without an SDK configured (``opentelemetry-instrument``, or an exporter
set up by the deployment) they are no-ops. The process's instruments live in
`PROCESS_REGISTRY`; `pollwarden.ops.metrics` serves them beside what it reads from
the database. Labels are closed vocabularies (outcomes, status classes, engine
names) or provider table names: never an operation id, a job id or a token.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

__all__ = [
    "PROCESS_REGISTRY",
    "approval_decided",
    "check_span",
    "db_retry",
    "db_transaction",
    "metrics_available",
    "provider_request",
    "refused",
    "tracer",
    "webhook_event",
]

tracer = trace.get_tracer("pollwarden")

# Seconds: a check answers at once, or waits up to 50 s; a provider request is bounded at 20 s.
_CHECK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 60)
_REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20)
_DB_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


class _Instruments:
    """The process's instruments, in their own registry (created only when prometheus-client is there)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram
        from prometheus_client.gc_collector import GCCollector
        from prometheus_client.platform_collector import PlatformCollector
        from prometheus_client.process_collector import ProcessCollector

        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        r = self.registry
        self.check = Histogram(
            "pollwarden_check_status_duration_seconds",
            "Time one check_status call took, by what it answered (polled, not_yet, stopped, error).",
            ["outcome"],
            buckets=_CHECK_BUCKETS,
            registry=r,
        )
        self.request = Histogram(
            "pollwarden_provider_request_duration_seconds",
            "Time one request to a provider took, by provider table, method and status class "
            "(2xx…5xx, or the transport failure).",
            ["provider", "method", "status_class"],
            buckets=_REQUEST_BUCKETS,
            registry=r,
        )
        self.refusals = Counter(
            "pollwarden_refusals",
            "check_status calls refused without a request, by reason (not_yet, paced, needs_person, stopped).",
            ["reason"],
            registry=r,
        )
        self.webhooks = Counter(
            "pollwarden_webhook_events",
            "Webhook requests by what became of them (woken, not_woken, replayed, unknown_job, ignored_event_type, "
            "unreadable, refused_401, …).",
            ["result"],
            registry=r,
        )
        self.approvals = Counter(
            "pollwarden_approval_decisions",
            "Approval decisions a person made, by channel (cli, console, elicitation, tool-confirmation) "
            "and decision.",
            ["channel", "decision"],
            registry=r,
        )
        self.db_seconds = Histogram(
            "pollwarden_db_transaction_duration_seconds",
            "Time one write transaction held its connection, by engine (sqlite, postgres).",
            ["engine"],
            buckets=_DB_BUCKETS,
            registry=r,
        )
        self.db_retries = Counter(
            "pollwarden_db_retries",
            "Statements retried on a fresh connection after the old one was lost, by engine.",
            ["engine"],
            registry=r,
        )


def _load() -> _Instruments | None:
    try:
        return _Instruments()
    except ImportError:
        return None


_instruments = _load()
PROCESS_REGISTRY: Any = None if _instruments is None else _instruments.registry


def metrics_available() -> bool:
    """Whether prometheus-client is installed (the extra ``pollwarden[metrics]``)."""
    return _instruments is not None


def refused(reason: str) -> None:
    """One check_status call answered without a request, for `reason`."""
    if _instruments is not None:
        _instruments.refusals.labels(reason).inc()


def webhook_event(result: str) -> None:
    """One webhook request ended as `result`."""
    if _instruments is not None:
        _instruments.webhooks.labels(result).inc()


def approval_decided(channel: str, *, approve: bool) -> None:
    """A person decided an approval through `channel`."""
    if _instruments is not None:
        _instruments.approvals.labels(channel, "approved" if approve else "denied").inc()


def db_retry(engine: str) -> None:
    """A statement was sent again after a lost connection."""
    if _instruments is not None:
        _instruments.db_retries.labels(engine).inc()


def db_transaction(engine: str) -> TimedTransaction:
    """Time one write transaction (whatever its end: commit or rollback); `with` or `async with`."""
    return TimedTransaction(engine)


class TimedTransaction:
    """Observes the time between entering and leaving, as a sync or an async context manager."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if _instruments is not None:
            _instruments.db_seconds.labels(self.engine).observe(time.perf_counter() - self.started)

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


def status_class(status: int | None, failure: str | None) -> str:
    """``2xx`` … ``5xx`` for an answer; the failure's kind (timeout, connection_error, …) for none."""
    if status is None:
        return failure or "no_answer"
    return f"{status // 100}xx"


@contextmanager
def provider_request(provider: str, method: str, url: str) -> Generator[ProviderRequest]:
    """A span (OpenTelemetry HTTP client conventions) and a latency observation for one provider request.

    `url` must already have any credential redacted; headers never become attributes.
    """
    parts = urlsplit(url)
    attributes: dict[str, str | int] = {
        "http.request.method": method,
        "url.full": url,
        "server.address": parts.hostname or "",
        "pollwarden.provider": provider,
    }
    if parts.port is not None:
        attributes["server.port"] = parts.port
    with tracer.start_as_current_span(method, kind=trace.SpanKind.CLIENT, attributes=attributes) as span:
        request = ProviderRequest(span)
        started = time.perf_counter()
        try:
            yield request
        finally:
            if _instruments is not None:
                _instruments.request.labels(provider, method, request.status_class).observe(
                    time.perf_counter() - started
                )


class ProviderRequest:
    """What became of one provider request, set by the caller inside `provider_request`."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.status_class = "no_answer"

    def answered(self, status: int) -> None:
        """The provider answered with HTTP `status`."""
        self.status_class = status_class(status, None)
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_attribute("error.type", str(status))
            self.span.set_status(Status(StatusCode.ERROR))

    def failed(self, kind: str) -> None:
        """No usable answer: `kind` is the transport failure (timeout, connection_error, …)."""
        self.status_class = kind
        self.span.set_attribute("error.type", kind)
        self.span.set_status(Status(StatusCode.ERROR))


@contextmanager
def check_span() -> Generator[CheckObservation]:
    """A span for one check_status decision and its latency by outcome (set by the caller)."""
    with tracer.start_as_current_span("pollwarden.decision", kind=trace.SpanKind.INTERNAL) as span:
        seen = CheckObservation(span)
        started = time.perf_counter()
        try:
            yield seen
        except BaseException as exc:
            seen.outcome = seen.outcome or "error"
            span.set_attribute("error.type", type(exc).__name__)
            raise
        finally:
            if _instruments is not None:
                _instruments.check.labels(seen.outcome or "error").observe(time.perf_counter() - started)


class CheckObservation:
    """The decision one check_status reached, put on its span."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.outcome: str | None = None

    def decided(
        self, *, outcome: str, status: str, stop_reason: str | None, delay_source: str | None, provider: str
    ) -> None:
        """Record the decision (outcome, stop reason, delay source) on the span."""
        self.outcome = outcome
        span = self.span
        span.set_attribute("pollwarden.outcome", outcome)
        span.set_attribute("pollwarden.status", status)
        span.set_attribute("pollwarden.provider", provider)
        if stop_reason:
            span.set_attribute("pollwarden.stop_reason", stop_reason)
        if delay_source:
            span.set_attribute("pollwarden.delay_source", delay_source)
