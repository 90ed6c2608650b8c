"""The console's pages over plain HTTP: the Host check, filters and paging, the fleet's pace, the audit: the pure checks.

The checks on real files, servers and processes: tests/integration/test_console_pages.py.
"""

from __future__ import annotations

import json

import pytest

from harness import operation_record
from pollwarden.audit.chain import AuditRow
from pollwarden.console.charts import DELAY_SOURCE_WORDS, legend_shapes, pace_chart, timeline
from pollwarden.console.reading import deadline_words, next_check_words, relative, span, summary
from pollwarden.core.timefmt import iso
from pollwarden.core.vocabulary import Status
from pollwarden.store.browse import first_seq_at_or_after, search_sync


def test_the_pace_chart_averages_each_minute_and_finds_the_busiest_second() -> None:
    now = 10_000.0
    burst = [now - 100 + 0.1 * i for i in range(5)]  # 5 requests within half a second
    spread = [now - 3000 + 20 * i for i in range(3)]  # 3 requests 20 s apart, in one minute
    old = [now - 4000]  # before the hour: not counted
    chart = pace_chart([*burst, *spread, *old], now=now, pace=2.0, burst=3)
    assert chart.total == 8
    assert chart.busiest_second == 5
    assert [bar.count for bar in chart.bars if bar.count] == [3, 5]
    assert chart.bars[-2].rate == pytest.approx(5 / 60)
    assert chart.pace_y < chart.bottom  # the pace line is drawn inside the plot


def test_the_pace_window_starts_at_the_first_audit_row_written_at_or_after_it_found_in_few_probes() -> None:
    written = {seq: f"2026-01-01T00:{seq // 60:02d}:{seq % 60:02d}.000Z" for seq in range(1, 1001)}
    probes: list[int] = []

    def first_at_or_after(seq: int) -> str | None:
        probes.append(seq)
        return written.get(seq)

    for since, expected in (
        ("2025-12-31T23:59:59.000Z", 1),  # the whole chain is in the window
        ("2026-01-01T00:05:00.000Z", 300),
        ("2026-01-01T00:05:00.001Z", 301),
        ("2026-01-01T00:16:40.000Z", 1000),
        ("2026-01-01T01:00:00.000Z", 1001),  # nothing written since
    ):
        probes.clear()
        assert search_sync(first_seq_at_or_after(since, 1, 1000), first_at_or_after) == expected
        assert len(probes) <= 11  # log2(1000) probes, never a scan


def _polled(at: float, state: str, *, source: str = "local_backoff", http: int = 200) -> AuditRow:
    payload = {"http_status": http, "state": state, "delay_source": source}
    text = json.dumps(payload)
    return AuditRow(1, "op", iso(at) or "", "polled", text, "", "", False, payload_obj=payload)


def test_times_are_said_as_people_say_them() -> None:
    assert [span(s) for s in (0.4, 12, 119, 120, 3599, 7200, 7500, 172800, 180000)] == [
        "0 s",
        "12 s",
        "119 s",
        "2 min",
        "59 min",
        "2 h",
        "2 h 5 min",
        "2 d",
        "2 d 2 h",
    ]
    assert relative(1012, 1000) == "in 12 s"
    assert relative(820, 1000) == "3 min ago"
    assert relative(1000.2, 1000) == "now"


def test_a_waiting_operation_says_when_it_is_next_checked_whether_the_agent_is_late_and_if_its_deadline_passed() -> (
    None
):
    waiting = operation_record(next_check_at=1012.0, deadline_at=1300.0)
    assert next_check_words(waiting, 1000) == "next check in 12 s"
    assert next_check_words(waiting, 1014) == "next check due now"
    assert next_check_words(waiting, 1192) == "due 3 min ago — the agent has not checked"
    assert deadline_words(waiting, 1000) == "deadline in 5 min"
    assert deadline_words(waiting, 1308) == "deadline passed 8 s ago"
    assert "the agent's next check stops it" in summary(waiting, None, 1308)
    stopped = operation_record(status=Status.SUCCEEDED, stop_reason="succeeded", stopped_at=1100.0)
    assert next_check_words(stopped, 1000) is None
    assert summary(stopped, None, 1220) == (
        "Succeeded 2 min ago (succeeded) after 12 of 12 status requests used; acme job job-1."
    )


def test_a_run_of_one_answer_is_one_marker_and_no_two_labels_share_a_place() -> None:
    record = operation_record(status=Status.ESCALATED, stopped_at=1300.0, started_at=1000.0)
    rows = [
        _polled(1001, "queued"),
        *[_polled(1002 + i, "running") for i in range(45)],
        _polled(1050, "", http=503, source="provider_retry_after"),
        *[_polled(1051 + i, "running", source="provider_retry_after") for i in range(10)],
        *[_polled(1062 + i, f"state-{i}") for i in range(14)],  # many distinct answers close together
    ]
    chart = timeline(record, rows, now=1300)
    assert [(m.label, m.count) for m in chart.markers[:4]] == [
        ("queued", 1),
        ("running ×45", 45),
        ("503", 1),
        ("running ×10", 10),
    ]
    assert chart.markers[1].x_end is not None
    assert chart.markers[1].x_end > chart.markers[1].x
    labelled = [m for m in chart.markers if m.label]
    assert len(labelled) < len(chart.markers)  # where there is no room a label is left out (its title stays)
    boxes = [(m.label_x - len(m.label) * 3.3, m.label_x + len(m.label) * 3.3, m.label_y) for m in labelled]
    for i, (left, right, y) in enumerate(boxes):
        for other_left, other_right, other_y in boxes[i + 1 :]:
            assert y != other_y or right <= other_left or other_right <= left
    # Each reason has its own shape (drawn in the same 16×16 box), so colour is never the only difference.
    shapes = {source: d for source, _, d in legend_shapes()}
    assert set(shapes) == set(DELAY_SOURCE_WORDS)
    assert len(set(shapes.values())) == len(shapes)
