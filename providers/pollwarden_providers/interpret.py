"""Pure interpretation of provider answers: hints, body fields and the state table.

Nothing here does I/O or reads a clock: the caller passes `now` (epoch seconds),
so every rule can be tested as a plain function.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Literal, cast
from urllib.parse import urlsplit

from pollwarden_providers.category import Category
from pollwarden_providers.errors import PollwardenError
from pollwarden_providers.request_building import split_job_id
from pollwarden_providers.table import ProviderTable
from pollwarden_providers.table_response import TimeFormat
from pollwarden_providers.table_results import FieldSpec

# An HTTP-date further in the past than this is not "retry now", it is garbage.
FAR_PAST_SECONDS = 86_400.0
# Provider text handed to the agent is cut to this many characters.
MAX_PROVIDER_TEXT = 500
# Nesting deeper than this is refused before anything reads the body.
MAX_JSON_DEPTH = 32
# A result field longer than this (as JSON) is handed over as truncated text.
MAX_RESULT_TEXT = 2000
# A provider state longer than this is cut (after its category is looked up).
MAX_STATE_TEXT = 200
# A Retry-After longer than this is rejected unread (no real one is; int() refuses > 4300 digits).
MAX_HINT_TEXT = 64

_DELTA_SECONDS = re.compile(r"^[0-9]+$")

HintSource = Literal[
    "retry_after", "retry_after_ms", "rate_limit_reset", "rate_limit_minimum", "poll_after", "next_check_at"
]
# A rate-limit phrase is looked for in this much of the body field, no more.
MAX_RATE_LIMIT_TEXT = 2000
# A count larger than this is not a plausible number of requests.
MAX_COUNT = 10**12

_TIME_FORMS: dict[TimeFormat, str] = {"rfc3339": "an RFC 3339 timestamp", "unix_seconds": "Unix seconds"}


@dataclass(frozen=True)
class RejectedHint:
    """A provider hint that failed validation; recorded, then ignored."""

    source: HintSource
    value: str
    reason: str

    def as_record(self) -> dict[str, str]:
        """The form the audit stores."""
        return {"source": self.source, "value": self.value, "reason": self.reason}


@dataclass(frozen=True)
class HintCheck:
    """The outcome of validating one hint: a wait in seconds, or a rejection."""

    seconds: float | None = None
    rejected: RejectedHint | None = None
    source: HintSource | None = None


def truncate_text(value: object, limit: int = MAX_PROVIDER_TEXT) -> str:
    """Provider text cut to `limit` characters, control characters removed."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = "".join(ch if ch.isprintable() or ch in " \t" else " " for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _shown(value: object) -> str:
    return truncate_text(value, 80)


def parse_retry_after(raw: str | None, *, now: float, max_seconds: float) -> HintCheck:
    """Validate a `Retry-After` value (RFC 9110 §10.2.3): delta-seconds or an HTTP-date.

    A date in the recent past means "no wait"; one more than a day old, a
    negative or unparseable value, or a wait longer than `max_seconds` is rejected.
    """
    if raw is None:
        return HintCheck()
    value = raw.strip()
    if len(value) > MAX_HINT_TEXT:
        return HintCheck(
            rejected=RejectedHint(
                "retry_after", _shown(raw), f"{len(value)} characters long; not a plausible Retry-After"
            )
        )
    if _DELTA_SECONDS.match(value):
        seconds = float(int(value))
    else:
        try:
            when = parsedate_to_datetime(value)
            if when.tzinfo is None:  # "-0000" and asctime dates: RFC 9110 says GMT
                when = when.replace(tzinfo=UTC)
            seconds = when.timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            reason = "negative" if value.startswith("-") else "not delta-seconds or an HTTP-date"
            return HintCheck(rejected=RejectedHint("retry_after", _shown(raw), reason))
        if seconds < -FAR_PAST_SECONDS:
            return HintCheck(rejected=RejectedHint("retry_after", _shown(raw), "more than a day in the past"))
        seconds = max(0.0, seconds)
    if seconds > max_seconds:
        return HintCheck(
            rejected=RejectedHint("retry_after", _shown(raw), f"longer than the {max_seconds:g} s maximum")
        )
    return HintCheck(seconds=seconds, source="retry_after")


