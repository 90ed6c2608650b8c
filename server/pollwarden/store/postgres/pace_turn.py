"""One process's turn at a provider's pace row: its checks wait for the row one at a time, here.

Each paced check holds the pace row's lock for a round trip; the others of the process wait
in this queue, holding no connection. A wait that ends without the turn says why: turns went
by (`PaceTurnBusy`: the checks come faster than they reach the row, so the check is told when
to come back), or none did (`PaceTurnStuck`: the row, or the turn, is held).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

import anyio

from pollwarden.core.errors import StoreError


class PaceTurnStuck(StoreError):
    """No turn went by while a check waited for its own: the pace row, or the turn, is held."""


class PaceTurnBusy(StoreError):
    """Turns went by while a check waited for its own, but not soon enough for it."""

    def __init__(self, *, waiting: int, served: int, waited: float) -> None:
        super().__init__(f"{served} turns went by in {waited:g} s; {waiting} checks still wait")
        self.waiting = waiting  # the checks still waiting, this one among them
        self.served = served  # the turns that ended committed while it waited
        self.waited = waited


class PaceTurn:
    """One provider's turn: one transaction of this process at a time waits for its pace row."""

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self.served = 0  # turns whose transaction ended without an error

    @property
    def waiting(self) -> int:
        """The checks queued for the turn."""
        return self._lock.statistics().tasks_waiting

    @asynccontextmanager
    async def take(self, wait_at_most: float) -> AsyncGenerator[None]:
        """Hold the turn for the body, after waiting for it at most `wait_at_most` s."""
        served = self.served
        with anyio.move_on_after(wait_at_most) as waited:
            await self._lock.acquire()
        if waited.cancelled_caught:
            if self.served > served:
                raise PaceTurnBusy(waiting=self.waiting + 1, served=self.served - served, waited=wait_at_most)
            raise PaceTurnStuck
        try:
            yield
            self.served += 1
        finally:
            self._lock.release()
