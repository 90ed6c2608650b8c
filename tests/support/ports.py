"""TCP ports for servers a test starts itself: below the kernel's ephemeral range, one block per worker.

A port taken with ``bind(("127.0.0.1", 0))``, closed, and handed to a child
process is free only until something else takes it: the kernel hands out the
same ephemeral range to every ``bind(0)`` and every outgoing connection on the
machine, and with pytest-xdist other workers do both all the time (their fake
providers, consoles, PostgreSQL and HTTP connections). A test that expects
nothing to listen on the port, or a child that binds it a second later, then
fails by chance. The ports here come from just below that range, which the
kernel never hands out; each xdist worker has a block of its own, each port is
checked free before it is returned, and a process never returns one twice in a row.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

HOST = "127.0.0.1"
BLOCK = 400  # ports per worker
BLOCKS = 16  # workers with a block of their own (worker 16 shares worker 0's, and so on)
_DEFAULT_EPHEMERAL_LOW = 32768

_turn: dict[str, int] = {}


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3" in a worker, unset otherwise
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))  # without SO_REUSEADDR: a port in TIME_WAIT is not free either
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses now and the kernel will not hand to anyone else."""
    first = _ephemeral_low() - BLOCKS * BLOCK
    if first < 1024:  # an unusual ephemeral range: no room below it, fall back to one the kernel picks
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            return int(sock.getsockname()[1])
    start = first + (_worker_index() % BLOCKS) * BLOCK
    turn = _turn.setdefault("next", os.getpid() % BLOCK)
    for step in range(BLOCK):
        port = start + (turn + step) % BLOCK
        if _is_free(port):
            _turn["next"] = (turn + step + 1) % BLOCK
            return port
    raise RuntimeError(f"no free port in {start}-{start + BLOCK - 1} on {HOST}")
