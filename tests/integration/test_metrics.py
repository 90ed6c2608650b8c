"""Prometheus metrics: the database's numbers (every process's work once) and the process's own.

Each exposition is parsed with prometheus_client's own text parser, as a
Prometheus server would read it. The database half is read from a real
SQLite file or PostgreSQL schema (both engines); the HTTP half is served by
the receiver app `pollwarden webhooks` runs, on 127.0.0.1.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from harness import Harness, check, db_rows, make_harness, track, view
from pollwarden.core.records import ApprovalRecord
from pollwarden.ops.metrics import MetricsOptions, exposition
from pollwarden.store import Store, open_store
from tests.support.fake_provider import FakeProvider, http, pending, succeeded
from tests.support.ops_http import receiver_on_loopback

pytestmark = pytest.mark.anyio


def samples(text: str) -> list[Sample]:
    """Every sample of an exposition, as Prometheus's client parser reads it."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(text: str, name: str, **labels: str) -> float:
    """The one sample called `name` with exactly these labels (fails when absent)."""
    found = [s.value for s in samples(text) if s.name == name and s.labels == labels]
    assert len(found) == 1, f"{name}{labels}: {found} in\n{text}"
    return found[0]


async def scrape(h: Harness, **options: bool) -> str:
    async with open_store(h.database) as store:
        return (await exposition(store, now=h.clock.now(), options=MetricsOptions(**options))).decode()


async def ask_a_person(store: Store, operation_id: str, at: float) -> ApprovalRecord:
    record = await store.get(operation_id)
    assert record is not None
    return await store.open_approval(
        approval_id=f"ap-{operation_id}", record=record, kind="extension", request={}, at=at, ttl_seconds=3600
    )


async def test_the_database_metrics_count_operations_requests_refusals_and_approvals(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("a", [pending("running"), succeeded()])
    fake.script("b", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "a")
        await track(client, "b")
        assert (await check(client, "a", wait=20))["outcome"] == "polled"
        assert (await check(client, "b", wait=20))["outcome"] == "polled"
        assert (await check(client, "b"))["outcome"] == "not_yet"  # refused: too early
        assert (await check(client, "a", wait=30))["status"] == "succeeded"
    async with open_store(h.database) as store:
        await ask_a_person(store, "op-b", h.clock.now())
    h.clock.advance(600)  # b's next check is long past: its agent stopped asking
    text = await scrape(h)
    assert value(text, "pollwarden_database_up") == 1
    assert value(text, "pollwarden_operations", status="succeeded", stop_reason="succeeded") == 1
    assert value(text, "pollwarden_operations", status="waiting", stop_reason="") == 1
    assert value(text, "pollwarden_status_requests_total", provider="acme") == 3
    assert value(text, "pollwarden_refused_calls_total", provider="acme") == 1
    assert value(text, "pollwarden_approvals_pending") == 1
    assert value(text, "pollwarden_approvals_pending_oldest_age_seconds") == 600
    assert value(text, "pollwarden_operations_overdue") == 1
    assert value(text, "pollwarden_operations_overdue_max_seconds") > 500


async def test_refusals_already_summarized_in_the_audit_still_count(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("r", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "r")
        await check(client, "r", wait=20)
        for _ in range(3):
            await check(client, "r")
    # The server's store wrote the three refusals as one summary row when it closed.
    assert db_rows(h.db_path, "SELECT refused_count FROM operations") == [{"refused_count": 0}]
    [summary] = db_rows(h.db_path, "SELECT kind FROM audit WHERE kind = 'not_yet_summary'")
    assert summary["kind"] == "not_yet_summary"
    text = await scrape(h)
    assert value(text, "pollwarden_refused_calls_total", provider="acme") == 3


async def test_principals_appear_only_when_the_operator_enables_them(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("p", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "p")
    plain = await scrape(h)
    assert "local" not in {v for s in samples(plain) for v in s.labels.values()}
    assert "op-p" not in plain  # no operation ids as labels
    assert "principal" not in plain  # no principals unless enabled
    named = await scrape(h, principals=True)
    assert value(named, "pollwarden_operations_by_principal", principal="local", status="waiting") == 1


async def test_the_process_measures_checks_provider_requests_and_refusals(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("s", [http(503), pending("running")])
    h = make_harness(tmp_path, fake)
    before = await scrape(h)

    def count(text: str, name: str, **labels: str) -> float:
        found = [s.value for s in samples(text) if s.name == name and s.labels == labels]
        return found[0] if found else 0.0

    async with h.client() as client:
        await track(client, "s")
        await check(client, "s", wait=20)  # the provider answers 503
        await check(client, "s")  # too early: refused
    after = await scrape(h)
    requests = "pollwarden_provider_request_duration_seconds_count"
    labels = {"provider": "acme", "method": "GET"}
    assert (
        count(after, requests, **labels, status_class="5xx")
        - count(before, requests, **labels, status_class="5xx")
        == 1
    )
    checks = "pollwarden_check_status_duration_seconds_count"
    assert count(after, checks, outcome="polled") - count(before, checks, outcome="polled") == 1
    assert count(after, checks, outcome="not_yet") - count(before, checks, outcome="not_yet") == 1
    refused = "pollwarden_refusals_total"
    assert count(after, refused, reason="not_yet") - count(before, refused, reason="not_yet") == 1
    db = "pollwarden_db_transaction_duration_seconds_count"
    engine = h.database.engine.value
    assert count(after, db, engine=engine) > count(before, db, engine=engine)


async def test_the_webhook_receiver_serves_metrics_that_parse_and_refuses_a_foreign_host(
    tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script("w", [pending("running")])
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        view(await client.call_tool("start_operation", {"provider": "acme", "provider_job_id": "w"}))
    async with receiver_on_loopback(h) as web:
        answer = await web.get("/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert value(answer.text, "pollwarden_operations", status="waiting", stop_reason="") == 1
        foreign = await web.get("/metrics", headers={"Host": "evil.example"})
        assert foreign.status_code == 421


def family(name: str) -> str:
    """A sample's metric family (a histogram's buckets, a counter's _total)."""
    return re.sub(r"_(bucket|count|sum|total)$", "", name)


async def test_every_metric_the_dashboard_and_the_alerts_query_is_one_pollwarden_exposes(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = make_harness(tmp_path, fake)
    text = await scrape(h)
    exposed = {family(name) for name in re.findall(r"^# TYPE (\S+)", text, flags=re.MULTILINE)}
    root = Path(__file__).resolve().parents[2]
    dashboard = json.loads((root / "deploy/grafana/pollwarden.json").read_text())
    queried = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queried.append((root / "deploy/prometheus/alerts.yml").read_text())
    used = {family(name) for expr in queried for name in re.findall(r"\bpollwarden_[a-z_]+", expr)}
    assert used, "the dashboard queries no pollwarden metric"
    assert used <= exposed, f"not exposed: {sorted(used - exposed)}"


@pytest.mark.sqlite_only
async def test_the_scrape_reads_the_audits_refusal_summaries_through_their_own_index(tmp_path: Path) -> None:
    from pollwarden.store.browse import summarized_refusals_sql

    db = tmp_path / "pollwarden.db"
    async with open_store(db):
        pass
    plan = db_rows(db, "EXPLAIN QUERY PLAN " + summarized_refusals_sql("json_extract(a.payload, '$.count')"))
    assert any("audit_refusal_summaries" in str(row["detail"]) for row in plan), plan
