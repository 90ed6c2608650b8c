"""Running the suite on pytest-xdist workers: how many, and the tests that must run with no other beside them.

How many: `-n auto` (pyproject's addopts) asks tests/conftest.py, which asks
`workers_for`. The pure tests alone (tests/unit) run in the pytest process
itself: they take about a second, less than starting workers. Anything else
gets `WORKERS_PER_CPU` workers per CPU, at most `MAX_WORKERS`: most of a test's
time is spent waiting on its server processes, the fake provider and the
databases, not computing, so two workers share a core well (measured on two
cores, README "One command runs the tests").

Alone: a test marked `alone` measures the server's timing against the wall
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

WORKERS_PER_CPU = 2
MAX_WORKERS = 8
ALONE = "alone"


def xdist_worker() -> str | None:
    """This pytest-xdist worker's id (gw0, gw1, ...), or None when the tests run in one process."""
    return os.environ.get("PYTEST_XDIST_WORKER") or None


def workers_for(args: Sequence[str], *, pure: Path) -> int:
    """The workers for a run of `args` (paths or node ids): none when all are under `pure` (tests/unit)."""
    paths = [Path(arg.split("::")[0]).resolve() for arg in args if not arg.startswith("-")]
    if paths and all(path.is_relative_to(pure.resolve()) for path in paths):
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(MAX_WORKERS, WORKERS_PER_CPU * cpus)


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
