"""Tamper-evident audit of controller decisions: rows, hashes, reading, anchors, export.

Every decision the controller takes (submission, each poll, each refusal, each
stop, each extension) is one row in the ``audit`` table. Each row stores the
hash of the row it follows (``prev_hash``) and its own hash over
``[position, operation_id, at, kind, payload, prev_hash]``. On SQLite every row
follows the row before it in one chain (its position is its seq); on
PostgreSQL an operation's rows after its first follow that operation's row
before them, under one chain of first rows and seals
(`pollwarden.audit.verify` says exactly how, and checks it). When the server
has ``POLLWARDEN_AUDIT_KEY`` in its environment the hash is an HMAC-SHA256
with that key (``keyed = 1``), so someone with write access to the database
but without the key cannot rewrite the chain consistently.

Writing is the store's: `pollwarden.audit.entry` builds a row's payload and
its link, and the engine inserts the row inside the transaction that made the
decision. Reading, anchoring and exporting here use plain ``sqlite3`` on a
read-only connection, so they work offline on a copy of the database file; on
PostgreSQL they read through a read-only session in one snapshot
(`pollwarden.store.postgres.offline`).

What the chain can and cannot prove:

* an edited row, a row deleted from the middle, a row replaced with a
  consistent but unkeyed forgery (when verifying with the key), a deleted
  operation are caught;
* a deleted tail, or a chain rewritten consistently by someone who holds the
  key (or when no key is used), is only caught against an :class:`Anchor`
  taken earlier and stored somewhere the database writer cannot reach.

A keyed server never extends an unkeyed chain. The only way from an unkeyed
chain to a keyed one is an explicit, audited re-key row
(`pollwarden.audit.verify.rekey_chain`, ``pollwarden audit rekey``), written
keyed on top of the unkeyed head after that head verified. Verifying with the
key then accepts the unkeyed rows before it only when the re-key row's seq is
named (``rekeyed_at``): they stay linked to it, so an edit made after the
re-key is caught, but the key cannot prove they were not rewritten before it.
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

from pollwarden.access.operation_names import owner_pattern
from pollwarden.core.canonical import canonical_json
from pollwarden.core.errors import AuditError, AuditKeyError
from pollwarden.core.files import write_private_file
from pollwarden.core.timefmt import rfc3339 as format_timestamp

if TYPE_CHECKING:
    from pollwarden.store.location import DatabaseLocation

# Where the audit lives: a SQLite file (a path), or any database location (a URL or a `DatabaseLocation`).

__all__ = [
    "AUDIT_KEY_ENV",
    "CHAIN",
    "GENESIS_HASH",
    "OPERATION_LINK",
    "REKEY_KIND",
    "SEAL_KIND",
    "Anchor",
    "AuditError",
    "AuditKeyError",
    "AuditRow",
    "anchor_from_text",
    "audit_key_from_env",
    "audit_rows_sql",
    "canonical_json",
    "export_jsonl",
    "format_timestamp",
    "hashed_middle",
    "key_problem",
    "open_read_only",
    "read_anchor",
    "read_rows",
    "row_hash",
    "write_anchor",
    "wrong_key",
]

AUDIT_KEY_ENV = "POLLWARDEN_AUDIT_KEY"
"""Environment variable holding the HMAC key (utf-8). Never printed or stored."""

GENESIS_HASH = "0" * 64
"""``prev_hash`` of the first row (seq 1)."""

REKEY_KIND = "audit_rekey"
"""``kind`` of the row that starts keying an unkeyed chain (written by :func:`rekey_chain`)."""
REKEY_OPERATION = "pollwarden-audit"
"""``operation_id`` of chain-level rows such as the re-key row and seals; no operation may take it."""
SEAL_KIND = "audit_seal"
"""``kind`` of a chain row naming every operation's chain head that moved since the seal before it."""
SEAL_KINDS = (SEAL_KIND, REKEY_KIND)
"""The kinds whose payload seals operations' chains (``"operations": [[id, rows, hash], …]``)."""

CHAIN = "chain"
"""``link`` of a row that follows the chain row before it (every row on SQLite)."""
OPERATION_LINK = "operation"
"""``link`` of a row that follows its own operation's row before it (PostgreSQL)."""

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
    ``key`` when a key is given. ``seq`` is the row's position: its place in the
    chain it follows (`AuditRow.position`).
    """
    message = canonical_json([seq, operation_id, at, kind, payload, prev_hash]).encode("utf-8")
    if key is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def hashed_middle(*, operation_id: str, at: str, kind: str, payload: str) -> str:
    """The part of a row's hashed message that does not depend on its place in the chain.

    The message `row_hash` hashes is ``"[" + str(position) + middle + '"' + prev_hash + '"]'``
    (``prev_hash`` is lowercase hex, which JSON needs no escaping for): what lets
    PostgreSQL hash an operation's first row in the statement that links it into
    the one chain, with every JSON escape done here.
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


