"""The console's charts as data: pure functions from records and audit rows to shapes.

The templates draw these as SVG on the server: no script, no network, text a
screen reader and a test can read (each marker has a ``<title>`` and data
attributes), and every value from a provider or an agent goes through the
templates' autoescaping like any other text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pollwarden.audit.chain import AuditRow
from pollwarden.core.records import OperationRecord
from pollwarden.core.timefmt import iso, to_datetime
from pollwarden.core.untrusted import quoted

__all__ = [
    "DELAY_SOURCE_WORDS",
    "Bar",
    "Event",
    "Marker",
    "PaceChart",
    "Tick",
    "Timeline",
    "VLine",
    "legend_shapes",
    "pace_chart",
    "timeline",
]

DELAY_SOURCE_WORDS = {
    "local_backoff": "local backoff",
    "provider_retry_after": "provider Retry-After",
    "provider_poll_hint": "provider poll hint",
    "manual_extension": "manual extension",
    "fleet_pacing": "fleet pacing",
    "provider_webhook": "provider webhook",
}

WIDTH = 960
HEIGHT = 262
_LEFT = 30
_RIGHT = 30
_AXIS_Y = 170
_EVENT_KINDS_PREFIXES = ("approval_", "extension_")
_CHAR_WIDTH = 6.6  # px per character of an 11 px label, generously: a label never takes less
_LABEL_ROWS = 4
_MARKER_SIZE = 6.5


def _shape(source: str, x: float, y: float, r: float = _MARKER_SIZE) -> str:
    """The SVG path of the marker for a delay source: each source its own shape, told apart without colour."""
    if source == "provider_retry_after":  # triangle pointing up: the provider held us back
        return f"M{x:.1f},{y - r:.1f} L{x + r:.1f},{y + r * 0.8:.1f} L{x - r:.1f},{y + r * 0.8:.1f} Z"
    if source == "provider_poll_hint":  # square
        q = r * 0.85
        return f"M{x - q:.1f},{y - q:.1f} H{x + q:.1f} V{y + q:.1f} H{x - q:.1f} Z"
    if source == "manual_extension":  # plus: a person added time
        t = r * 0.38
        return (
            f"M{x - t:.1f},{y - r:.1f} H{x + t:.1f} V{y - t:.1f} H{x + r:.1f} V{y + t:.1f} H{x + t:.1f} "
            f"V{y + r:.1f} H{x - t:.1f} V{y + t:.1f} H{x - r:.1f} V{y - t:.1f} H{x - t:.1f} Z"
        )
    if source == "fleet_pacing":  # diamond
        return f"M{x:.1f},{y - r:.1f} L{x + r:.1f},{y:.1f} L{x:.1f},{y + r:.1f} L{x - r:.1f},{y:.1f} Z"
    if source == "provider_webhook":  # triangle pointing down: woken from outside
        return f"M{x - r:.1f},{y - r * 0.8:.1f} L{x + r:.1f},{y - r * 0.8:.1f} L{x:.1f},{y + r:.1f} Z"
    # local backoff (and anything unknown): a circle
    return (
        f"M{x - r:.1f},{y:.1f} a{r:.1f},{r:.1f} 0 1,0 {2 * r:.1f},0 a{r:.1f},{r:.1f} 0 1,0 {-2 * r:.1f},0 Z"
    )


def legend_shapes() -> list[tuple[str, str, str]]:
    """(delay source, its words, its marker's path in a 16×16 box) for the legend."""
    return [(key, words, _shape(key, 8, 8, 6)) for key, words in DELAY_SOURCE_WORDS.items()]


class _Rows:
    """Rows of labels: each label goes on the first row where it overlaps none already there."""

    def __init__(self, rows: int, left: float, right: float) -> None:
        self.taken: list[list[tuple[float, float]]] = [[] for _ in range(rows)]
        self.left, self.right = left, right

    def place(self, x: float, text: str) -> tuple[int, float] | None:
        """(row, centre x kept inside the chart) for a label centred at `x`, or None: no row has room."""
        width = len(text) * _CHAR_WIDTH + 6
        centre = min(max(x, self.left + width / 2), self.right - width / 2)
        begin, end = centre - width / 2, centre + width / 2
        for row, spans in enumerate(self.taken):
            if all(end <= b or begin >= e for b, e in spans):
                spans.append((begin, end))
                return row, round(centre, 1)
        return None


@dataclass(frozen=True)
class Tick:
    """A labelled point on the time axis."""

    x: float
    label: str


@dataclass(frozen=True)
class Marker:
    """One status request, or a run of them with one answer: when, what came back, why it went out then.

    Why is told by the shape (`shape`, an SVG path) and the colour; an error or
    no answer is drawn hollow. A run of requests that got the same state for
    the same reason is one marker from `x` to `x_end` labelled ``running ×45``.
    The label sits on the first row where it overlaps no other label; where
    there is none it is left out (`label` empty; the title still says it).
    """

    x: float
    at: str
    state: str | None
    http_status: int | None
    source: str
    label: str
    label_x: float
    label_y: float
    title: str
    failed: bool
    shape: str
    count: int = 1
    x_end: float | None = None


@dataclass(frozen=True)
class VLine:
    """A moment drawn across the chart: a deadline, or the planned next check."""

    x: float
    at: str
    name: str
    css: str
    label_y: float


@dataclass(frozen=True)
class Event:
    """An approval or extension event (its label on a row where it overlaps no other; empty where none)."""

    x: float
    at: str
    kind: str
    label: str
    label_y: float = 0.0


@dataclass(frozen=True)
class Timeline:
    """Everything the timeline template draws, in pixels."""

    width: int
    height: int
    axis_y: int
    left: int
    right: int
    start: str
    end: str
    markers: list[Marker]
    lines: list[VLine]
    events: list[Event]
    ticks: list[Tick]
    budget_used: int
    budget_max: int
    budget_width: float
    break_x: float | None = None
    notes: list[str] = field(default_factory=list[str])


def _epoch(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _clock(at: float, span: float) -> str:
    moment = to_datetime(at)
    if span < 20:  # a few seconds across: tenths, or neighbouring ticks read alike
        return moment.strftime("%H:%M:%S.") + str(moment.microsecond // 100_000)
    return moment.strftime("%H:%M:%S" if span < 86400 else "%m-%d %H:%M")


def _event_label(kind: str) -> str:
    return kind.replace("_", " ")


def timeline(record: OperationRecord, rows: Sequence[AuditRow], *, now: float) -> Timeline:
    """The timeline of one operation from its audit rows.

    A marker per status request, coloured by the delay source that timed it
    (the one chosen after the previous answer); the polling and business
    deadlines and the planned next check as lines; approvals and extensions as
    events; the status-request budget as a bar.
    """
    times = [t for t in (_epoch(row.at) for row in rows) if t is not None]
    start = min([record.started_at, *times])
    candidates = [record.deadline_at, *times]
    if record.is_waiting:
        candidates += [record.next_check_at, now]  # the "now" line is on the chart while it waits
    if record.stopped_at is not None:
        candidates.append(record.stopped_at)
    end = max(candidates)
    notes: list[str] = []
    business = record.business_deadline_at
    if business is not None:
        if business <= start + 3 * max(end - start, 1.0):
            end = max(end, business)
        else:
            notes.append(f"business deadline {iso(business)} is beyond the right edge of the chart")
    # Polls often span seconds while the deadline is minutes away: then the axis is broken, the
    # activity gets most of the width and the far part (up to the deadline) the last sixth.
    planned: list[float] = [record.next_check_at, now] if record.is_waiting else []
    activity_end = max([start, *times, *planned])
    activity = max(activity_end - start, 1.0)
    inner = WIDTH - _LEFT - _RIGHT
    broken = end - activity_end > 2 * activity
    near_width = inner * (0.8 if broken else 1.0)
    span = activity if broken else max(end - start, 1.0)

    def x_of(at: float) -> float:
        if not broken or at <= activity_end:
            return round(_LEFT + (at - start) / span * near_width, 1)
        far = (at - activity_end) / max(end - activity_end, 1.0)
        return round(_LEFT + inner * 0.84 + far * inner * 0.16, 1)

    polls: list[_Poll] = []
    raw_events: list[tuple[float, str]] = []
    earlier_deadlines: list[float] = []
    timed_by = "local_backoff"
    for row in rows:
        at = _epoch(row.at)
        if at is None:
            continue
        p = row.payload_obj
        if row.kind == "polled":
            http_status = p.get("http_status")
            status = http_status if isinstance(http_status, int) else None
            state = p.get("state")
            retry = p.get("retry_after_seconds")
            polls.append(
                _Poll(
                    at=at,
                    status=status,
                    state=state if isinstance(state, str) else None,
                    source=timed_by,
                    retry=float(retry) if isinstance(retry, int | float) else None,
                )
            )
        elif row.kind.startswith(_EVENT_KINDS_PREFIXES):
            raw_events.append((at, row.kind))
        source = p.get("delay_source")
        if isinstance(source, str) and source:
            timed_by = source
        deadline = _epoch(p.get("deadline_at"))
        if (
            deadline is not None
            and abs(deadline - record.deadline_at) > 0.01  # stored to the millisecond
            and all(abs(deadline - d) > 0.01 for d in earlier_deadlines)
        ):
            earlier_deadlines.append(deadline)

    label_rows = _Rows(_LABEL_ROWS, _LEFT - 20, WIDTH - 4)
    markers = [_marker(run, x_of, label_rows) for run in _runs(polls)]
    event_rows = _Rows(3, _LEFT - 20, WIDTH - 4)
    events: list[Event] = []
    for at, kind in raw_events:
        x = x_of(at)
        placed = event_rows.place(x, _event_label(kind))
        events.append(
            Event(
                x=x,
                at=iso(at) or "",
                kind=kind,
                label=_event_label(kind) if placed else "",
                label_y=_AXIS_Y + 50 + 13 * placed[0] if placed else 0.0,
            )
        )

    lines: list[VLine] = [
        VLine(x_of(d), iso(d) or "", "earlier polling deadline", "deadline-earlier", 26)
        for d in earlier_deadlines
        if start <= d <= end
    ]
    lines.append(
        VLine(x_of(record.deadline_at), iso(record.deadline_at) or "", "polling deadline", "deadline", 14)
    )
    if business is not None and business <= end:
        lines.append(VLine(x_of(business), iso(business) or "", "business deadline", "business-deadline", 38))
    if record.is_waiting:
        lines.append(
            VLine(
                x_of(record.next_check_at),
                iso(record.next_check_at) or "",
                "planned next check",
                "next-check",
                50,
            )
        )
    if start <= now <= end:
        lines.append(VLine(x_of(now), iso(now) or "", "now", "now", 62))
    ticks = [Tick(x_of(start + span * i / 4), _clock(start + span * i / 4, span)) for i in range(5)]
    if broken:
        ticks.append(Tick(x_of(end), _clock(end, end - start)))
    used, budget = record.status_requests_used, max(record.max_status_requests, 1)
    return Timeline(
        width=WIDTH,
        height=HEIGHT,
        axis_y=_AXIS_Y,
        left=_LEFT,
        right=WIDTH - _RIGHT,
        start=iso(start) or "",
        end=iso(end) or "",
        markers=markers,
        lines=lines,
        events=events,
        ticks=ticks,
        budget_used=used,
        budget_max=record.max_status_requests,
        budget_width=round(min(1.0, used / budget) * 300, 1),
        break_x=round(_LEFT + inner * 0.82, 1) if broken else None,
        notes=notes,
    )


@dataclass(frozen=True)
class _Poll:
    at: float
    status: int | None
    state: str | None
    source: str
    retry: float | None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def same_answer(self, other: _Poll) -> bool:
        """Whether `other` got the same answer for the same reason (one run on the chart)."""
        return (self.ok, self.status, self.state, self.source) == (
            other.ok,
            other.status,
            other.state,
            other.source,
        )


def _runs(polls: Sequence[_Poll]) -> list[list[_Poll]]:
    """Polls grouped into runs of one answer for one reason, in order."""
    runs: list[list[_Poll]] = []
    for poll in polls:
        if runs and runs[-1][0].same_answer(poll):
            runs[-1].append(poll)
        else:
            runs.append([poll])
    return runs


def _marker(run: Sequence[_Poll], x_of: Callable[[float], float], rows: _Rows) -> Marker:
    first, last = run[0], run[-1]
    ok = first.ok
    answer = (
        quoted(first.state, limit=24)
        if ok and first.state
        else (str(first.status) if first.status else "no answer")
    )
    label = answer if len(run) == 1 else f"{answer} ×{len(run)}"
    why = DELAY_SOURCE_WORDS.get(first.source, first.source)
    what = (
        f"HTTP {first.status if first.status is not None else 'none'}, state "
        f"{quoted(first.state) if first.state else '-'}, sent when {why} allowed"
    )
    retry = f"; Retry-After {first.retry:g} s" if first.retry is not None and not ok else ""
    when = iso(first.at) if len(run) == 1 else f"{len(run)} requests from {iso(first.at)} to {iso(last.at)}"
    x = x_of(first.at)
    x_end = x_of(last.at) if len(run) > 1 else None
    centre = x if x_end is None else (x + x_end) / 2
    placed = rows.place(centre, label)
    return Marker(
        x=x,
        at=iso(first.at) or "",
        state=first.state if ok else None,
        http_status=first.status,
        source=first.source,
        label=label if placed else "",
        label_x=placed[1] if placed else centre,
        label_y=_AXIS_Y - 34 - 16 * placed[0] if placed else _AXIS_Y - 34,
        title=f"{when}: {what}{retry}",
        failed=not ok,
        shape=_shape(first.source, x, _AXIS_Y),
        count=len(run),
        x_end=x_end,
    )


@dataclass(frozen=True)
class Bar:
    """Status requests per second, averaged over one bucket of time."""

    x: float
    y: float
    width: float
    height: float
    rate: float
    count: int
    title: str


@dataclass(frozen=True)
class PaceChart:
    """One provider's status requests over the last hour against its configured pace."""

    width: int
    height: int
    top: int
    bottom: int
    left: int
    right: int
    bars: list[Bar]
    pace: float
    burst: int
    pace_y: float
    y_max: float
    total: int
    busiest_second: int
    ticks: list[Tick]


def _busiest_second(times: Sequence[float]) -> int:
    ordered = sorted(times)
    best = 0
    first = 0
    for last, t in enumerate(ordered):
        while t - ordered[first] >= 1.0:
            first += 1
        best = max(best, last - first + 1)
    return best


def pace_chart(
    times: Sequence[float],
    *,
    now: float,
    pace: float,
    burst: int,
    window_seconds: float = 3600.0,
    buckets: int = 60,
) -> PaceChart:
    """Requests per second in each of `buckets` slices of the last `window_seconds`, and the pace line."""
    width, height, top, bottom, left, right = 960, 200, 16, 170, 50, 940
    start = now - window_seconds
    size = window_seconds / buckets
    counts = [0] * buckets
    for t in times:
        if start <= t < now:
            counts[min(buckets - 1, int((t - start) / size))] += 1
    rates = [c / size for c in counts]
    y_max = max(pace * 1.25, max(rates, default=0.0) * 1.1, 0.001)
    plot_height = bottom - top
    bar_width = (right - left) / buckets
    bars: list[Bar] = []
    for i, (count, rate) in enumerate(zip(counts, rates, strict=True)):
        h = round(rate / y_max * plot_height, 1)
        begin = start + i * size
        bars.append(
            Bar(
                x=round(left + i * bar_width, 1),
                y=round(bottom - h, 1),
                width=round(bar_width - 1, 1),
                height=h,
                rate=rate,
                count=count,
                title=f"{_clock(begin, window_seconds)}–{_clock(begin + size, window_seconds)}: {count} "
                f"requests, {rate:.3g}/s",
            )
        )
    ticks = [
        Tick(round(left + (right - left) * i / 4, 1), _clock(start + window_seconds * i / 4, window_seconds))
        for i in range(5)
    ]
    return PaceChart(
        width=width,
        height=height,
        top=top,
        bottom=bottom,
        left=left,
        right=right,
        bars=bars,
        pace=pace,
        burst=burst,
        pace_y=round(bottom - pace / y_max * plot_height, 1),
        y_max=y_max,
        total=sum(counts),
        busiest_second=_busiest_second([t for t in times if start <= t < now]),
        ticks=ticks,
    )
