"""Tamper-evident audit chain of controller decisions.

Every decision the controller takes (submission, each poll, each refusal, each
stop, each extension) is one row in the ``audit`` table. Rows form a hash
chain: row *n* stores the hash of row *n-1* (``prev_hash``) and its own hash
over ``[seq, operation_id, at, kind, payload, prev_hash]``. When the server has
``POLLWARDEN_AUDIT_KEY`` in its environment the hash is an HMAC-SHA256 with that
key (``keyed = 1``), so someone with write access to the database file but
without the key cannot rewrite the chain consistently.

Writing is the store's: `pollwarden.audit_entry` builds a row's payload and
its link to the chain head, and the engine reads the head and inserts the row
inside the transaction that made the decision. Reading, verifying, anchoring
and exporting here use plain ``sqlite3`` on a read-only connection, so they
work offline on a copy of the database file; on PostgreSQL they read through a
read-only session (`pollwarden.store.postgres.offline`).

What the chain can and cannot prove:

* an edited row, a row deleted from the middle, a row replaced with a
  consistent but unkeyed forgery (when verifying with the key) are caught;
* a deleted tail, or a chain rewritten consistently by someone who holds the
  key (or when no key is used), is only caught against an :class:`Anchor`
  taken earlier and stored somewhere the database writer cannot reach.

A keyed server never extends an unkeyed chain: :func:`append_audit` refuses.
The only way from an unkeyed chain to a keyed one is an explicit, audited
re-key row (:func:`rekey_chain`, ``pollwarden audit rekey``), written keyed on
top of the unkeyed head after that head verified. Verifying with the key then
accepts the unkeyed rows before it only when the re-key row's seq is named
(``rekeyed_at``): they stay linked to it, so an edit made after the re-key is
caught, but the key cannot prove they were not rewritten before it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
import urllib.parse
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO, cast

from pollwarden.canonical import canonical_json
from pollwarden.errors import AuditError, AuditKeyError
from pollwarden.files import write_private_file
from pollwarden.timefmt import rfc3339 as format_timestamp

if TYPE_CHECKING:
    from pollwarden.store.location import DatabaseLocation

# Where the audit lives: a SQLite file (a path), or any database location (a URL or a `DatabaseLocation`).

__all__ = [
    "AUDIT_KEY_ENV",
    "GENESIS_HASH",
    "REKEY_KIND",
    "Anchor",
    "AuditError",
    "AuditKeyError",
    "AuditRow",
    "VerifyResult",
    "audit_key_from_env",
    "canonical_json",
    "describe_mode",
    "export_jsonl",
    "format_timestamp",
    "hashed_middle",
    "key_problem",
    "read_anchor",
    "read_rows",
    "rekey_chain",
    "row_hash",
    "verify_chain",
    "write_anchor",
]

AUDIT_KEY_ENV = "POLLWARDEN_AUDIT_KEY"
"""Environment variable holding the HMAC key (utf-8). Never printed or stored."""

GENESIS_HASH = "0" * 64
"""``prev_hash`` of the first row (seq 1)."""

REKEY_KIND = "audit_rekey"
"""``kind`` of the row that starts keying an unkeyed chain (written by :func:`rekey_chain`)."""
REKEY_OPERATION = "pollwarden-audit"
"""``operation_id`` of chain-level rows such as the re-key row."""

_ANCHOR_FORMAT = "pollwarden-audit-anchor/1"
_HEX = frozenset("0123456789abcdef")


# ---------------------------------------------------------------------------
# hashing


def row_hash(
    *,
    prev_hash: str,
    seq: int,
    operation_id: str,
    at: str,
    kind: str,
    payload: str,
    key: bytes | None,
) -> str:
    """Hash of one audit row, as lowercase hex.

    SHA-256 over the canonical JSON of ``[seq, operation_id, at, kind, payload,
    prev_hash]`` (``payload`` is the stored JSON *text*), or HMAC-SHA256 with
    ``key`` when a key is given.
    """
    message = canonical_json([seq, operation_id, at, kind, payload, prev_hash]).encode("utf-8")
    if key is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def hashed_middle(*, operation_id: str, at: str, kind: str, payload: str) -> str:
    """The part of a row's hashed message that does not depend on its place in the chain.

    The message `row_hash` hashes is ``"[" + str(seq) + middle + '"' + prev_hash + '"]'``
    (``prev_hash`` is lowercase hex, which JSON needs no escaping for): what lets
    PostgreSQL hash a row in the statement that links it, with every JSON escape
    done here.
    """
    return "," + ",".join(canonical_json(part) for part in (operation_id, at, kind, payload)) + ","


def audit_key_from_env(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The audit HMAC key from ``POLLWARDEN_AUDIT_KEY`` (utf-8 bytes), or None if unset or empty."""
    value = environ.get(AUDIT_KEY_ENV)
    if not value:
        return None
    return value.encode("utf-8")