def location_of(db: Path | str | DatabaseLocation) -> DatabaseLocation:
    """Where the audit lives: a SQLite file (a path), or any database location (a URL)."""
    from pollwarden.store.location import DatabaseLocation

    return db if isinstance(db, DatabaseLocation) else DatabaseLocation.parse(db)


# The chain's head: PostgreSQL keeps it in one row (its place in the chain, hash, keyed); SQLite's is
# its last row.
_HEAD = {
    True: "SELECT seq, keyed FROM audit ORDER BY seq DESC LIMIT 1",
    False: "SELECT seq, keyed FROM audit_head WHERE one",
}


def key_problem(
    db_path: Path | str | DatabaseLocation, key: bytes | None, *, verify_key: bool = True
) -> str | None:
    """Why a server with `key` (or without one) must not append to this chain, or None when it may.

    Checked when a server starts, before any request is sent: a chain whose
    head disagrees with the key would refuse the first audit row, and a status
    request's answer must never be sent without being recorded. `verify_key=False`:
    the key itself was checked already (`wrong_key`, when the store opened).
    """
    where = location_of(db_path)
    if where.is_sqlite and not where.path.is_file():
        return None
    with open_read_only(where) as conn:
        head = conn.execute(_HEAD[where.is_sqlite]).fetchone()
        if head is None or int(head[0]) == 0:
            return None
        mismatch = key_mismatch(int(head[0]), bool(head[1]), key)
        if mismatch is not None or not verify_key:
            return mismatch
        return _not_the_writers_key(conn, where, key)


def wrong_key(db_path: Path | str | DatabaseLocation, key: bytes) -> str | None:
    """Why `key` is not the key that wrote this keyed chain, or None (it is, or the chain is not keyed).

    Checked wherever a store opens with a key (servers and operator commands alike): a mistyped key
    would otherwise append rows that break the chain for the real key, and read as tampering later.
    """
    where = location_of(db_path)
    if where.is_sqlite and not where.path.is_file():
        return None
    with open_read_only(where) as conn:
        return _not_the_writers_key(conn, where, key)


def _not_the_writers_key(conn: AuditReader, where: DatabaseLocation, key: bytes | None) -> str | None:
    if key is None:
        return None
    per_operation = has_operation_chains(conn, where)
    found = conn.execute(
        f"{audit_rows_sql(per_operation=per_operation)} WHERE keyed ORDER BY seq DESC LIMIT 1"
    )
    raw = found.fetchone()
    if raw is None:
        return None
    row = audit_row(raw)
    if hmac.compare_digest(row.hash_with(key), row.hash):
        return None
    return (
        f"{AUDIT_KEY_ENV} is not the key that wrote the audit chain (its last keyed row, seq {row.seq}, does "
        "not verify with it): set the key the chain was written with; nothing was recorded "
        "(`pollwarden audit verify` with the right key tells whether the chain itself is intact)"
    )


# ---------------------------------------------------------------------------
# reading (sync, read-only, works on a copy of the file)


@dataclass(frozen=True)
class AuditRow:
    """One stored audit row; ``payload_obj`` is ``payload`` parsed (``{}`` if it is not a JSON object).

    ``seq`` orders every row; ``position`` is the number its hash covers, its place in the chain
    it follows: the one chain (``link`` CHAIN; there the position is the seq on SQLite) or its
    operation's own (``link`` OPERATION_LINK, PostgreSQL).
    """

    seq: int
    operation_id: str
    at: str
    kind: str
    payload: str
    prev_hash: str
    hash: str
    keyed: bool
    position: int = 0
    link: str = CHAIN
    payload_obj: dict[str, object] = field(default_factory=dict[str, object], compare=False, hash=False)

    def hash_with(self, key: bytes | None) -> str:
        """The hash this row's stored text has under `key` (None: unkeyed), for comparing with `hash`."""
        return row_hash(
            prev_hash=self.prev_hash,
            seq=self.position,
            operation_id=self.operation_id,
            at=self.at,
            kind=self.kind,
            payload=self.payload,
            key=key,
        )


@dataclass(frozen=True)
class Anchor:
    """The chain head at some moment: ``seq`` and ``hash`` of the last chain row, ``at`` when it was taken."""

    seq: int
    hash: str
    at: str


def audit_rows_sql(*, per_operation: bool) -> str:
    """The SELECT of every `AuditRow` column (no WHERE).

    `per_operation`: the database keeps per-operation chains (PostgreSQL from schema step 13), whose
    rows from before that step have neither `position` nor `link` set and are chain rows at their
    seq. Without (SQLite, or PostgreSQL before step 13), every row is a chain row at its seq.
    """
    place = "COALESCE(position, seq), COALESCE(link, 'chain')" if per_operation else "seq, 'chain'"
    return f"SELECT seq, operation_id, at, kind, payload, prev_hash, hash, keyed, {place} FROM audit"


