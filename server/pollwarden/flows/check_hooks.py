"""The boundaries of a status check, and the hook an embedding program may watch them with.

A check reserves (counts the request and takes the lease), sends, reads the
answer, decides, and persists. `Controller.on_boundary` and `ProviderHTTP` call the
hook with each boundary's name as the check passes it; by default it does
nothing. The crash tests pass a hook that kills the process at one boundary, to
prove the counter and the lease survive any crash (tests/support/serve_with_faults.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

CheckBoundary = Literal["after_reservation", "after_request_sent", "after_response", "before_persist"]
CHECK_BOUNDARIES: tuple[CheckBoundary, ...] = get_args(CheckBoundary)

BoundaryHook = Callable[[CheckBoundary], None]


def ignore_boundary(step: CheckBoundary) -> None:
    """The default hook: a check runs straight through."""
    del step
