"""The console's anchor files: only regular files, by name, from the one directory the operator configured.

A page's query names a file (``?anchor=NAME``), never a path: the name is one
path component, opened relative to the configured directory without following
a symlink and without blocking (a FIFO is refused, not waited on), and read
only when it is a regular file no larger than the cap. Without a configured
directory the console verifies the chain without an anchor.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pollwarden.audit.chain import Anchor, AuditError, anchor_from_text
from pollwarden.core.untrusted import quoted

__all__ = ["MAX_ANCHOR_BYTES", "read_named_anchor"]

MAX_ANCHOR_BYTES = 64 * 1024  # an anchor is ~150 bytes; anything near this is not one


def read_named_anchor(directory: Path | None, name: str, max_bytes: int = MAX_ANCHOR_BYTES) -> Anchor:
    """The anchor in file `name` of `directory`; raises `AuditError` naming what was wrong and what to do."""
    if directory is None:
        raise AuditError(
            "this console reads no anchor files: start it with --anchor-dir DIR (the directory "
            "`pollwarden audit anchor --out` writes to) to verify against one"
        )
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise AuditError(f"anchor {quoted(name)} must be a file name in the anchor directory, not a path")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise AuditError(f"cannot open the anchor directory {directory}: {exc.strerror}") from exc
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise AuditError(
            f"cannot open anchor {quoted(name)} in the anchor directory: {exc.strerror} (symbolic links are refused)"
        ) from exc
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise AuditError(f"anchor {quoted(name)} is not a regular file; nothing was read")
        if info.st_size > max_bytes:
            raise AuditError(f"anchor {quoted(name)} is {info.st_size} bytes, over the {max_bytes}-byte cap")
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    try:
        text = data[:max_bytes].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AuditError(f"anchor {quoted(name)} is not UTF-8 text") from exc
    return anchor_from_text(text, quoted(name))
