"""What an operation keeps of the provider's result: validated fields and request counts.

Both live in the record's one ``result_json`` column (no schema change): the
fields of a success, or those a table documents for another end state
(partial results, an error file), and the last request counts the provider
reported. A value written before counts existed (a bare object of fields)
still reads as fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

_FORMAT = 2


@dataclass(frozen=True)
class StoredResult:
    """The decoded ``result_json``."""

    fields: dict[str, object] = field(default_factory=dict[str, object])
    counts: dict[str, int] = field(default_factory=dict[str, int])


def encode_result(fields: Mapping[str, object], counts: Mapping[str, int]) -> str:
    """The ``result_json`` text for `fields` and `counts`."""
    return json.dumps({"v": _FORMAT, "fields": dict(fields), "counts": dict(counts)})


def decode_result(text: str | None) -> StoredResult:
    """Read ``result_json`` (None, a bare object of fields, or the current form)."""
    if not text:
        return StoredResult()
    value = json.loads(text)
    if not isinstance(value, dict):
        return StoredResult()
    data = cast(dict[str, object], value)
    if data.get("v") != _FORMAT:
        return StoredResult(fields=data)
    fields = data.get("fields")
    counts = data.get("counts")
    return StoredResult(
        fields=cast(dict[str, object], fields) if isinstance(fields, dict) else {},
        counts={
            str(k): v
            for k, v in cast(dict[object, object], counts).items()
            if isinstance(v, int) and not isinstance(v, bool)
        }
        if isinstance(counts, dict)
        else {},
    )
