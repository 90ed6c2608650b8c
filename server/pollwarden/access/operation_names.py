"""An operator names an operation by the id an agent chose, with or without its owner (issue 29).

Over authenticated HTTP an operation is stored as ``@NAME/ID`` (`pollwarden.access.ownership`);
operators read ids from agents, who see only ``ID``. The operator's commands (`audit
show`, `audit export`) and the console accept either: the stored id as given, else the
one stored id that ends in ``/ID`` — and say so when several principals chose the same id.
Pure: the candidates come from the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pollwarden.access.ownership import RESERVED_PREFIX
from pollwarden.core.untrusted import shown


@dataclass(frozen=True)
class Named:
    """What a name given by an operator refers to: one stored id, or why not."""

    operation_id: str | None
    problem: str | None = None
    ambiguous: bool = False  # several principals chose this id


def owner_pattern(name: str) -> str:
    """A LIKE pattern (escape character backslash) for the stored ids ``@ANY/name``."""
    escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{RESERVED_PREFIX}%/{escaped}"


def resolve_name(name: str, stored: Iterable[str]) -> Named:
    """The stored id `name` means among `stored` (the ids equal to it or matching `owner_pattern`)."""
    ids = set(stored)
    if name in ids:
        return Named(name)
    owned = sorted(i for i in ids if i.startswith(RESERVED_PREFIX) and i.endswith("/" + name))
    if len(owned) == 1:
        return Named(owned[0])
    if not owned:
        return Named(None, f"no operation {shown(name)}")
    listed = ", ".join(shown(i) for i in owned[:10])
    return Named(
        None,
        f"{len(owned)} principals have an operation {shown(name)} ({listed}); give one with its owner, "
        f"e.g. {shown(owned[0])}",
        ambiguous=True,
    )
