"""Test-only fault hook: the step named in POLLWARDEN_FAULT_STEP kills the process with SIGKILL.

Used by the crash-injection tests (tests/test_crash.py, benchmarks/crash_matrix.py)
to stop the server hard at each step boundary of the check procedure. Unset in
normal use, where `fault_point` is one dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import signal

FAULT_ENV = "POLLWARDEN_FAULT_STEP"
FAULT_STEPS = ("after_reservation", "after_request_sent", "after_response", "before_persist")

log = logging.getLogger("pollwarden")


def fault_point(step: str) -> None:
    """Die here, hard, when the test-only fault hook names this step."""
    if os.environ.get(FAULT_ENV) == step:
        log.error("fault hook: SIGKILL at %s (pid %d)", step, os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
