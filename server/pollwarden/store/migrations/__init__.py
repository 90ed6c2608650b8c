"""The schema of both engines, as frozen numbered steps: `sqlite` and `postgres`, and which steps a database still has to run.

Step numbers are handed out ahead of time, so a step can ship after a higher
one did: step 8 (operation owners, issue 19) shipped after steps 9 and 12.
A version number alone cannot tell whether such a late step ran, so each
engine also records the numbers of the steps it ran. A database without that
record was last migrated before it existed: it ran every step up to its
version except the late ones, which no release before the record had.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

__all__ = ["LATE_STEPS", "pending"]

# Steps released after a step with a higher number (12 shipped before them): absent from every
# database migrated before the engines recorded the steps they ran. 10 and 11 are reserved numbers
# not yet released; listed so that they run on such a database when they are.
LATE_STEPS: frozenset[int] = frozenset({8, 10, 11})


def pending(numbers: Iterable[int], *, version: int, recorded: Set[int] | None) -> list[int]:
    """The step numbers still to run, in number order.

    `version` is the highest step the database says it ran; `recorded` the step
    numbers it recorded, or None when it has no record yet.
    """
    if recorded is None:
        recorded = {n for n in numbers if n <= version and n not in LATE_STEPS}
    return sorted(n for n in set(numbers) if n not in recorded)