def parse_rate_limit_reset(raw: str | None, *, now: float, max_seconds: float) -> HintCheck:
    """Validate a rate-limit reset header (Unix seconds, e.g. GitHub's ``x-ratelimit-reset``) into a wait."""
    if raw is None:
        return HintCheck()
    value = raw.strip()
    if len(value) > MAX_HINT_TEXT or not _DELTA_SECONDS.match(value):
        return HintCheck(rejected=RejectedHint("rate_limit_reset", _shown(raw), "not Unix seconds"))
    seconds = int(value) - now
    if seconds < -FAR_PAST_SECONDS:
        return HintCheck(
            rejected=RejectedHint("rate_limit_reset", _shown(raw), "more than a day in the past")
        )
    if seconds > max_seconds:
        return HintCheck(
            rejected=RejectedHint(
                "rate_limit_reset", _shown(raw), f"later than the {max_seconds:g} s maximum"
            )
        )
    return HintCheck(seconds=max(0.0, seconds), source="rate_limit_reset")


def parse_retry_after_ms(raw: str | None, *, max_seconds: float) -> HintCheck:
    """Validate a milliseconds wait header such as OpenAI's ``retry-after-ms`` (a minimum, like Retry-After)."""
    if raw is None:
        return HintCheck()
    value = raw.strip()
    if len(value) > MAX_HINT_TEXT or not re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
        reason = "negative" if value.startswith("-") else "not a number of milliseconds"
        return HintCheck(rejected=RejectedHint("retry_after_ms", _shown(raw), reason))
    seconds = float(value) / 1000.0
    if seconds > max_seconds:
        return HintCheck(
            rejected=RejectedHint("retry_after_ms", _shown(raw), f"longer than the {max_seconds:g} s maximum")
        )
    return HintCheck(seconds=seconds, source="retry_after_ms")


def longest_wait(*checks: HintCheck) -> HintCheck:
    """Of several valid minimum waits, the longest (every one is a minimum); none valid: no wait."""
    valid = [c for c in checks if c.seconds is not None]
    return max(valid, key=lambda c: c.seconds or 0.0) if valid else HintCheck()


def rate_limited_refusal(table: ProviderTable, headers: Mapping[str, str], body: bytes = b"") -> str | None:
    """Why a 403 is the provider's rate limit rather than a refusal (per ``[rate_limit]``), or None.

    ``headers`` have lower-cased names. The body is read only where the table
    names a documented field and literal phrases (GitHub's secondary limit says
    so in ``message``): a bounded, case-insensitive substring test, no patterns.
    """
    spec = table.rate_limit
    if spec.remaining_header is not None:
        remaining = headers.get(spec.remaining_header.lower())
        if remaining is not None and remaining.strip() == "0":
            return f"{spec.remaining_header}: 0"
    if spec.forbidden_with_retry_after and "retry-after" in headers:
        return "with Retry-After"
    phrase = rate_limit_phrase(table, body)
    if phrase is not None:
        return f"whose {spec.body_field} says {phrase!r}"
    return None


def rate_limit_phrase(table: ProviderTable, body: bytes) -> str | None:
    """The ``[rate_limit] body_contains`` phrase found in the body's ``body_field``, or None."""
    spec = table.rate_limit
    if spec.body_field is None or not body:
        return None
    try:
        text = get_field(parse_json_object(body), spec.body_field)
    except BodyError:
        return None
    if not isinstance(text, str):
        return None
    folded = text[:MAX_RATE_LIMIT_TEXT].casefold()
    return next((phrase for phrase in spec.body_contains if phrase.casefold() in folded), None)


def reset_applies(table: ProviderTable, headers: Mapping[str, str]) -> bool:
    """Whether the reset header is the wait: when the remaining count is 0, or the table reads no count.

    GitHub: "if x-ratelimit-remaining is 0, wait until x-ratelimit-reset";
    a secondary limit with requests remaining waits the documented minimum instead.
    """
    name = table.rate_limit.remaining_header
    remaining = headers.get(name.lower()) if name is not None else None
    return remaining is None or remaining.strip() == "0"


