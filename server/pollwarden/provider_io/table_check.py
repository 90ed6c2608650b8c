"""Checking a provider table against sample responses, without a database or a network.

`preview_answer` runs the controller's own decision (`interpret_status_answer`)
on a sample as the answer to a fresh operation's first status request, so what
`pollwarden providers check` prints is what the server would do. Samples are a
JSON body (taken as a 200) or a raw HTTP response as ``curl -i`` prints it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from pollwarden.core.errors import SampleError
from pollwarden.core.records import OperationRecord
from pollwarden.core.timefmt import iso
from pollwarden.core.vocabulary import DelaySource, Status
from pollwarden.flows.controller import transition_changes
from pollwarden.rules.job_identity import account_context_of, expected_terminal_state_of
from pollwarden.rules.status_answer import ProviderAnswer, Transition, interpret_status_answer
from pollwarden.rules.stored_result import decode_result
from pollwarden.surface.views import allowed_actions, person_must_act_at
from pollwarden_providers.category import CATEGORIES
from pollwarden_providers.interpret import BodyError, get_field, parse_json_object
from pollwarden_providers.request_building import job_id_form
from pollwarden_providers.table import ProviderTable
from pollwarden_providers.table_results import FieldSpec

__all__ = [
    "SampleError",
    "SamplePreview",
    "describe_table",
    "first_check_record",
    "preview_answer",
    "read_sample",
    "sample_job_id",
]

# The provider job id a preview pretends to track.
SAMPLE_JOB_ID = "sample"


@dataclass(frozen=True)
class _FixedRandom:
    value: float

    def random(self) -> float:
        return self.value


@dataclass(frozen=True)
class SamplePreview:
    """What the controller makes of one sample answer."""

    http_status: int
    state: str | None
    category: str | None
    outcome: str  # "waiting", or the stop reason
    detail: str
    next_check_in: tuple[float, float] | None  # (shortest, longest) wait when still waiting
    delay_source: str | None
    allowed_actions: tuple[str, ...]
    ignored: tuple[str, ...]  # hints and fields the controller recorded as ignored
    # Result fields handed over: a success's, or those kept for another end state.
    fields: tuple[str, ...] = ()
    counts: dict[str, int] | None = None
    person_must_act_at: str | None = None

    def what_the_controller_does(self) -> str:
        """One sentence: keep waiting (and when), or stop (and what may follow)."""
        if self.outcome == "waiting" and self.next_check_in is not None:
            low, high = self.next_check_in
            when = f"{low:g} s" if abs(high - low) < 0.001 else f"{low:g}–{high:g} s"
            return f"keeps waiting; next status request in {when} ({self.delay_source})"
        actions = ", ".join(self.allowed_actions) or "nothing: a person takes over"
        if self.person_must_act_at is not None:
            return (
                f"stops with {self.outcome}: a person must act at the provider: {self.person_must_act_at}; "
                f"the agent may: {actions}"
            )
        return f"stops with {self.outcome} ({self.detail}); the agent may: {actions}"


def first_check_record(
    table: ProviderTable, *, started_at: float, now: float, job_id: str = SAMPLE_JOB_ID
) -> OperationRecord:
    """A record tracking `job_id` with the table's defaults, as decide sees it at its first request."""
    limits = table.limits
    return OperationRecord(
        operation_id="preview",
        provider=table.name,
        provider_job_id=job_id,
        account_context=account_context_of(table),
        request_fingerprint="0" * 64,
        idempotency_key=None,
        expected_terminal_state=expected_terminal_state_of(table),
        status=Status.WAITING,
        stop_reason=None,
        stop_detail=None,
        state=None,
        category=None,
        started_at=started_at,
        deadline_at=started_at + limits.default_deadline_seconds,
        business_deadline_at=None,
        max_status_requests=limits.default_max_status_requests,
        max_transport_failures=limits.max_transport_failures,
        max_rate_limited=limits.max_rate_limited,
        status_requests_used=1,  # this request, counted before it left
        transport_failures_used=0,
        rate_limited_used=0,
        polls_completed=0,
        next_check_at=now,
        delay_source=DelaySource.LOCAL_BACKOFF,
        retry_after_seconds=None,
        last_http_status=None,
        last_http_at=None,
        provider_request_id=None,
        provider_expires_at=None,
        error=None,
        result_json=None,
        lease_owner="preview",
        lease_expires_at=now + 60,
        extensions_used=0,
        stopped_at=None,
        submit_payload_json=None,
        created_at=started_at,
        updated_at=now,
        version=2,
        fleet_slot_at=None,
    )


