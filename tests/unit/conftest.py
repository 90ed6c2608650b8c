"""A unit test does no I/O: one that connects a socket, starts a process or opens a database fails at once."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
from typing import Any

import pytest


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a unit test does no I/O; a test that needs it belongs in tests/integration")


@pytest.fixture(autouse=True)
def no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse sockets, processes and databases for the test's duration."""
    monkeypatch.setattr(socket.socket, "connect", _refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    monkeypatch.setattr(sqlite3, "connect", _refuse)
