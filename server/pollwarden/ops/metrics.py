"""Prometheus metrics: what the database holds (every process's work, counted once) and this process's own.

Why ``prometheus-client`` rather than the OpenTelemetry SDK with its Prometheus
exporter: the database half is read at scrape time (a custom collector over one
snapshot), which prometheus-client supports directly; the OTel SDK would need
observable gauges polled on its own schedule from sync callbacks, plus the SDK,
the exporter and its HTTP server, for the same text. Traces stay on
``opentelemetry-api`` (`pollwarden.ops.observe`).

At each scrape `exposition` reads one `MetricsSnapshot` from the store (a few
aggregate statements; see `pollwarden.store.browse`) and writes it beside the
process's instruments (`pollwarden.ops.observe.PROCESS_REGISTRY`). Every process
sharing a database reports the same database numbers: in PromQL take ``max``
across instances, never ``sum``. Labels are statuses, stop reasons and provider
table names; principals (``owner``) only with ``principals=True``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pollwarden.core.errors import ConfigError, StoreError
from pollwarden.ops.observe import PROCESS_REGISTRY, metrics_available
from pollwarden.store import MetricsSnapshot, Store
from pollwarden.store.browse import OVERDUE_AFTER_SECONDS

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_METRICS",
    "INSTALL_HINT",
    "MetricsOptions",
    "add_metrics_arguments",
    "exposition",
    "metrics_options_from",
    "require_metrics",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
INSTALL_HINT = "from a clone: .venv/bin/pip install -e '.[metrics]' (or pip install 'pollwarden[metrics]')"


@dataclass(frozen=True)
class MetricsOptions:
    """What a /metrics endpoint shows beyond the defaults."""

    principals: bool = False  # operations per principal (owner names as label values)


DEFAULT_METRICS = MetricsOptions()


def require_metrics() -> None:
    """Refuse a metrics command or flag without prometheus-client, saying how to install it."""
    if not metrics_available():
        raise ConfigError(f"metrics need the optional extra [metrics] (prometheus-client): {INSTALL_HINT}")


class _SnapshotCollector:
    """The database's numbers, as Prometheus metric families (built per scrape, never registered globally)."""

    def __init__(self, snapshot: MetricsSnapshot | None, now: float) -> None:
        self.snapshot = snapshot
        self.now = now

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        up = GaugeMetricFamily(
            "pollwarden_database_up", "1 when the last scrape could read the database, else 0."
        )
        up.add_metric([], 0.0 if self.snapshot is None else 1.0)
        yield up
        snap = self.snapshot
        if snap is None:
            return
        ops = GaugeMetricFamily(
            "pollwarden_operations",
            "Operations in the database by status and stop reason (empty while waiting).",
            labels=["status", "stop_reason"],
        )
        for (status, reason), count in sorted(snap.operations.items()):
            ops.add_metric([status, reason], count)
        yield ops
        pending = GaugeMetricFamily("pollwarden_approvals_pending", "Approvals waiting for a person.")
        pending.add_metric([], snap.pending_approvals)
        yield pending
        oldest = GaugeMetricFamily(
            "pollwarden_approvals_pending_oldest_age_seconds",
            "How long the oldest pending approval has waited (0 with none).",
        )
        oldest.add_metric([], _age(self.now, snap.oldest_pending_asked_at))
        yield oldest
        overdue = GaugeMetricFamily(
            "pollwarden_operations_overdue",
            f"Waiting operations whose next allowed check passed more than {OVERDUE_AFTER_SECONDS:g} s ago "
            "(their agent stopped asking).",
        )
        overdue.add_metric([], snap.overdue)
        yield overdue
        most = GaugeMetricFamily(
            "pollwarden_operations_overdue_max_seconds",
            "How long ago the most overdue waiting operation's next allowed check passed (0 with none).",
        )
        most.add_metric([], _age(self.now, snap.most_overdue_next_check_at))
        yield most
        requests = CounterMetricFamily(
            "pollwarden_status_requests",
            "Status requests counted against operations' budgets, per provider (all processes).",
            labels=["provider"],
        )
        for provider, count in sorted(snap.status_requests.items()):
            requests.add_metric([provider], count)
        yield requests
        refusals = CounterMetricFamily(
            "pollwarden_refused_calls",
            "check_status calls refused without a request (too early, already stopped), per provider "
            "(all processes).",
            labels=["provider"],
        )
        for provider, count in sorted(snap.refusals.items()):
            refusals.add_metric([provider], count)
        yield refusals
        if snap.by_principal is not None:
            owners = GaugeMetricFamily(
                "pollwarden_operations_by_principal",
                "Operations by the principal that started them and status (enabled by the operator).",
                labels=["principal", "status"],
            )
            for (owner, status), count in sorted(snap.by_principal.items()):
                owners.add_metric([owner, status], count)
            yield owners


def _age(now: float, since: float | None) -> float:
    return 0.0 if since is None else max(0.0, now - since)


class _Forward:
    """Yields another registry's metrics (the process's instruments) inside a per-scrape registry."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        yield from self.registry.collect()


async def exposition(store: Store | None, *, now: float, options: MetricsOptions = DEFAULT_METRICS) -> bytes:
    """The text exposition of one scrape: the database's snapshot (if it can be read) and this process's."""
    from prometheus_client import CollectorRegistry, generate_latest

    snapshot: MetricsSnapshot | None = None
    if store is not None:
        try:
            if await store.not_ready() is None:  # a deleted SQLite file still reads: not up
                snapshot = await store.metrics_snapshot(now=now, principals=options.principals)
        except StoreError:
            snapshot = None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshot, now))  # pyright: ignore[reportArgumentType]
    if PROCESS_REGISTRY is not None:
        registry.register(_Forward(PROCESS_REGISTRY))  # pyright: ignore[reportArgumentType]
    return generate_latest(registry)


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-principals``: the flag every server with /metrics shares."""
    parser.add_argument(
        "--metrics-principals",
        action="store_true",
        help="/metrics also counts operations per principal (their names become label values; off by default)",
    )


def metrics_options_from(args: argparse.Namespace) -> MetricsOptions:
    """The /metrics options from `add_metrics_arguments`' flag."""
    return MetricsOptions(principals=bool(getattr(args, "metrics_principals", False)))