def parse_poll_after(value: object, *, max_seconds: float) -> HintCheck:
    """Validate a body hint such as `poll_after_seconds`: a finite number in [0, max]."""
    if value is None:
        return HintCheck()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return HintCheck(rejected=RejectedHint("poll_after", _shown(value), "not a number"))
    try:
        seconds = float(value)
    except OverflowError:  # an integer with hundreds of digits
        seconds = math.inf
    if not math.isfinite(seconds):
        return HintCheck(rejected=RejectedHint("poll_after", _shown(value), "not a finite number"))
    if seconds < 0:
        return HintCheck(rejected=RejectedHint("poll_after", _shown(value), "negative"))
    if seconds > max_seconds:
        return HintCheck(
            rejected=RejectedHint("poll_after", _shown(value), f"longer than the {max_seconds:g} s maximum")
        )
    return HintCheck(seconds=seconds, source="poll_after")


# Unix seconds outside (1970, 5138) are not a plausible provider time (and a
# millisecond value, 1000x too large, lands far past this).
MAX_UNIX_SECONDS = 1e11


def parse_timestamp(value: object, time_format: TimeFormat = "rfc3339") -> datetime | None:
    """A provider time, or None when it is not one.

    ``rfc3339``: a string with an offset. ``unix_seconds``: a finite number of
    seconds since 1970 (OpenAI writes its times this way).
    """
    if time_format == "unix_seconds":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        try:
            seconds = float(value)
        except OverflowError:
            return None
        if not (math.isfinite(seconds) and 0 <= seconds < MAX_UNIX_SECONDS):
            return None
        return datetime.fromtimestamp(seconds, UTC)
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    try:
        when.timestamp()
    except (OverflowError, ValueError):  # year 1 with a positive offset, and the like
        return None
    return when


def parse_next_check_at(
    value: object, *, now: float, max_seconds: float, time_format: TimeFormat = "rfc3339"
) -> HintCheck:
    """Validate a body hint such as `next_check_at` into a wait from `now`."""
    if value is None:
        return HintCheck()
    when = parse_timestamp(value, time_format)
    if when is None:
        return HintCheck(
            rejected=RejectedHint("next_check_at", _shown(value), f"not {_TIME_FORMS[time_format]}")
        )
    seconds = when.timestamp() - now
    if seconds < -FAR_PAST_SECONDS:
        return HintCheck(rejected=RejectedHint("next_check_at", _shown(value), "more than a day in the past"))
    if seconds > max_seconds:
        return HintCheck(
            rejected=RejectedHint("next_check_at", _shown(value), f"later than the {max_seconds:g} s maximum")
        )
    return HintCheck(seconds=max(0.0, seconds), source="next_check_at")


