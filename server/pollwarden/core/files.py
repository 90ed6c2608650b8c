"""Files pollwarden writes: private to their owner, written whole, never through a symlink.

The database holds every operation, approval and audit row; exports and
anchors are evidence; an operator key is a credential. So:

* the database, its ``-wal``/``-shm``, exports, anchors and keys are created
  readable and writable by their owner only (0600), and the data directory
  pollwarden creates is 0700;
* a database file (or companion) owned by another user, or writable by group
  or others, is refused: whoever else can write it can rewrite approvals and
  budgets;
* exports and anchors are written to a temporary file created exclusively
  (``O_EXCL``, random name, 0600) in the target directory, then renamed over
  the target. A rename replaces a symlink itself instead of writing through
  it, and a file in a shared sticky directory that belongs to someone else
  cannot be replaced (the rename fails with a clear error).

On systems without POSIX ownership (Windows) the ownership and mode checks
are skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import TextIO

from pollwarden.core.errors import StoreError

__all__ = [
    "DATABASE_COMPANIONS",
    "create_private_file",
    "ensure_private_dir",
    "missing_directory",
    "prepare_database_file",
    "private_file_problem",
    "write_private_file",
]

log = logging.getLogger("pollwarden")

DATABASE_COMPANIONS = ("-wal", "-shm", "-journal")
"""Files SQLite keeps beside the database; each is checked like the database itself."""

_POSIX = hasattr(os, "geteuid")


def ensure_private_dir(path: Path) -> None:
    """Create the directory `path` (and its parents) if missing; the directory itself is 0700."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)


def private_file_problem(path: Path, st: os.stat_result) -> str | None:
    """Why the existing file `path` cannot be trusted as private, or None.

    Another owner, or write access for group or others, means someone else can
    change what pollwarden reads.
    """
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if not _POSIX:
        return None
    uid = os.geteuid()
    if st.st_uid != uid:
        return (
            f"{path} belongs to user id {st.st_uid}, not to this user (id {uid}): another user could change "
            "what pollwarden reads. Use a database of your own (--db or POLLWARDEN_DB)"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{path} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):o}): they could "
            f"rewrite approvals and budgets. Make it private with: chmod 600 {path}"
        )
    return None


def trust_file_problem(path: Path, what: str, grants: str) -> str | None:
    """Why a file pollwarden trusts (`what`: the token file, the operator public keys file) cannot be, or None.

    The database's rules: a regular file, owned by this user (or root), not
    writable by its group or others — whoever can write it `grants` (adds a
    token, a key). A missing file is no problem here (its reader says so).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot inspect {what} {path}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{what} {path} is not a regular file"
    if not _POSIX:
        return None
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        return (
            f"{what} {path} belongs to user id {st.st_uid}, not to this user (id {uid}) or root: that user "
            f"{grants}. Keep your own copy, owned by you: cp {path} NEW && chmod 600 NEW"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{what} {path} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):o}): anyone who "
            f"can write it {grants}. Make it writable by its owner only with: chmod go-w {path}"
        )
    return None


def missing_directory(path: Path) -> StoreError:
    """The error for a database whose directory does not exist (nothing is created)."""
    return StoreError(
        f"the directory {path.parent} for the database does not exist; create it, or point --db / "
        "POLLWARDEN_DB at a writable location"
    )


def prepare_database_file(path: Path) -> None:
    """Check (or create) the database file before SQLite opens it.

    Refuses, with a `StoreError` naming the file and the fix, a database or
    companion file owned by another user or writable by group/others. Tightens
    an own file that others can read to 0600 (SQLite gives new ``-wal``/``-shm``
    files the database's mode). Creates a missing database as an empty 0600
    file, so SQLite never creates it with the process umask.
    """
    if not path.parent.is_dir():
        raise missing_directory(path)
    for candidate in (path, *(path.with_name(path.name + suffix) for suffix in DATABASE_COMPANIONS)):
        try:
            st = os.stat(candidate)
        except FileNotFoundError:
            if candidate.is_symlink():
                # SQLite would create the file wherever the link points.
                raise StoreError(
                    f"refusing the database: {candidate} is a symlink to a missing file; remove it"
                ) from None
            continue
        except OSError as exc:
            raise StoreError(f"cannot inspect the database file {candidate}: {exc.strerror}") from exc
        problem = private_file_problem(candidate, st)
        if problem is not None:
            raise StoreError(f"refusing the database: {problem}")
        mode = stat.S_IMODE(st.st_mode)
        if _POSIX and mode & 0o077:
            # Only take access away: a read-only file stays read-only.
            os.chmod(candidate, mode & 0o700)
            log.warning("made %s private (mode %o): others could read it", candidate, mode & 0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return  # another process created it first; it was checked above or is being created by us
    except OSError as exc:
        raise StoreError(
            f"cannot create the database {path} ({exc.strerror}): is its directory writable? "
            "Set --db or POLLWARDEN_DB to a writable location"
        ) from exc
    os.close(fd)


@contextlib.contextmanager
def write_private_file(target: Path) -> Generator[TextIO]:
    """Write `target` whole, private (0600), replacing it without ever writing through a symlink.

    Yields a text handle on a temporary file created exclusively (random name,
    ``O_EXCL``, 0600) in the target's directory; on a clean exit the file is
    flushed to disk and renamed over `target`. On an error the temporary file
    is removed and `target` is untouched. Raises `OSError` (with the reason)
    when the directory is missing or the target cannot be replaced.
    """
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def create_private_file(target: Path, data: bytes) -> None:
    """Create `target` (0600) holding `data`; never replaces an existing file or follows a symlink.

    The data is written to an exclusive temporary file first and then linked
    into place, so `target` appears complete or not at all. Raises
    `FileExistsError` when `target` (or a symlink by that name) exists.
    """
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