# ---------------------------------------------------------------------------
# writing


def key_mismatch(head_seq: int, head_keyed: bool, key: bytes | None) -> str | None:
    """Why a row with `key` (or without one) must not extend a head keyed `head_keyed`, or None."""
    if head_keyed and key is None:
        return f"the audit chain is keyed (head seq {head_seq}); set {AUDIT_KEY_ENV} to append to it"
    if key is not None and not head_keyed:
        return (
            f"the audit chain is not keyed (head seq {head_seq}) but {AUDIT_KEY_ENV} is set: a keyed server "
            "never extends an unkeyed chain silently. Run `pollwarden audit rekey` once with the key set "
            f"(it verifies the chain, then writes an audited re-key row), or unset {AUDIT_KEY_ENV}; "
            "nothing was recorded"
        )
    return None


class _Rows(Protocol):
    def fetchone(self) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...


class AuditReader(Protocol):
    """What the readers need of a connection: `execute(sql with ? placeholders, parameters)`."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> _Rows: ...


def _location(db: Path | str | DatabaseLocation) -> DatabaseLocation:
    from pollwarden.store.location import DatabaseLocation

    return db if isinstance(db, DatabaseLocation) else DatabaseLocation.parse(db)


def key_problem(db_path: Path | str | DatabaseLocation, key: bytes | None) -> str | None:
    """Why a server with `key` (or without one) must not append to this chain, or None when it may.

    Checked when a server starts, before any request is sent: a chain whose
    head disagrees with the key would refuse the first audit row, and a status
    request's answer must never be sent without being recorded.
    """
    where = _location(db_path)
    if where.is_sqlite and not where.path.is_file():
        return None
    with _open_ro(where) as conn:
        head = conn.execute("SELECT seq, keyed FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
    return None if head is None else key_mismatch(int(head[0]), bool(head[1]), key)


# ---------------------------------------------------------------------------
# reading (sync, read-only, works on a copy of the file)


@dataclass(frozen=True)
class AuditRow:
    """One stored audit row; ``payload_obj`` is ``payload`` parsed (``{}`` if it is not a JSON object)."""

    seq: int
    operation_id: str
    at: str
    kind: str
    payload: str
    prev_hash: str
    hash: str
    keyed: bool
    payload_obj: dict[str, object] = field(default_factory=dict[str, object], compare=False, hash=False)


@dataclass(frozen=True)
class Anchor:
    """The chain head at some moment: ``seq`` and ``hash`` of the last row, ``at`` when it was taken."""

    seq: int
    hash: str
    at: str


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify_chain`.

    ``first_broken_seq`` is the first seq that fails (for a deleted row: the
    missing seq); ``problem`` says what is wrong. ``head_seq``/``head_hash``
    describe the last row read. ``mode`` is how the chain was checked:
    ``"keyed"`` (every row authenticated with the key), ``"rekeyed"`` (keyed
    from the named re-key row on; ``unkeyed_prefix`` unkeyed rows before it) or
    ``"unkeyed"`` (plain SHA-256, no key given). :func:`describe_mode` says what
    each can and cannot detect.
    """

    ok: bool
    rows_checked: int
    first_broken_seq: int | None
    problem: str | None
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    unkeyed_prefix: int = 0
    mode: str = "unkeyed"