_HAS_OPERATION_CHAINS = (
    "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() "
    "AND table_name = 'audit' AND column_name = 'link'"
)


def has_operation_chains(conn: AuditReader, where: DatabaseLocation) -> bool:
    """Whether this database keeps per-operation chains (PostgreSQL, migrated to step 13 or later)."""
    if where.is_sqlite:
        return False
    found = conn.execute(_HAS_OPERATION_CHAINS).fetchone()
    return found is not None and int(found[0]) > 0


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
def open_read_only(db: Path | str | DatabaseLocation) -> Generator[AuditReader]:
    """Open the database read-only, every read in one snapshot; never creates it, never writes to it."""
    where = location_of(db)
    if not where.is_sqlite:
        from pollwarden.store.postgres.read_only import read_only

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


def parse_payload(text: str) -> dict[str, object]:
    """A stored payload as an object (``{}`` when it is not a JSON object)."""
    try:
        value: object = json.loads(text)
    except ValueError:
        return {}
    return as_object_dict(value) or {}


def audit_row(raw: Sequence[object]) -> AuditRow:
    """One row of `audit_rows_sql` as an `AuditRow`."""
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
        position=int(str(raw[8])),
        link=str(raw[9]),
        payload_obj=parse_payload(payload),
    )


def iter_rows(
    conn: AuditReader, where: DatabaseLocation, operation_id: str | None = None
) -> Iterator[AuditRow]:
    """Every row (or only ``operation_id``'s) in seq order, from a connection `open_read_only` gave."""
    select = audit_rows_sql(per_operation=has_operation_chains(conn, where))
    if operation_id is None:
        cursor = conn.execute(select + " ORDER BY seq")
    else:
        cursor = conn.execute(select + " WHERE operation_id = ? ORDER BY seq", (operation_id,))
    for raw in cursor:
        yield audit_row(tuple(raw))


def read_rows(db_path: Path | str | DatabaseLocation, operation_id: str | None = None) -> list[AuditRow]:
    """All audit rows in seq order, or only those of ``operation_id``.

    Opens the file read-only (works on an offline copy). Raises :class:`AuditError`
    when the file or the audit table is missing.
    """
    where = location_of(db_path)
    with open_read_only(where) as conn:
        return list(iter_rows(conn, where, operation_id))


def audit_operation_ids(db_path: Path | str | DatabaseLocation, name: str) -> list[str]:
    """The operation ids in the audit that an operator's `name` may mean: itself, and ``@ANY/name``."""
    where = location_of(db_path)
    with open_read_only(where) as conn:
        cursor = conn.execute(
            "SELECT DISTINCT operation_id FROM audit WHERE operation_id = ? OR operation_id LIKE ? ESCAPE '\\'",
            (name, owner_pattern(name)),
        )
        return [str(row[0]) for row in cursor]


# The last row of the one chain (what an anchor records), without and with per-operation chains.
_LAST_CHAIN_ROW = {
    False: "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1",
    True: "SELECT seq, hash FROM audit WHERE COALESCE(link, 'chain') = 'chain' ORDER BY seq DESC LIMIT 1",
}


def write_anchor(db_path: Path | str | DatabaseLocation, out: Path) -> Anchor:
    """Record the current chain head (seq and hash of the last chain row) in a JSON file at ``out``.

    Keep the file where whoever can write the database cannot (another host, a
    ticket, a signed commit). An empty chain anchors seq 0 with the genesis hash.
    The file is private (0600) and written whole: an exclusive temporary file
    with a random name, then a rename that never writes through a symlink
    (:func:`pollwarden.core.files.write_private_file`). On PostgreSQL, seal the
    operations' chains first (`PostgresStore.seal`), so the
    anchor covers them too.
    """
    where = location_of(db_path)
    with open_read_only(where) as conn:
        head = conn.execute(_LAST_CHAIN_ROW[has_operation_chains(conn, where)]).fetchone()
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
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise AuditError(f"cannot read anchor file {path}: {exc}") from exc
    return anchor_from_text(text, path)


def anchor_from_text(text: str, path: object) -> Anchor:
    """An anchor from the text of an anchor file (`path` names it in errors); raises :class:`AuditError`."""
    try:
        document: object = json.loads(text)
    except ValueError as exc:
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
    re-verified without the database (``position`` is the number hashed, ``link``
    says which row it follows: `pollwarden.audit.verify`).
    """
    count = 0
    where = location_of(db_path)
    with open_read_only(where) as conn:
        for row in iter_rows(conn, where, operation_id):
            record: dict[str, object] = {
                "seq": row.seq,
                "position": row.position,
                "link": row.link,
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
