"""The response side of a provider table: how a status answer is read.

Where the facts are in the answer (``[response]``), which provider states mean
what (``[states]``, ``[refine.<state>]``, ``awaiting_review``), and the
provider's documented readings of a 404 (``[not_found]``), of its own expiry
time (``[expiry]``) and of a job waiting for a person (``[awaiting_review]``).
What a success must carry is ``table_results``.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, Field, StrictStr, field_validator, model_validator

from pollwarden_providers.category import CATEGORIES, Category
from pollwarden_providers.table_common import (
    MODEL_CONFIG,
    PLACEHOLDER_RE,
    NonNegativeFloat,
    PositiveFloat,
    StateList,
    check_dotted_path,
    check_header_name,
    refuse,
)

__all__ = [
    "AwaitingReviewSpec",
    "ExpirySpec",
    "NotFoundSpec",
    "RefineSpec",
    "ResponseSpec",
    "StatesSpec",
    "TimeFormat",
]

TimeFormat = Literal["rfc3339", "unix_seconds"]
"""How a table's time fields are written: RFC 3339 text, or seconds since 1970."""

# A "where" text is short.
_MAX_WHERE = 300


class ResponseSpec(BaseModel):
    """Where the facts are in a status response (dotted paths into the JSON body, or header names)."""

    model_config = MODEL_CONFIG

    state_field: str = Field(default="state", description='a dotted path into the JSON body, e.g. "state"')
    expires_at_field: str | None = Field(default=None, description='a dotted path, e.g. "expires_at"')
    poll_after_field: str | None = Field(default=None, description='a dotted path, e.g. "poll_after_seconds"')
    next_check_at_field: str | None = Field(default=None, description='a dotted path, e.g. "next_check_at"')
    error_field: str | None = Field(default=None, description='a dotted path, e.g. "error"')
    request_id_header: str | None = Field(
        default=None, description='an HTTP header name, e.g. "X-Request-Id"'
    )
    job_id_field: str | None = Field(default=None, description='a dotted path, e.g. "id"')
    retry_after_ms_header: str | None = Field(
        default=None,
        description='an HTTP header name, e.g. "retry-after-ms" (milliseconds; a minimum wait like Retry-After)',
    )
    time_format: TimeFormat = Field(
        default="rfc3339",
        description='how expires_at_field and next_check_at_field write times: "rfc3339" or "unix_seconds"',
    )

    @field_validator(
        "state_field",
        "expires_at_field",
        "poll_after_field",
        "next_check_at_field",
        "error_field",
        "job_id_field",
    )
    @classmethod
    def _fields_are_dotted(cls, value: str | None) -> str | None:
        return check_dotted_path(value)

    @field_validator("request_id_header", "retry_after_ms_header")
    @classmethod
    def _header_is_a_token(cls, value: str | None) -> str | None:
        return check_header_name(value)