def describe_mode(result: VerifyResult) -> list[str]:
    """What a verification in ``result.mode`` detects and what it cannot, in plain words."""
    if result.mode == "keyed":
        return [
            f"mode: keyed (HMAC-SHA256 with {AUDIT_KEY_ENV}); every row is authenticated by the key",
            "detects: an edited, inserted, deleted or reordered row, and any rewrite by someone without the key",
            "cannot detect: a deleted tail (verify against an anchor kept elsewhere: --anchor), or a rewrite "
            "by someone who holds the key",
        ]
    if result.mode == "rekeyed":
        return [
            f"mode: keyed from the re-key row at seq {result.unkeyed_prefix + 1} on (HMAC-SHA256 with "
            f"{AUDIT_KEY_ENV}); the {result.unkeyed_prefix} rows before it are unkeyed",
            "detects: any change after the re-key, and any edit of the unkeyed rows made after the re-key "
            "(they are linked to the re-key row)",
            "cannot detect: a rewrite of the unkeyed rows before the re-key, a deleted tail (use --anchor), or a "
            "rewrite by someone who holds the key",
        ]
    return [
        f"mode: unkeyed (plain SHA-256; {AUDIT_KEY_ENV} not given)",
        "detects: accidental edits and rows deleted from the middle",
        "cannot detect: a chain rewritten consistently by anyone who can write the database file, or a deleted "
        f"tail; if the server uses {AUDIT_KEY_ENV}, set it here too (then unkeyed rows fail), and keep anchors "
        "elsewhere (--anchor)",
    ]


_SELECT_ROWS = "SELECT seq, operation_id, at, kind, payload, prev_hash, hash, keyed FROM audit"


def _ro_uri(db_path: Path, *, immutable: bool = False) -> str:
    quoted = urllib.parse.quote(str(db_path.resolve()), safe="/")
    return f"file:{quoted}?mode=ro" + ("&immutable=1" if immutable else "")


