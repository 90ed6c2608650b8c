"""The clock and the random source, injected so decisions can be replayed."""

from __future__ import annotations

import random
import time
from typing import Protocol

import anyio
import anyio.lowlevel


class Clock(Protocol):
    """Wall-clock time in epoch seconds, and a way to wait."""

    def now(self) -> float:
        """Seconds since the epoch, UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        await anyio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that only moves when told to, or when something sleeps on it."""

    def __init__(self, start: float = 1_744_971_600.0) -> None:  # 2025-04-18T10:20:00Z
        self.t = start

    def now(self) -> float:
        """The current fake time."""
        return self.t

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.t += seconds

    async def sleep(self, seconds: float) -> None:
        """Jump forward instead of sleeping; yield once so other tasks run."""
        self.t += max(0.0, seconds)
        await anyio.lowlevel.checkpoint()


class RandomSource(Protocol):
    """Uniform floats in [0, 1)."""

    def random(self) -> float:
        """A uniform float in [0, 1)."""
        ...


def system_random() -> RandomSource:
    """The default random source: one `random.Random` seeded by the OS."""
    return random.Random()