def sample_job_id(table: ProviderTable, answer: ProviderAnswer) -> str:
    """The job a sample is about: the id its body repeats (``response.job_id_field``), else ``sample``."""
    name = table.response.job_id_field
    try:
        value = get_field(parse_json_object(answer.body), name) if name is not None else None
    except BodyError:
        value = None
    if not isinstance(value, str | int) or isinstance(value, bool):
        return SAMPLE_JOB_ID
    # A multi-part id repeats only its last part (GitHub's run id); the others are placeholders.
    return "/".join((*table.job_id_parts[:-1], str(value)))


def preview_answer(
    table: ProviderTable, answer: ProviderAnswer, *, started_at: float, job_id: str | None = None
) -> SamplePreview:
    """Decide `answer` as the first status answer of an operation tracking `job_id`, started at `started_at`.

    Without `job_id` the operation tracks the job the sample is about. The
    jitter is evaluated at both ends of its range, so a waiting preview shows
    the shortest and the longest next wait the schedule allows.
    """
    record = first_check_record(
        table,
        started_at=started_at,
        now=answer.received_at,
        job_id=job_id if job_id is not None else sample_job_id(table, answer),
    )
    shortest = interpret_status_answer(record, table, answer, rng=_FixedRandom(0.0))
    longest = interpret_status_answer(record, table, answer, rng=_FixedRandom(1.0))
    after = dataclasses.replace(record, **transition_changes(record, longest, answer))
    waits: tuple[float, float] | None = None
    if shortest.next_check_at is not None and longest.next_check_at is not None:
        waits = (
            round(shortest.next_check_at - answer.received_at, 3),
            round(longest.next_check_at - answer.received_at, 3),
        )
    stored = decode_result(after.result_json)
    return SamplePreview(
        fields=tuple(stored.fields),
        counts=stored.counts or None,
        person_must_act_at=person_must_act_at(after, table),
        http_status=answer.status_code,
        state=longest.state,
        category=longest.category,
        outcome=longest.stop_reason or "waiting",
        detail=longest.stop_detail or "",
        next_check_in=waits,
        delay_source=longest.delay_source,
        allowed_actions=tuple(allowed_actions(after, table)),
        ignored=_ignored(longest),
    )


def _ignored(t: Transition) -> tuple[str, ...]:
    notes = [f"{h.source} {h.value!r}: {h.reason}" for h in t.rejected_hints]
    if t.note:
        notes.append(t.note)
    return tuple(notes)


