"""Canonical JSON: the one encoding pollwarden hashes or signs (audit rows, operator decisions, fingerprints)."""

from __future__ import annotations

import json


def canonical_json(value: object) -> str:
    """Serialize ``value`` as canonical JSON: sorted keys, no spaces, utf-8 text, no NaN.

    The same value always gives the same string, which is what is hashed or signed.
    Raises ``TypeError`` for values JSON cannot represent (datetimes must be
    formatted first, e.g. with `timefmt.rfc3339`) and ``ValueError`` for NaN or
    infinities.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
