"""What a finished job hands over: the result fields a table names and their declared types.

What a success must carry (``[success]``), the fields documented for the other
end states (``[results]``), every such field's type (``[fields]``, with the
linear-time value patterns of ``pattern_problem``), and where a batch's request
counts are (``[counts]``). ``ProviderTable`` checks that every field named has
a type and every type is named.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, StrictStr, field_validator, model_validator

from pollwarden_providers.table_common import (
    MODEL_CONFIG,
    FieldList,
    PositiveInt,
    check_dotted_path,
    refuse,
)

__all__ = [
    "CountsSpec",
    "FieldSpec",
    "FieldType",
    "ResultsSpec",
    "SuccessSpec",
    "pattern_problem",
]

FieldType = Literal["string", "integer", "url", "object", "list", "any"]
"""The declared type of a result field (``[fields]``)."""

# A declared pattern is short; a value checked against a pattern is bounded too.
_MAX_PATTERN = 200


def _check_fields(value: tuple[str, ...]) -> tuple[str, ...]:
    for field in value:
        check_dotted_path(field)
    if len(set(value)) != len(value):
        raise refuse("a field is named twice", "name each field once")
    return value


class SuccessSpec(BaseModel):
    """What a success must carry; a success without these fields is a contradiction and stops.

    Every field named here needs a declared type in ``[fields]``.
    """

    model_config = MODEL_CONFIG

    required_fields: FieldList = Field(default=(), description='a list of dotted paths, e.g. ["result_url"]')
    required_one_of: FieldList = Field(
        default=(),
        description='dotted paths of which at least one must be present, e.g. ["output.file", "output.inline"]',
    )
    failure_fields: FieldList = Field(
        default=(),
        description='dotted paths, e.g. ["error_file_id"]: a success state without its required fields but '
        "with one of these is the provider's failure (every request failed), not a contradiction",
    )

    @field_validator("required_fields", "required_one_of", "failure_fields")
    @classmethod
    def _fields_are_dotted(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _check_fields(value)

    @model_validator(mode="after")
    def _one_of_means_two(self) -> Self:
        if len(self.required_one_of) == 1:
            raise refuse(
                "required_one_of names one field",
                "move it to required_fields, or name the alternatives it stands for",
                key="required_one_of",
            )
        return self


class ResultsSpec(BaseModel):
    """Result fields the provider documents for an end state other than success (partial results).

    After such a stop ``fetch_result`` returns the ones present (validated like a
    success's fields): OpenAI keeps the finished requests of an expired or
    cancelled batch in ``output_file_id``.
    """

    model_config = MODEL_CONFIG

    failed: FieldList = Field(default=(), description='a list of dotted paths, e.g. ["error_file_id"]')
    cancelled: FieldList = Field(default=(), description='a list of dotted paths, e.g. ["output_file_id"]')
    expired: FieldList = Field(default=(), description='a list of dotted paths, e.g. ["output_file_id"]')

    @field_validator("failed", "cancelled", "expired")
    @classmethod
    def _fields_are_dotted(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _check_fields(value)

    def of(self, category: str) -> tuple[str, ...]:
        """The fields documented for `category` (none for other categories)."""
        documented = {"failed": self.failed, "cancelled": self.cancelled, "expired": self.expired}
        return documented.get(category, ())


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is not an allowed value pattern, or None.

    Allowed: literal characters, escapes and character classes, each optionally
    repeated, with at most one repeated a variable number of times. Without
    groups, alternatives or a second variable repeat, a full match runs in
    linear time, so a table cannot make a provider's answer stall the server.
    """
    if len(pattern) > _MAX_PATTERN:
        return f"it is longer than {_MAX_PATTERN} characters"
    variable = 0
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch in "()|":
            return "groups and alternatives ( ) | are not supported"
        if ch in "^$":
            return "anchors are not needed: the whole value must match"
        if ch in "*+?{}":
            return f"{ch!r} at position {i} repeats nothing"
        if ch == "\\":
            if i + 1 >= n:
                return "it ends with a lone backslash"
            if pattern[i + 1].isdigit() or pattern[i + 1] in "bBAZgkpPN":
                return "backreferences, anchors and named escapes are not supported"
            i += 2
        elif ch == "[":
            j = i + 1
            j += 1 if j < n and pattern[j] == "^" else 0
            j += 1 if j < n and pattern[j] == "]" else 0
            while j < n and pattern[j] != "]":
                if pattern[j] == "[":
                    return "a '[' inside a character class is not supported"
                j += 2 if pattern[j] == "\\" else 1
            if j >= n:
                return "a character class is not closed with ']'"
            i = j + 1
        else:
            i += 1
        if i < n and pattern[i] in "*+?{":
            if pattern[i] == "{":
                repeat = re.match(r"\{([0-9]{1,4})(,([0-9]{0,4}))?\}", pattern[i:])
                if repeat is None:
                    return "a repeat in braces must be {n}, {m,n} or {m,}"
                i += repeat.end()
                variable += repeat.group(2) is not None
            else:
                i += 1
                variable += 1
            if i < n and pattern[i] in "*+?{":
                return "a repeat may not be followed by another (no lazy or possessive forms)"
    if variable > 1:
        return "more than one part repeats a variable number of times"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"it is not a valid pattern ({exc})"
    return None


class FieldSpec(BaseModel):
    """The declared type of a result field; a value that does not validate is never handed over."""

    model_config = MODEL_CONFIG

    type: FieldType = Field(description='"string", "integer", "url", "object", "list" or "any"')
    pattern: str | None = Field(
        default=None,
        description='for a string: a pattern the whole value matches, e.g. "file-[A-Za-z0-9]+"',
    )
    schemes: Annotated[tuple[StrictStr, ...], Field(strict=False)] = Field(
        default=("https",), description='for a url: the allowed schemes, e.g. ["https"]'
    )
    max_length: PositiveInt = Field(default=2048, description="for a string or url: a whole number > 0")
    minimum: int | None = Field(
        default=None, description="for an integer: the smallest allowed value, e.g. 0"
    )

    @field_validator("pattern")
    @classmethod
    def _pattern_is_linear(cls, value: str | None) -> str | None:
        if value is not None and (problem := pattern_problem(value)) is not None:
            raise refuse(
                f"the pattern {value[:60]!r} is refused: {problem}",
                'write literal text and character classes with one open repeat, e.g. "file-[A-Za-z0-9_-]{1,64}"',
            )
        return value

    @field_validator("schemes")
    @classmethod
    def _schemes_are_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or any(not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme) for scheme in value):
            raise refuse("schemes must be lower-case URL schemes", 'e.g. ["https"]')
        return value

    @model_validator(mode="after")
    def _options_fit_the_type(self) -> Self:
        misplaced = [
            name
            for name, applies, is_set in (
                ("pattern", self.type == "string", self.pattern is not None),
                ("schemes", self.type == "url", self.schemes != ("https",)),
                ("minimum", self.type == "integer", self.minimum is not None),
            )
            if is_set and not applies
        ]
        if misplaced:
            raise refuse(
                f"{misplaced[0]} does not apply to type {self.type!r}",
                f"remove {misplaced[0]}, or change the type",
                key=misplaced[0],
            )
        return self