def _connect_ro(db_path: Path, *, immutable: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(_ro_uri(db_path, immutable=immutable), uri=True)
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


@contextmanager
def _open_ro(db: Path | str | DatabaseLocation) -> Generator[AuditReader]:
    """Open the database read-only; never creates it, never writes to it."""
    where = _location(db)
    if not where.is_sqlite:
        from pollwarden.store.postgres.offline import read_only

        with read_only(where) as reader:
            yield reader
        return
    db_path = where.path
    if not db_path.is_file():
        raise AuditError(f"audit database not found: {db_path}")
    try:
        conn = _connect_ro(db_path, immutable=False)
    except sqlite3.DatabaseError:
        # A WAL database on a read-only medium cannot get its -shm file; such a
        # copy is not being written to, so reading it as immutable is safe.
        try:
            conn = _connect_ro(db_path, immutable=True)
        except sqlite3.DatabaseError as exc:
            raise AuditError(f"cannot read audit database {db_path}: {exc}") from exc
    with closing(conn):
        try:
            conn.execute("SELECT 1 FROM audit LIMIT 1").fetchall()
        except sqlite3.DatabaseError as exc:
            raise AuditError(f"no readable audit table in {db_path}: {exc}") from exc
        yield conn


def as_object_dict(value: object) -> dict[str, object] | None:
    """`value` as a dict with string keys, or None when it is not a dict (parsed JSON of unknown shape)."""
    if not isinstance(value, dict):
        return None
    items = cast("dict[object, object]", value)
    return {str(k): v for k, v in items.items()}


def _parse_payload(text: str) -> dict[str, object]:
    try:
        value: object = json.loads(text)
    except ValueError:
        return {}
    return as_object_dict(value) or {}


def _to_row(raw: tuple[object, ...]) -> AuditRow:
    payload = str(raw[4])
    return AuditRow(
        seq=int(str(raw[0])),
        operation_id=str(raw[1]),
        at=str(raw[2]),
        kind=str(raw[3]),
        payload=payload,
        prev_hash=str(raw[5]),
        hash=str(raw[6]),
        keyed=bool(raw[7]),
        payload_obj=_parse_payload(payload),
    )


# What a store reads for one operation's story (its engine runs it; see `pollwarden.store.browse`).
SELECT_AUDIT_ROWS_OF = _SELECT_ROWS + " WHERE operation_id = {operation_id} ORDER BY seq"


def audit_row(raw: Sequence[object]) -> AuditRow:
    """One row of ``SELECT_AUDIT_ROWS_OF`` as an `AuditRow`."""
    return _to_row(tuple(raw))


def _iter_rows(conn: AuditReader, operation_id: str | None) -> Iterator[AuditRow]:
    if operation_id is None:
        cursor = conn.execute(_SELECT_ROWS + " ORDER BY seq")
    else:
        cursor = conn.execute(_SELECT_ROWS + " WHERE operation_id = ? ORDER BY seq", (operation_id,))
    for raw in cursor:
        yield _to_row(tuple(raw))


def read_rows(db_path: Path | str | DatabaseLocation, operation_id: str | None = None) -> list[AuditRow]:
    """All audit rows in chain order, or only those of ``operation_id``.

    Opens the file read-only (works on an offline copy). Raises :class:`AuditError`
    when the file or the audit table is missing.
    """
    with _open_ro(db_path) as conn:
        return list(_iter_rows(conn, operation_id))


def _rekey_seq(conn: AuditReader) -> int | None:
    row = conn.execute("SELECT seq FROM audit WHERE kind = ? ORDER BY seq LIMIT 1", (REKEY_KIND,)).fetchone()
    return None if row is None else int(row[0])


def verify_chain(
    db_path: Path | str | DatabaseLocation,
    key: bytes | None,
    anchor: Anchor | None = None,
    *,
    rekeyed_at: int | None = None,
) -> VerifyResult:
    """Check the whole chain and return where it first breaks, if anywhere.

    Checks, row by row in seq order: seqs are contiguous from 1 (a gap names the
    deleted seq), ``prev_hash`` equals the previous row's hash, and the stored
    hash matches the recomputed one. With ``key`` every row must be keyed: an
    unkeyed row cannot be authenticated, so a chain rewritten with plain SHA-256
    by someone without the key is caught. The one exception is a chain re-keyed
    by :func:`rekey_chain`: naming the re-key row's seq as ``rekeyed_at`` accepts
    the unkeyed rows before it (never after it); the row at that seq must be the
    keyed re-key row. Without ``key``, a keyed row cannot be checked and
    verification fails with a request to set ``POLLWARDEN_AUDIT_KEY``. With
    ``anchor`` the head must have reached the anchored seq and that row must
    still carry the anchored hash (catches a truncated or rewritten tail).
    Raises :class:`AuditError` if the database cannot be read.
    """
    expected_seq = 1
    prev_hash = GENESIS_HASH
    checked = 0
    unkeyed_prefix = 0
    seen_keyed = False
    anchored_hash: str | None = None
    mode = "unkeyed" if key is None else ("rekeyed" if rekeyed_at is not None else "keyed")

    def broken(seq: int, problem: str) -> VerifyResult:
        return VerifyResult(
            ok=False,
            rows_checked=checked,
            first_broken_seq=seq,
            problem=problem,
            head_seq=expected_seq - 1,
            head_hash=prev_hash,
            unkeyed_prefix=unkeyed_prefix,
            mode=mode,
        )

    with _open_ro(db_path) as conn:
        rekey_seq = _rekey_seq(conn)
        for raw in conn.execute(_SELECT_ROWS + " ORDER BY seq"):
            seq, operation_id, at, kind, payload, stored_prev, stored_hash, keyed_flag = raw
            seq = int(seq)
            if seq != expected_seq:
                if seq < expected_seq:  # cannot happen with an INTEGER PRIMARY KEY, but be explicit
                    return broken(seq, f"seq {seq} appears out of order")
                missing = (
                    f"row {expected_seq} is missing"
                    if seq == expected_seq + 1
                    else f"rows {expected_seq}..{seq - 1} are missing"
                )
                return broken(expected_seq, f"seq gap: {missing} (deleted from the chain)")
            keyed = bool(keyed_flag)
            if key is not None and seq == rekeyed_at and (not keyed or str(kind) != REKEY_KIND):
                return broken(
                    seq, f"row {seq} is not the keyed re-key row ({REKEY_KIND}) named by --rekeyed-at"
                )
            if keyed:
                seen_keyed = True
                if key is None:
                    return broken(seq, f"row {seq} is keyed (HMAC); set {AUDIT_KEY_ENV} to verify")
            elif key is not None:
                if seen_keyed:
                    return broken(
                        seq,
                        f"row {seq} is not keyed although earlier rows are: "
                        "rewritten without the key (downgrade to plain SHA-256)",
                    )
                if rekeyed_at is None or seq >= rekeyed_at:
                    hint = (
                        f"; the chain was re-keyed at seq {rekey_seq}: pass --rekeyed-at {rekey_seq} to accept the "
                        f"{rekey_seq - 1} unkeyed rows before it, which the key cannot authenticate"
                        if rekey_seq is not None and rekeyed_at is None
                        else ""
                    )
                    return broken(
                        seq,
                        f"row {seq} is not keyed, so the key cannot authenticate it "
                        f"(rewritten without the key, or written before the key was set){hint}",
                    )
                unkeyed_prefix += 1
            if not hmac.compare_digest(str(stored_prev), prev_hash):
                return broken(seq, f"prev_hash of row {seq} does not match the hash of row {seq - 1}")
            recomputed = row_hash(
                prev_hash=str(stored_prev),
                seq=seq,
                operation_id=str(operation_id),
                at=str(at),
                kind=str(kind),
                payload=str(payload),
                key=key if keyed else None,
            )
            if not hmac.compare_digest(recomputed, str(stored_hash)):
                reason = "row edited" + (", or the key differs from the one that wrote it" if keyed else "")
                return broken(seq, f"hash mismatch at row {seq} ({reason})")
            checked += 1
            expected_seq = seq + 1
            prev_hash = str(stored_hash)
            if anchor is not None and seq == anchor.seq:
                anchored_hash = prev_hash

    head_seq = expected_seq - 1
    if key is not None and rekeyed_at is not None and rekeyed_at > head_seq:
        return broken(head_seq + 1, f"--rekeyed-at {rekeyed_at} is beyond the head (seq {head_seq})")
    if anchor is not None:
        if anchor.seq > head_seq:
            return broken(
                head_seq + 1,
                f"anchor at seq {anchor.seq} is beyond the head (seq {head_seq}): tail truncated",
            )
        if anchor.seq == 0:
            anchored_hash = GENESIS_HASH
        if anchored_hash is None or not hmac.compare_digest(anchored_hash, anchor.hash):
            return broken(anchor.seq, f"row {anchor.seq} hash differs from the anchor: chain rewritten")
    return VerifyResult(
        ok=True,
        rows_checked=checked,
        first_broken_seq=None,
        problem=None,
        head_seq=head_seq,
        head_hash=prev_hash,
        unkeyed_prefix=unkeyed_prefix,
        mode=mode,
    )


def refuse_unless_rekeyable(result: VerifyResult) -> None:
    """Raise AuditKeyError unless a verified chain may be re-keyed: not empty, intact, not keyed yet."""
    if result.rows_checked == 0 and result.ok:
        raise AuditKeyError(
            "the audit chain is empty: a server with the key starts it keyed; nothing to re-key"
        )
    if not result.ok:
        keyed = result.problem is not None and "is keyed" in result.problem
        raise AuditKeyError(
            "the audit chain is already keyed; nothing to re-key"
            if keyed
            else f"refusing to re-key a broken chain (seq {result.first_broken_seq}: {result.problem})"
        )


def rekey_chain(db_path: Path | str | DatabaseLocation, key: bytes, *, by: str, at: datetime) -> int:
    """Start keying an unkeyed chain: verify it, then append the keyed re-key row; return its seq.

    The only way a keyed server may continue an unkeyed chain. Under the write
    lock (so nothing is appended in between) the whole unkeyed chain must
    verify; the re-key row records who re-keyed it, how many unkeyed rows it
    follows and the head hash it links to. Raises :class:`AuditKeyError` when
    the chain is empty (a keyed server starts it keyed), already keyed, or broken.
    """
    from pollwarden.store.sqlite.rows import append_audit  # the engine's one append path

    where = _location(db_path)
    if not where.is_sqlite:
        from pollwarden.store.postgres.offline import rekey

        return rekey(where, key, by=by, at=at)
    db_path = where.path
    with closing(sqlite3.connect(str(db_path), isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = verify_chain(db_path, None)
            refuse_unless_rekeyable(result)
            seq = append_audit(
                conn,
                operation_id=REKEY_OPERATION,
                at=at,
                kind=REKEY_KIND,
                payload={
                    "decision": REKEY_KIND,
                    "note": f"re-keyed by {by}: rows after this one are HMAC-keyed",
                    "by": by,
                    "unkeyed_rows": result.head_seq,
                    "unkeyed_head_hash": result.head_hash,
                },
                key=key,
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return seq


def write_anchor(db_path: Path | str | DatabaseLocation, out: Path) -> Anchor:
    """Record the current chain head (seq and hash) in a JSON file at ``out`` and return it.

    Keep the file where whoever can write the database cannot (another host, a
    ticket, a signed commit). An empty chain anchors seq 0 with the genesis hash.
    The file is private (0600) and written whole: an exclusive temporary file
    with a random name, then a rename that never writes through a symlink
    (:func:`pollwarden.files.write_private_file`).
    """
    with _open_ro(db_path) as conn:
        head = conn.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
    seq, digest = (0, GENESIS_HASH) if head is None else (int(head[0]), str(head[1]))
    anchor = Anchor(seq=seq, hash=digest, at=format_timestamp(datetime.now(UTC)))
    out = Path(out)
    document = {"format": _ANCHOR_FORMAT, "seq": anchor.seq, "hash": anchor.hash, "at": anchor.at}
    with write_private_file(out) as handle:
        handle.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return anchor


def read_anchor(path: Path) -> Anchor:
    """Load an anchor written by :func:`write_anchor`; raises :class:`AuditError` if it is malformed."""
    try:
        document: object = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AuditError(f"cannot read anchor file {path}: {exc}") from exc
    doc = as_object_dict(document)
    if doc is None:
        raise AuditError(f"anchor file {path} is not a JSON object")
    seq, digest, at = doc.get("seq"), doc.get("hash"), doc.get("at")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise AuditError(f"anchor file {path}: 'seq' must be a non-negative integer")
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
        raise AuditError(f"anchor file {path}: 'hash' must be 64 lowercase hex characters")
    if not isinstance(at, str):
        raise AuditError(f"anchor file {path}: 'at' must be a string")
    return Anchor(seq=seq, hash=digest, at=at)


def export_jsonl(db_path: Path | str | DatabaseLocation, out: TextIO, operation_id: str | None = None) -> int:
    """Write one JSON object per audit row (chain order) to ``out``; return the number of rows.

    Each object has every column; ``payload`` is the parsed object and
    ``payload_text`` the exact stored text the hash covers, so an export can be
    re-verified without the database.
    """
    count = 0
    with _open_ro(db_path) as conn:
        for row in _iter_rows(conn, operation_id):
            record: dict[str, object] = {
                "seq": row.seq,
                "operation_id": row.operation_id,
                "at": row.at,
                "kind": row.kind,
                "payload": row.payload_obj,
                "payload_text": row.payload,
                "prev_hash": row.prev_hash,
                "hash": row.hash,
                "keyed": row.keyed,
            }
            out.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
            count += 1
    return count
