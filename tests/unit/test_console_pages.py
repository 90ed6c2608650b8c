"""The console's pages over plain HTTP: the Host check, filters and paging, the fleet's pace, the audit: the pure checks.

The checks on real files, servers and processes: tests/integration/test_console_pages.py.
"""

from __future__ import annotations

import pytest

from pollwarden.console.charts import pace_chart


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