class CountsSpec(BaseModel):
    """Where the provider reports how many requests of a batch ended how (dotted paths).

    Shown in the view on every answer. A success state whose ``succeeded``
    count is 0 while other requests are counted is not a success: it stops as
    ``cancelled`` when every counted request was cancelled, ``expired`` when
    every one expired, else ``provider_failure``.
    """

    model_config = MODEL_CONFIG

    succeeded: str | None = Field(default=None, description='a dotted path, e.g. "request_counts.succeeded"')
    errored: str | None = Field(default=None, description='a dotted path, e.g. "request_counts.errored"')
    cancelled: str | None = Field(default=None, description='a dotted path, e.g. "request_counts.canceled"')
    expired: str | None = Field(default=None, description='a dotted path, e.g. "request_counts.expired"')
    processing: str | None = Field(
        default=None, description='a dotted path, e.g. "request_counts.processing"'
    )
    total: str | None = Field(default=None, description='a dotted path, e.g. "request_counts.total"')

    @field_validator("succeeded", "errored", "cancelled", "expired", "processing", "total")
    @classmethod
    def _fields_are_dotted(cls, value: str | None) -> str | None:
        return check_dotted_path(value)

    def mapped(self) -> dict[str, str]:
        """Count name -> dotted path, for the counts the table maps, in display order."""
        paths = {
            "succeeded": self.succeeded,
            "errored": self.errored,
            "cancelled": self.cancelled,
            "expired": self.expired,
            "processing": self.processing,
            "total": self.total,
        }
        return {name: path for name, path in paths.items() if path is not None}