def json_depth_exceeds(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when JSON nesting in `body` goes deeper than `limit` (strings are skipped)."""
    depth = 0
    in_string = False
    escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


class BodyError(PollwardenError, ValueError):
    """The body is not a JSON object we can read."""


def parse_json_object(body: bytes) -> dict[str, object]:
    """Parse a JSON object body; raise `BodyError` naming what is wrong."""
    if json_depth_exceeds(body):
        raise BodyError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise BodyError("body is not UTF-8") from exc
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise BodyError(f"body is not valid JSON ({truncate_text(str(exc), 120)})") from exc
    if not isinstance(value, dict):
        raise BodyError("body is JSON but not an object")
    return cast(dict[str, object], value)


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


def get_field(body: Mapping[str, object], dotted: str) -> object:
    """The value at a dotted path in a JSON object, or None when any step is missing."""
    *parents, leaf = dotted.split(".")
    current: Mapping[str, object] = body
    for part in parents:
        value = current.get(part)
        if not isinstance(value, dict):
            return None
        current = cast(dict[str, object], value)  # JSON objects decode with str keys
    return current.get(leaf)


def _present(value: object) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def field_problem(spec: FieldSpec, value: object) -> str | None:
    """Why `value` is not a valid field of its declared type, or None when it is."""
    kind = spec.type
    if kind in ("string", "url"):
        if not isinstance(value, str) or not value:
            return f"not a non-empty {kind}"
        if len(value) > spec.max_length:
            return f"longer than {spec.max_length} characters"
        if kind == "string":
            if spec.pattern is not None and re.fullmatch(spec.pattern, value) is None:
                return f"does not match the pattern {spec.pattern!r}"
            return None
        if any(ch.isspace() or not ch.isprintable() for ch in value):
            return "not a URL (it holds spaces or control characters)"
        parts = urlsplit(value)
        if parts.scheme.lower() not in spec.schemes:
            return f"not a URL with scheme {' or '.join(spec.schemes)}"
        if not parts.netloc or "@" in parts.netloc:
            return "not a URL with a host (and no user name or password)"
        return None
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return "not an integer"
        if spec.minimum is not None and value < spec.minimum:
            return f"below the minimum {spec.minimum}"
        return None
    if kind == "object":
        return None if isinstance(value, dict) and value else "not a non-empty object"
    if kind == "list":
        return None if isinstance(value, list) and value else "not a non-empty list"
    return None if _present(value) else "empty"


@dataclass(frozen=True)
class FieldRead:
    """Result fields read from a body: the valid ones, the missing ones, and why others were refused."""

    values: dict[str, object] = field(default_factory=dict[str, object])
    missing: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()  # "name: why", for the stop detail and the audit


def read_fields(table: ProviderTable, body: Mapping[str, object], names: tuple[str, ...]) -> FieldRead:
    """Read and validate `names` (each declared in ``[fields]``); absent or null ones are missing."""
    values: dict[str, object] = {}
    missing: list[str] = []
    invalid: list[str] = []
    for name in names:
        value = get_field(body, name)
        if value is None or value in ("", [], {}):
            missing.append(name)
            continue
        spec = table.fields.get(name)
        problem = field_problem(spec, value) if spec is not None else None
        if problem is None:
            values[name] = result_value(value)
        else:
            invalid.append(f"{name} ({_shown(value)}) is {problem}")
    return FieldRead(values, tuple(missing), tuple(invalid))


def read_counts(table: ProviderTable, body: Mapping[str, object]) -> dict[str, int]:
    """The request counts the table maps (``[counts]``); a value that is not a count is left out.

    Counts may be JSON integers or decimal strings (Google writes int64 as a string).
    """
    counts: dict[str, int] = {}
    for name, path in table.counts.mapped().items():
        value = get_field(body, path)
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 13:
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
            counts[name] = value
    return counts


def outcome_from_counts(counts: Mapping[str, int]) -> Category | None:
    """The end category counts imply for a success state in which no request succeeded, or None.

    None when a request succeeded, or when the counts say nothing (no
    ``succeeded`` count, or no request counted at all).
    """
    if counts.get("succeeded") != 0:
        return None
    ended = {name: counts.get(name, 0) for name in ("errored", "cancelled", "expired")}
    if not any(ended.values()):
        return None
    if ended["cancelled"] and not ended["errored"] and not ended["expired"]:
        return Category.CANCELLED
    if ended["expired"] and not ended["errored"] and not ended["cancelled"]:
        return Category.EXPIRED
    return Category.FAILED


@dataclass(frozen=True)
class StatusBody:
    """What a 2xx status body says, read through the provider's table."""

    state: str | None
    category: Category
    error: str | None = None
    expires_at: float | None = None
    expires_at_rejected: str | None = None
    result: dict[str, object] = field(default_factory=dict[str, object])
    missing_fields: tuple[str, ...] = ()
    invalid_fields: tuple[str, ...] = ()
    counts: dict[str, int] = field(default_factory=dict[str, int])
    poll_hint: HintCheck = HintCheck()
    # Every body hint that failed validation (recorded, then ignored).
    rejected_hints: tuple[RejectedHint, ...] = ()
    # Why an unknown state is unknown, when "not in the table" is not the whole story.
    unknown_because: str | None = None


def _state_text(value: object) -> str:
    return truncate_text(value, MAX_STATE_TEXT) if isinstance(value, str) else _shown(value)


def classify_state(
    table: ProviderTable, body: Mapping[str, object]
) -> tuple[str | None, Category, str | None]:
    """The state as reported, its category, and why it is unknown when a refining field decided that.

    A state with a ``[refine.<state>]`` section is decided by that section's
    field and reported as ``state/value`` (``completed/success``).
    """
    raw_state = get_field(body, table.response.state_field)
    if raw_state is None:
        return None, Category.UNKNOWN, None
    refine = table.refine.get(str.__str__(raw_state)) if isinstance(raw_state, str) else None
    if refine is None:
        return _state_text(raw_state), table.category_of(raw_state), None
    detail = get_field(body, refine.field)
    shown = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    state = _state_text(f"{raw_state}/{shown}")
    category = refine.category_of(detail)
    if category != "unknown":
        return state, category, None
    because = (
        f"{refine.field!r} is missing"
        if detail is None
        else f"{refine.field} {_shown(shown)!r} is not listed"
    )
    return state, category, f"{because} under [refine.{_shown(raw_state)}]"


def result_value(value: object) -> object:
    """A required result field as handed to the agent: bounded, with control characters removed.

    Scalars and small lists or objects (Replicate's ``output`` is a list of
    URLs) keep their shape; anything larger becomes truncated JSON text.
    """
    if isinstance(value, str):
        return truncate_text(value, MAX_RESULT_TEXT)
    if isinstance(value, bool | int | float) or value is None:
        return value
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > MAX_RESULT_TEXT:
        return truncate_text(text, MAX_RESULT_TEXT)
    if isinstance(value, list):
        return [result_value(item) for item in cast(list[object], value)]
    if isinstance(value, dict):
        return {truncate_text(k, 200): result_value(v) for k, v in cast(dict[str, object], value).items()}
    return truncate_text(text, MAX_RESULT_TEXT)


def read_status_body(
    table: ProviderTable, body: Mapping[str, object], *, now: float, max_hint_seconds: float
) -> StatusBody:
    """Read state, category, error, expiry, required result fields and poll hints from a body."""
    spec = table.response
    state, category, unknown_because = classify_state(table, body)

    error: str | None = None
    if spec.error_field is not None:
        raw_error = get_field(body, spec.error_field)
        if raw_error is not None:
            error = truncate_text(raw_error)

    expires_at: float | None = None
    expires_rejected: str | None = None
    if spec.expires_at_field is not None:
        raw_expiry = get_field(body, spec.expires_at_field)
        if raw_expiry is not None:
            parsed = parse_timestamp(raw_expiry, spec.time_format)
            if parsed is None:
                expires_rejected = (
                    f"{spec.expires_at_field}={_shown(raw_expiry)} is not {_TIME_FORMS[spec.time_format]}"
                )
            else:
                expires_at = parsed.timestamp()

    result: dict[str, object] = {}
    missing: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()
    if category == "succeeded":
        required = read_fields(table, body, table.success.required_fields)
        one_of = read_fields(table, body, table.success.required_one_of)
        result = {**required.values, **one_of.values}
        missing = required.missing
        if table.success.required_one_of and not one_of.values and not one_of.invalid:
            missing += (" or ".join(table.success.required_one_of),)
        invalid = required.invalid + one_of.invalid

    # poll_after wins when both are valid; a rejected one never hides the other.
    checks: list[HintCheck] = []
    if spec.poll_after_field is not None:
        checks.append(parse_poll_after(get_field(body, spec.poll_after_field), max_seconds=max_hint_seconds))
    if spec.next_check_at_field is not None:
        checks.append(
            parse_next_check_at(
                get_field(body, spec.next_check_at_field),
                now=now,
                max_seconds=max_hint_seconds,
                time_format=spec.time_format,
            )
        )
    poll_hint = next((c for c in checks if c.seconds is not None), HintCheck())
    return StatusBody(
        state=state,
        category=category,
        error=error,
        expires_at=expires_at,
        expires_at_rejected=expires_rejected,
        result=result,
        missing_fields=missing,
        invalid_fields=invalid,
        counts=read_counts(table, body),
        poll_hint=poll_hint,
        rejected_hints=tuple(c.rejected for c in checks if c.rejected is not None),
        unknown_because=unknown_because,
    )


def read_request_id(table: ProviderTable, headers: Mapping[str, str]) -> str | None:
    """The provider's request id from the header the table names (headers lower-cased), truncated."""
    name = table.response.request_id_header
    value = headers.get(name.lower()) if name else None
    return truncate_text(value, 128) if value else None


def where_person_acts(table: ProviderTable, state: str | None, job_id: str | None) -> str:
    """Where a person acts at the provider for an ``awaiting_review`` state (``[awaiting_review]``).

    Job id placeholders (``{owner}``) are filled from the recorded job id, never
    from the provider's answer.
    """
    spec = table.awaiting_review
    if spec is None:
        return "the provider's console"
    where = spec.where_of(state)
    parts = split_job_id(table, job_id) if job_id is not None else {}
    if isinstance(parts, dict):
        for name, value in parts.items():
            where = where.replace(f"{{{name}}}", value)
    return where
