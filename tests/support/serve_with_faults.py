"""`pollwarden serve` (stdio) with the crash tests' rigging, which the product does not carry.

    python -m tests.support.serve_with_faults --fault-step after_response --lease-seconds 4 \\
        serve --db DB --providers DIR

Takes every `pollwarden serve` flag, plus (before `serve`):

* ``--fault-step STEP``: SIGKILL this process when a status check reaches STEP
  (one of `pollwarden.flows.check_hooks.CHECK_BOUNDARIES`), through the controller's step hook;
* ``--lease-seconds N``: the lease on one in-flight request, shortened so a
  recovery after the crash is seen in seconds.

The hook writes ``fault hook: SIGKILL at STEP (pid N)`` to stderr first, which
the crash checks read.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Sequence

from pollwarden.cli.main import build_parser, serve_config, setup_logging
from pollwarden.flows.check_hooks import CHECK_BOUNDARIES, BoundaryHook, CheckBoundary, ignore_boundary
from pollwarden.surface.server import build_server, controller_factory

HOOK_LINE = "fault hook: SIGKILL at {step} (pid {pid})"


def kill_at(target: CheckBoundary | None) -> BoundaryHook:
    """A step hook that kills this process, hard, when a check reaches `target` (None: never)."""
    if target is None:
        return ignore_boundary

    def hook(step: CheckBoundary) -> None:
        if step == target:
            print(HOOK_LINE.format(step=step, pid=os.getpid()), file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the rigging flags, then serve over stdio as `pollwarden serve` would."""
    rigging = argparse.ArgumentParser(prog="python -m tests.support.serve_with_faults")
    rigging.add_argument("--fault-step", choices=CHECK_BOUNDARIES, default=None)
    rigging.add_argument("--lease-seconds", type=float, default=None)
    ours, rest = rigging.parse_known_args(argv)
    args = build_parser().parse_args(rest)
    if args.command != "serve" or args.transport != "stdio":
        rigging.error("only `serve` over stdio is rigged")
    setup_logging(verbose=bool(args.verbose))
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    config = dataclasses.replace(serve_config(args), lease_seconds=ours.lease_seconds)
    server = build_server(controller_factory(config, on_boundary=kill_at(ours.fault_step)))
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
