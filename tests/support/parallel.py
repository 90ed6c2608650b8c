"""Running the suite on pytest-xdist workers: the tests that must run with no other beside them.

A test marked `alone` measures the server's timing against the wall
clock with little slack (the two-process fleet pacing test allows 0.15 s for
a request to reach the provider after its slot). Other workers' processes on the
same cores add that much lag now and then, so it runs with nothing beside it:
`sharing_the_machine` is a reader-writer lock over one run's workers (a shared
lock per test; an exclusive one for a test marked `alone`), with a gate in front
so that once an `alone` test waits, no new test starts before it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ALONE = "alone"


def xdist_worker() -> str | None:
    """This pytest-xdist worker's id (gw0, gw1, ...), or None when the tests run in one process."""
    return os.environ.get("PYTEST_XDIST_WORKER") or None


@contextmanager
def sharing_the_machine(run_dir: Path, *, alone: bool) -> Iterator[None]:
    """Hold this run's test lock while one test runs: exclusively for an `alone` test, shared otherwise.

    The gate is taken exclusively first: for a moment by a shared test (just to pass it), and all
    through by an `alone` one, which then waits until every test already running has finished.
    """
    with (run_dir / "xdist-gate.lock").open("a") as gate, (run_dir / "xdist-tests.lock").open("a") as tests:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(tests, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)  # a no-op when it is not held
