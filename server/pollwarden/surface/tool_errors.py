"""What an agent reads when a tool call is refused: the argument, what was wrong, what is accepted.

The SDK frames every tool error as "Error executing tool X: …" and reports
arguments that fail the input schema with pydantic's own text (the internal
model name, error codes, a documentation URL). These pure functions turn both
into one plain sentence per problem, naming the argument and its accepted range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from pollwarden.core.untrusted import shown

# Error kinds whose message already lists every accepted value.
_LISTS_THE_CHOICES = frozenset({"literal_error", "enum"})


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _branches(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The non-null alternatives of a property (`X | None` is an anyOf with null)."""
    options: Sequence[Mapping[str, Any]] = schema.get("anyOf") or [schema]
    return [o for o in options if o.get("type") != "null"]


def accepted(schema: Mapping[str, Any]) -> str:
    """What a property of an input schema accepts, in words ('a number from 0 to 50')."""
    alternatives: Sequence[Mapping[str, Any]] = schema.get("anyOf") or []
    nullable = any(o.get("type") == "null" for o in alternatives)
    words: list[str] = []
    for option in _branches(schema):
        kind = option.get("type")
        if "enum" in option:
            words.append("one of " + ", ".join(repr(v) for v in option["enum"]))
        elif kind in ("number", "integer"):
            noun = "a whole number" if kind == "integer" else "a number"
            low = option.get("minimum")
            low_open = option.get("exclusiveMinimum")
            high = option.get("maximum")
            parts = [noun]
            if low is not None and high is not None:
                parts.append(f"from {_number(low)} to {_number(high)}")
            else:
                if low is not None:
                    parts.append(f"of at least {_number(low)}")
                if low_open is not None:
                    parts.append(f"greater than {_number(low_open)}")
                if high is not None:
                    parts.append(f"of at most {_number(high)}")
            words.append(" ".join(parts))
        elif kind == "string":
            low, high = option.get("minLength"), option.get("maxLength")
            if high is not None:
                words.append(
                    f"text of {low or 0} to {high} characters"
                    if low
                    else f"text of at most {high} characters"
                )
            else:
                words.append("text")
        elif kind == "object":
            words.append("a JSON object")
        elif kind == "boolean":
            words.append("true or false")
        elif kind is not None:
            words.append(f"a JSON {kind}")
    text = " or ".join(words) or "a JSON value"
    return f"{text}, or omitted" if nullable else text


def _problem(error: ErrorDetails) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "the arguments"
    if error["type"] == "missing":
        return f"{where} is required"
    message = error["msg"]
    subject, should, rest = message.partition(" should ")
    if should and " " not in subject:  # "Input should be …", "String should have …"
        message = "must " + rest
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    else:
        message = "is not accepted: " + message[:1].lower() + message[1:]
    return f"{where} {message} (got {shown(error['input'])})"


def describe_invalid_arguments(exc: ValidationError, input_schema: Mapping[str, Any] | None) -> str:
    """One sentence per argument that failed the input schema, each with what the argument accepts."""
    properties: Mapping[str, Any] = (input_schema or {}).get("properties") or {}
    sentences: list[str] = []
    for error in exc.errors(include_url=False):
        sentence = _problem(error)
        name = str(error["loc"][0]) if error["loc"] else ""
        if name in properties and error["type"] not in _LISTS_THE_CHOICES:
            sentence += f"; {name} accepts {accepted(properties[name])}"
        sentences.append(sentence)
    return "; ".join(sentences) + "."


def unusable_text(arguments: Mapping[str, Any]) -> str | None:
    """The first argument holding text that is not valid Unicode (an unpaired surrogate), named."""

    def walk(value: object, where: str) -> str | None:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return where
        elif isinstance(value, dict):
            for key, item in cast(dict[object, object], value).items():
                found = walk(key, where) or walk(item, f"{where}.{key}")
                if found is not None:
                    return found
        elif isinstance(value, list):
            for i, item in enumerate(cast(list[object], value)):
                found = walk(item, f"{where}[{i}]")
                if found is not None:
                    return found
        return None

    for name, value in arguments.items():
        where = walk(value, name)
        if where is not None:
            return (
                f"{where} is not valid Unicode text (it holds an unpaired surrogate such as \\ud800); "
                "send it as UTF-8 text"
            )
    return None


def unknown_arguments(tool: str, arguments: Mapping[str, Any], input_schema: Mapping[str, Any]) -> str | None:
    """Arguments the tool does not have, named with the ones it has: a misspelt one is never silently ignored."""
    known: Mapping[str, Any] = input_schema.get("properties") or {}
    stray = [name for name in arguments if name not in known]
    if not stray:
        return None
    names = ", ".join(shown(name) for name in stray[:5])
    return f"{tool} has no argument {names}; its arguments are {', '.join(known)}"
