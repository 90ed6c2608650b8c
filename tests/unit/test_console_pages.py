"""The console's pages over plain HTTP: the Host check, filters and paging, the fleet's pace, the audit: the pure checks.

The checks on real files, servers and processes: tests/integration/test_console_pages.py.
"""

from __future__ import annotations

import pytest

from pollwarden.console.charts import pace_chart
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
