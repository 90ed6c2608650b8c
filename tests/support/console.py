"""Starting `pollwarden console` as a person would: on a pseudo-terminal (tests only)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

from pollwarden.store import DatabaseLocation


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without any POLLWARDEN_ variable, plus `extra`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}
    return {**base, **(extra or {})}


@asynccontextmanager
async def console_at_terminal(
    db: Path | DatabaseLocation, *args: str, env: dict[str, str] | None = None
) -> AsyncGenerator[tuple[subprocess.Popen[bytes], str]]:
    """`pollwarden console` on a pseudo-terminal: the process and everything it showed up to its URL (or exit)."""
    where = db if isinstance(db, Path) else db.dsn or str(db.path)
    master, slave = pty.openpty()
    proc = subprocess.Popen(  # noqa: ASYNC220 - a pty child, read with select below
        [sys.executable, "-m", "pollwarden", "console", "--db", str(where), "--port", "0", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=clean_env(env),
        close_fds=True,
    )
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and not re.search(rb"token=\S+\s", shown):
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        yield proc, shown.decode("utf-8", "replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