class _CategoryLists(BaseModel):
    """Provider values listed by category; each value in one category only, matched exactly."""

    model_config = MODEL_CONFIG

    pending: StateList = Field(default=(), description='a list of state strings, e.g. ["queued", "running"]')
    succeeded: StateList = Field(default=(), description='a list of state strings, e.g. ["succeeded"]')
    failed: StateList = Field(default=(), description='a list of state strings, e.g. ["failed"]')
    cancelled: StateList = Field(default=(), description='a list of state strings, e.g. ["cancelled"]')
    expired: StateList = Field(default=(), description='a list of state strings, e.g. ["expired"]')
    awaiting_review: StateList = Field(
        default=(),
        description='a list of states in which a person must act at the provider, e.g. ["waiting"]',
    )

    @field_validator("pending", "succeeded", "failed", "cancelled", "expired", "awaiting_review")
    @classmethod
    def _states_are_exact(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for state in value:
            # States are compared exactly, so " running" would never match what
            # the provider sends: it is a typo, not a state.
            if state == "" or state != state.strip():
                raise refuse(
                    f"{state!r} is empty or has surrounding spaces",
                    "write the state exactly as the provider sends it",
                )
        return value

    @model_validator(mode="after")
    def _each_state_has_one_category(self) -> Self:
        seen: dict[str, Category] = {}
        for category in CATEGORIES:
            for state in self.of(category):
                first = seen.get(state)
                if first == category:
                    raise refuse(
                        f"{state!r} is listed twice under {category}",
                        "list each state once",
                        key=category,
                    )
                if first is not None:
                    raise refuse(
                        f"{state!r} is listed under both {first} and {category}",
                        "list each state under one category only",
                        key=first,
                    )
                seen[state] = category
        return self

    def of(self, category: Category) -> tuple[str, ...]:
        """Return the values listed under ``category`` (none for ``unknown``)."""
        match category:
            case Category.PENDING:
                return self.pending
            case Category.SUCCEEDED:
                return self.succeeded
            case Category.FAILED:
                return self.failed
            case Category.CANCELLED:
                return self.cancelled
            case Category.EXPIRED:
                return self.expired
            case Category.AWAITING_REVIEW:
                return self.awaiting_review
            case Category.UNKNOWN:
                return ()

    def listed(self) -> tuple[str, ...]:
        """Every listed value, in table order."""
        return tuple(state for category in CATEGORIES for state in self.of(category))

    def category_of(self, state: object) -> Category:
        """Return the category of ``state``: an exact, case-sensitive match, else ``unknown``."""
        if not isinstance(state, str):
            return Category.UNKNOWN
        # A str subclass could override __eq__; compare its plain-str value instead.
        plain = str.__str__(state)
        for category in CATEGORIES:
            if plain in self.of(category):
                return category
        return Category.UNKNOWN


class StatesSpec(_CategoryLists):
    """The provider's states by category. Matching is exact; any other value is ``unknown`` and stops."""


class RefineSpec(_CategoryLists):
    """A state whose meaning a second field decides (GitHub's ``completed`` plus its ``conclusion``).

    The refined state is reported as ``state/value`` (``completed/success``); a
    value listed nowhere, or a missing one, is ``unknown`` and stops.
    """

    field: str = Field(description='a dotted path into the JSON body, e.g. "conclusion"')

    @field_validator("field")
    @classmethod
    def _field_is_dotted(cls, value: str) -> str:
        check_dotted_path(value)
        return value

    @model_validator(mode="after")
    def _lists_something(self) -> Self:
        if not self.listed():
            raise refuse(
                f"no value of {self.field!r} is listed",
                'list the documented values by category, e.g. succeeded = ["success"]',
                key="succeeded",
            )
        return self


class NotFoundSpec(BaseModel):
    """The provider's documented meaning of a 404 on the status path.

    Within ``grace_seconds`` after start (for a job pollwarden submitted, after
    the submission that created it was sent) a 404 is eventual consistency
    (still pending); after ``retention_seconds`` from then it means the job
    expired; any other 404 is an integration failure.
    """

    model_config = MODEL_CONFIG

    grace_seconds: NonNegativeFloat = Field(default=0.0, description="a number of seconds >= 0, e.g. 30")
    retention_seconds: PositiveFloat | None = Field(
        default=None, description="a number of seconds > 0, e.g. 604800 (omit it if undocumented)"
    )

    @model_validator(mode="after")
    def _grace_ends_before_retention(self) -> Self:
        if self.retention_seconds is not None and self.grace_seconds > self.retention_seconds:
            raise refuse(
                "grace_seconds is longer than retention_seconds, so a 404 could mean pending and expired",
                "make grace_seconds at most retention_seconds",
                key="grace_seconds",
            )
        return self


class ExpirySpec(BaseModel):
    """How the provider's own expiry time (``response.expires_at_field``) is read.

    A pending state later than ``expires_at + grace_seconds`` is a contradiction,
    except the states in ``states_after_expiry``, which the provider documents
    as finishing after the expiry (OpenAI's ``finalizing`` and ``cancelling``).
    """

    model_config = MODEL_CONFIG

    grace_seconds: NonNegativeFloat = Field(
        default=0.0,
        description="a number of seconds >= 0, e.g. 3600: how late a batch may still be seen pending",
    )
    states_after_expiry: StateList = Field(
        default=(), description='pending states documented to end after the expiry, e.g. ["finalizing"]'
    )
    window_seconds: PositiveFloat | None = Field(
        default=None,
        description="a number of seconds > 0, e.g. 86400: the provider's documented processing window; the "
        "default deadline must cover it plus grace_seconds",
    )


class AwaitingReviewSpec(BaseModel):
    """Where a person acts when a job waits for them (states in the ``awaiting_review`` category).

    ``where`` (and each ``where_for`` text) may name the job id's parts as
    placeholders, e.g. ``{owner}``; they are filled in from the recorded job id,
    never from the provider's answer.
    """

    model_config = MODEL_CONFIG

    where: str = Field(
        description='text naming where a person acts, e.g. "the run\'s page on GitHub: Review deployments"'
    )
    where_for: dict[str, StrictStr] = Field(
        default_factory=dict[str, str],
        description='per-state text, e.g. "completed/action_required" = "the pull request: Approve and run"',
    )

    @field_validator("where")
    @classmethod
    def _where_is_short_plain_text(cls, value: str) -> str:
        return _check_where(value)

    @field_validator("where_for")
    @classmethod
    def _each_where_is_short_plain_text(cls, value: dict[str, str]) -> dict[str, str]:
        for text in value.values():
            _check_where(text)
        return value

    def where_of(self, state: str | None) -> str:
        """The text for `state` (its own, else the general one)."""
        return self.where_for.get(state or "", self.where)


def _check_where(value: str) -> str:
    if not value.strip() or len(value) > _MAX_WHERE or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise refuse(
            f"the text must be 1 to {_MAX_WHERE} characters on one line",
            'name the page and the button a person uses, e.g. "the run\'s page: Review deployments"',
        )
    if "{" in PLACEHOLDER_RE.sub("", value) or "}" in PLACEHOLDER_RE.sub("", value):
        raise refuse(f"{value[:60]!r} has an unmatched '{{' or '}}'", "remove it")
    return value
