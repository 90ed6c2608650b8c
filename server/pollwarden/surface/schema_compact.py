"""Compact tool output schemas: the same JSON Schema meaning in fewer bytes (`tools/list` stays small).

Pydantic's schemas repeat a generated ``title`` on every property and model,
spell an optional value as ``anyOf: [X, {"type": "null"}]`` and give output
fields a ``default`` no client reads. Every client receives every tool's
schema on each ``tools/list``; these three drop out without changing what a
valid result is (a client that validates structured content still accepts
exactly the same documents). Shared parts stay in ``$defs`` (one per tool:
an MCP tool schema must stand alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from mcp_types import Tool

__all__ = ["compact_schema", "with_loaded_providers", "without_repeated_prose"]

_NULL = {"type": "null"}


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` without generated titles and output defaults, optional scalars as a type list."""
    return cast("dict[str, Any]", _compact(schema, in_properties=False))


def _compact(node: object, *, in_properties: bool) -> object:
    if isinstance(node, list):
        return [_compact(item, in_properties=False) for item in cast("list[object]", node)]
    if not isinstance(node, dict):
        return node
    source = cast("dict[str, Any]", node)
    if in_properties:  # property names are data here, not keywords
        return {name: _compact(value, in_properties=False) for name, value in source.items()}
    out: dict[str, Any] = {}
    for key, value in source.items():
        if key == "title" or (key == "default" and value is None):
            continue
        out[key] = _compact(value, in_properties=key in ("properties", "$defs"))
    return _fold_optional(out)


def _fold_optional(schema: dict[str, Any]) -> dict[str, Any]:
    """``anyOf: [{"type": T, ...}, {"type": "null"}]`` → ``{"type": [T, "null"], ...}`` for a plain type."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or len(cast("list[object]", options)) != 2:
        return schema
    first, second = cast("list[object]", options)
    if second != _NULL or not isinstance(first, dict):
        return schema
    plain = cast("dict[str, Any]", first)
    kind = plain.get("type")
    if not isinstance(kind, str) or kind == "null" or set(plain) & set(schema) - {"anyOf"}:
        return schema
    folded = {k: v for k, v in schema.items() if k != "anyOf"}
    folded.update(plain)
    folded["type"] = [kind, "null"]
    return folded


REFERENCE_TOOL = "get_operation"


def without_repeated_prose(schemas: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each property description said once: in `REFERENCE_TOOL`'s output schema, not again in the others'.

    A property whose description is word for word the reference's loses it, and
    the schema's own description points there; what differs stays.
    """
    reference = schemas.get(REFERENCE_TOOL)
    if reference is None:
        return schemas
    said = {
        name: prop.get("description")
        for name, prop in cast("dict[str, dict[str, Any]]", reference.get("properties", {})).items()
        if prop.get("description")
    }
    note = f"Fields without a description here are described in {REFERENCE_TOOL}'s output schema."

    def trim(node: dict[str, Any]) -> dict[str, Any]:
        properties = cast("dict[str, dict[str, Any]]", node.get("properties", {}))
        repeated = {n for n, p in properties.items() if n in said and p.get("description") == said[n]}
        if not repeated:
            return node
        trimmed = {
            n: {k: v for k, v in p.items() if k != "description"} if n in repeated else p
            for n, p in properties.items()
        }
        own = node.get("description")
        return {**node, "properties": trimmed, "description": f"{own} {note}" if own else note}

    out: dict[str, dict[str, Any]] = {}
    for tool, schema in schemas.items():
        if tool == REFERENCE_TOOL:
            out[tool] = schema
            continue
        shared = cast("dict[str, dict[str, Any]]", schema.get("$defs", {}))
        compacted = trim(schema)
        if shared:  # an operation nested in another result (an extension's, a list's)
            compacted = {**compacted, "$defs": {name: trim(node) for name, node in shared.items()}}
        out[tool] = compacted
    return out


def with_loaded_providers(tool: Tool, names: Sequence[str]) -> Tool:
    """start_operation's `provider` argument naming the tables this server loaded (unchanged without names)."""
    properties = tool.input_schema.get("properties", {})
    if tool.name != "start_operation" or not names or "provider" not in properties:
        return tool
    listed = ", ".join(f"'{name}'" for name in names)
    provider = {
        **properties["provider"],
        "description": f"Provider table name, one of the loaded tables: {listed}.",
    }
    schema = {**tool.input_schema, "properties": {**properties, "provider": provider}}
    return tool.model_copy(update={"input_schema": schema})