def read_sample(path: Path, *, received_at: float) -> ProviderAnswer:
    """Read a sample response: a JSON body (a 200), or a raw HTTP response as ``curl -i`` prints it."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SampleError(
            f"{path}: cannot be read ({exc.strerror or exc}); check the path and its permissions"
        ) from exc
    if not raw.lstrip().startswith(b"HTTP/"):
        return ProviderAnswer(status_code=200, headers={}, body=raw, received_at=received_at)
    return _parse_http(path, raw.lstrip(), received_at)


def _parse_http(path: Path, raw: bytes, received_at: float) -> ProviderAnswer:
    # curl -i prints interim answers (100 Continue) and each redirect hop first; the last block counts.
    while True:
        head, sep, rest = raw.replace(b"\r\n", b"\n").partition(b"\n\n")
        if not sep:
            raise SampleError(
                f"{path}: the HTTP headers never end; separate them from the body with an empty line"
            )
        lines = head.decode("latin-1").split("\n")
        status_parts = lines[0].split(maxsplit=2)
        if (
            len(status_parts) < 2
            or not (status_parts[1].isascii() and status_parts[1].isdigit())
            or len(status_parts[1]) != 3
        ):
            raise SampleError(
                f"{path}: {lines[0][:80]!r} is not an HTTP status line; write e.g. 'HTTP/1.1 200 OK'"
            )
        if not rest.lstrip().startswith(b"HTTP/"):
            break
        raw = rest.lstrip()
    headers: dict[str, str] = {}
    for number, line in enumerate(lines[1:], start=2):
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise SampleError(f"{path}: header line {number} {line[:80]!r} is not 'Name: value'")
        headers[name.strip().lower()] = value.strip()
    return ProviderAnswer(
        status_code=int(status_parts[1]), headers=headers, body=rest, received_at=received_at
    )


def describe_table(table: ProviderTable) -> list[str]:
    """The table as people check it: origin, job id form, states by category, calls and limits."""
    limits, schedule = table.limits, table.schedule
    lines = [
        f"{table.name}  ({table.source})",
        f"  origin        {table.origin}",
        f"  status        GET {table.status_path}   job id: {job_id_form(table)}",
    ]
    if table.description:
        lines.insert(1, f"  {table.description}")
    if table.auth is not None:
        shared = (
            f" (also used for {', '.join(table.auth.shared_with_origins)})"
            if table.auth.shared_with_origins
            else ""
        )
        lines.append(f"  credentials   {table.auth.header} from ${table.auth.env}{shared}")
    if table.headers:
        lines.append(f"  headers       {', '.join(f'{k}: {v}' for k, v in table.headers.items())}")
    if table.submit is not None:
        idempotency = table.submit.idempotency_header or "none: an unknown outcome is never resent"
        lines.append(
            f"  submit        {table.submit.method} {table.submit.path}   idempotency: {idempotency}"
        )
    if table.cancel is not None:
        lines.append(f"  cancel        {table.cancel.method} {table.cancel.path}")
    for category in CATEGORIES:
        states = table.states_of(category)
        if states:
            lines.append(f"  {category:<13} {', '.join(states)}")
    lines.append("  unknown       anything else (stops the operation)")
    if table.success.required_fields:
        lines.append(f"  success needs {', '.join(_typed(table, f) for f in table.success.required_fields)}")
    if table.success.required_one_of:
        one_of = " or ".join(_typed(table, f) for f in table.success.required_one_of)
        lines.append(f"  success needs one of {one_of}")
    if table.success.failure_fields:
        lines.append(
            f"  all failed    a success state without them but with {', '.join(table.success.failure_fields)}"
        )
    for category in ("failed", "cancelled", "expired"):
        kept = table.results.of(category)
        if kept:
            lines.append(
                f"  {category + ' keeps':<13} {', '.join(_typed(table, f) for f in kept)} (fetch_result)"
            )
    counts = table.counts.mapped()
    if counts:
        lines.append(f"  counts        {', '.join(f'{name} <- {path}' for name, path in counts.items())}")
    if table.awaiting_review is not None:
        lines.append(f"  person acts   {table.awaiting_review.where}")
    expiry = table.expiry
    if table.response.expires_at_field is not None:
        after = (
            f"; {', '.join(expiry.states_after_expiry)} may end after it"
            if expiry.states_after_expiry
            else ""
        )
        lines.append(
            f"  expiry        {table.response.expires_at_field} + {expiry.grace_seconds:g} s grace{after}"
        )
    lines.append(
        f"  schedule      {schedule.base_delay_seconds:g} s doubling to {schedule.max_delay_seconds:g} s, jittered"
    )
    limit = table.rate_limit
    signals = [f"{limit.remaining_header}: 0"] if limit.remaining_header else []
    signals += ["Retry-After"] if limit.forbidden_with_retry_after else []
    signals += (
        [f"{limit.body_field} saying {' or '.join(map(repr, limit.body_contains))}"]
        if limit.body_field
        else []
    )
    if signals or limit.reset_header or limit.min_wait_seconds:
        reset = f"; waits for {limit.reset_header}" if limit.reset_header else ""
        least = f"; at least {limit.min_wait_seconds:g} s" if limit.min_wait_seconds else ""
        lines.append(f"  rate limit    429, or 403 with {' or '.join(signals) or 'nothing'}{reset}{least}")
    if table.response.retry_after_ms_header:
        lines.append(f"  minimum wait  Retry-After or {table.response.retry_after_ms_header}, the longer")
    if table.webhook is not None:
        # The secret variable's name only: its value is never read here.
        lines.append(
            f"  webhook       {table.webhook.scheme}, secret from ${table.webhook.secret_env}, "
            f"wakes on {', '.join(table.webhook.events)}"
        )
    if table.fleet is not None:
        lines.append(
            f"  fleet         {table.fleet.max_requests_per_second:g} requests/s shared, burst {table.fleet.burst}"
        )
    lines.append(
        f"  limits        deadline {limits.default_deadline_seconds:g} s (max {limits.max_deadline_seconds:g}), "
        f"{limits.default_max_status_requests} status requests (max {limits.max_status_requests}), "
        f"{limits.max_transport_failures} transport failures, {limits.max_rate_limited} rate limits"
    )
    return lines


def _typed(table: ProviderTable, name: str) -> str:
    spec: FieldSpec | None = table.fields.get(name)
    if spec is None:
        return name
    shown = spec.type
    if spec.pattern is not None:
        shown += f" {spec.pattern}"
    if spec.type == "url":
        shown = "/".join(spec.schemes) + " url"
    return f"{name} ({shown})"


def describe_preview(name: str, preview: SamplePreview, at: float) -> list[str]:
    """A sample's classification and the controller's decision, as printed by ``providers check``."""
    if preview.state is None:
        state = f"none read from the HTTP {preview.http_status} answer"
    else:
        state = f"{json.dumps(preview.state)} -> {preview.category}"
    lines = [
        f"{name}",
        f"  state         {state}",
        f"  controller    {preview.what_the_controller_does()}",
    ]
    if preview.fields:
        label = "result" if preview.outcome == "succeeded" else "kept"
        lines.append(f"  {label:<13} {', '.join(preview.fields)} (fetch_result)")
    if preview.counts:
        lines.append(f"  counts        {', '.join(f'{k} {v}' for k, v in preview.counts.items())}")
    lines += [f"  ignored       {note}" for note in preview.ignored]
    lines.append(f"  evaluated at  {iso(at)}")
    return lines
