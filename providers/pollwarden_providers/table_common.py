"""What every section of a provider table is built from: the model settings, the number types, the refusal.

All models are frozen: a loaded table is shared by every operation and must not
change under them. Numbers are strict (no ``"5"`` for 5, no ``true`` for 1) and
must be finite, because TOML accepts ``inf`` and ``nan`` and neither is a
sensible delay or budget. A value that is wrong is refused with ``refuse``,
which carries the fix (and the key) to the loader's message.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import ConfigDict, Field, StrictStr
from pydantic_core import PydanticCustomError

__all__ = [
    "ENV_RE",
    "MODEL_CONFIG",
    "PLACEHOLDER_RE",
    "FieldList",
    "NonNegativeFloat",
    "PositiveFloat",
    "PositiveInt",
    "StateList",
    "check_dotted_path",
    "check_header_name",
    "has_control_or_space",
    "refuse",
]

# hide_input_in_errors: a mistaken table may hold a secret (a token pasted into
# auth.env, a password in base_url); a logged ValidationError must not show it.
MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)

# Annotated field types. ``strict=False`` on the tuples only lets a TOML array
# (a Python list) become a tuple; the items themselves stay strict strings.
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0)]
StateList = Annotated[tuple[StrictStr, ...], Field(strict=False)]
FieldList = Annotated[tuple[StrictStr, ...], Field(strict=False)]

ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# RFC 9110 token: anything else would be refused by the HTTP client at request
# time, which is far later and far less clear than refusing the table.
_HEADER_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
PLACEHOLDER_RE = re.compile(r"\{[^{}]*\}")


def refuse(problem: str, fix: str, key: str | None = None) -> PydanticCustomError:
    """Build a validation error that carries its own fix (and, from a model-level check, its key).

    The loader reads ``table_problem``/``table_fix``/``table_key`` from the error
    context to build a precise TableError; the rendered message keeps both parts
    so the models read well when validated directly, too.
    """
    context: dict[str, str] = {"table_problem": problem, "table_fix": fix}
    if key is not None:
        context["table_key"] = key
    # pydantic fills the template from the context by name only, so a literal
    # "{job_id}" inside a problem survives rendering.
    return PydanticCustomError("provider_table", "{table_problem} — {table_fix}", context)


def has_control_or_space(value: str) -> bool:
    """Whether `value` holds a space, a tab or newline, or another control character."""
    return any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value)


def check_header_name(value: str | None) -> str | None:
    """Refuse a header name that is not an RFC 9110 token; return it (``None`` passes)."""
    if value is not None and not _HEADER_RE.fullmatch(value):
        raise refuse(
            f"{value!r} is not a valid HTTP header name",
            'use letters, digits and "-" only, e.g. "X-Request-Id"',
        )
    return value


def check_dotted_path(value: str | None) -> str | None:
    """Refuse a dotted path into the JSON body with an empty segment; return it (``None`` passes)."""
    # Dotted paths are split on "." by the interpreter; an empty segment would
    # silently look up a key named "" instead of failing here.
    if value is not None and (value == "" or any(part == "" for part in value.split("."))):
        raise refuse(
            f"{value!r} is not a dotted path into the JSON body",
            'write field names joined by ".", e.g. "result.url"',
        )
    return value
