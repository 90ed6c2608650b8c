"""How often, how much and with whose approval a table lets pollwarden ask the provider.

The local backoff (``[schedule]``), the request rate shared by every process
on one database (``[fleet]``), how the provider signals a rate limit besides a
plain 429 (``[rate_limit]``), the budgets and their caps (``[limits]``), and
whether a person approves each status request (``[approval]``).
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, Field, StrictStr, field_validator, model_validator

from pollwarden_providers.table_common import (
    MODEL_CONFIG,
    PositiveFloat,
    PositiveInt,
    check_dotted_path,
    check_header_name,
    has_control_or_space,
    refuse,
)

__all__ = ["ApprovalSpec", "FleetSpec", "LimitsSpec", "RateLimitSpec", "ScheduleSpec"]


class ScheduleSpec(BaseModel):
    """Local backoff: ``raw = min(max, base * 2**attempt)``, then drawn uniformly from [raw/2, raw]."""

    model_config = MODEL_CONFIG

    base_delay_seconds: PositiveFloat = Field(default=5.0, description="a number of seconds > 0, e.g. 5")
    max_delay_seconds: PositiveFloat = Field(default=120.0, description="a number of seconds > 0, e.g. 120")

    @model_validator(mode="after")
    def _base_within_max(self) -> Self:
        if self.base_delay_seconds > self.max_delay_seconds:
            raise refuse(
                f"base_delay_seconds ({self.base_delay_seconds:g}) is larger than "
                f"max_delay_seconds ({self.max_delay_seconds:g})",
                "make base_delay_seconds at most max_delay_seconds",
                key="base_delay_seconds",
            )
        return self


class FleetSpec(BaseModel):
    """A token bucket shared by every operation of this provider on one database."""

    model_config = MODEL_CONFIG

    max_requests_per_second: PositiveFloat = Field(description="a number > 0, e.g. 5")
    burst: int = Field(default=1, ge=1, description="a whole number >= 1, e.g. 5")


class RateLimitSpec(BaseModel):
    """How the provider signals a rate limit besides a plain 429 (GitHub: a 403 plus its headers)."""

    model_config = MODEL_CONFIG

    remaining_header: str | None = Field(
        default=None,
        description='an HTTP header name, e.g. "x-ratelimit-remaining" (a 403 with it at "0" is a rate limit)',
    )
    reset_header: str | None = Field(
        default=None,
        description='an HTTP header name, e.g. "x-ratelimit-reset" (Unix seconds; waited for without Retry-After)',
    )
    forbidden_with_retry_after: bool = Field(
        default=False, description="true or false: a 403 carrying Retry-After is a rate limit"
    )
    body_field: str | None = Field(
        default=None,
        description='a dotted path to the error text in the JSON body, e.g. "message" (used with body_contains)',
    )
    body_contains: Annotated[tuple[StrictStr, ...], Field(strict=False)] = Field(
        default=(),
        description='literal phrases, e.g. ["secondary rate limit"]: a 403 whose body_field contains one '
        "(ignoring case) is a rate limit",
    )
    min_wait_seconds: PositiveFloat | None = Field(
        default=None,
        description="a number of seconds > 0, e.g. 60: the documented shortest wait after a rate limit "
        "that gives no Retry-After (or reset time)",
    )

    @field_validator("remaining_header", "reset_header")
    @classmethod
    def _headers_are_tokens(cls, value: str | None) -> str | None:
        return check_header_name(value)

    @field_validator("body_field")
    @classmethod
    def _field_is_dotted(cls, value: str | None) -> str | None:
        return check_dotted_path(value)

    @field_validator("body_contains")
    @classmethod
    def _phrases_are_literal(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for phrase in value:
            if not 3 <= len(phrase) <= 100 or has_control_or_space(phrase.replace(" ", "")):
                raise refuse(
                    f"{phrase[:40]!r} is not a short literal phrase",
                    'write 3 to 100 plain characters as the provider documents them, e.g. "secondary rate limit"',
                )
        return value

    @model_validator(mode="after")
    def _phrases_need_a_field(self) -> Self:
        if bool(self.body_field) != bool(self.body_contains):
            raise refuse(
                "body_field and body_contains go together",
                'name the documented field and the phrases, e.g. body_field = "message" and '
                'body_contains = ["secondary rate limit"]',
                key="body_field" if self.body_contains else "body_contains",
            )
        return self


class LimitsSpec(BaseModel):
    """Budget defaults and the caps an operation may never be given more than."""

    model_config = MODEL_CONFIG

    default_deadline_seconds: PositiveFloat = Field(default=2400.0, description="a number of seconds > 0")
    max_deadline_seconds: PositiveFloat = Field(default=86400.0, description="a number of seconds > 0")
    default_max_status_requests: PositiveInt = Field(default=12, description="a whole number > 0")
    max_status_requests: PositiveInt = Field(default=200, description="a whole number > 0")
    max_transport_failures: PositiveInt = Field(default=3, description="a whole number > 0")
    max_rate_limited: PositiveInt = Field(default=3, description="a whole number > 0")

    @model_validator(mode="after")
    def _defaults_within_caps(self) -> Self:
        pairs: tuple[tuple[str, float, str, float], ...] = (
            ("default_deadline_seconds", self.default_deadline_seconds,
             "max_deadline_seconds", self.max_deadline_seconds),
            ("default_max_status_requests", self.default_max_status_requests,
             "max_status_requests", self.max_status_requests),
        )  # fmt: skip
        for default_key, default, cap_key, cap in pairs:
            if default > cap:
                raise refuse(
                    f"{default_key} ({default:g}) is larger than {cap_key} ({cap:g})",
                    f"make {default_key} at most {cap_key}",
                    key=default_key,
                )
        return self


class ApprovalSpec(BaseModel):
    """[approval]: when a person approves this provider's requests (README "Approvals").

    By default routine status requests inside approved bounds need no click.
    `every_status_request = true` is for high-privilege status APIs (ones that
    expose sensitive job metadata): a person approves each status request
    before it is sent.
    """

    model_config = MODEL_CONFIG

    every_status_request: bool = Field(
        default=False, description="true or false: a person approves each status request before it is sent"
    )
