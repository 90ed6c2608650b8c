"""Verifying the audit: the one chain, and the operations' chains that hang from it.

Every row is linked to the row before it by ``prev_hash``, and its ``hash``
covers ``[position, operation_id, at, kind, payload, prev_hash]``:

* a **chain row** (``link`` "chain") follows the chain row before it; its
  position is its place in the one chain, from 1. On SQLite every row is a
  chain row (one writer at a time: the one chain costs nothing), and its
  position is its seq; so are the rows PostgreSQL wrote before schema step 13.
* an **operation row** (``link`` "operation", PostgreSQL) follows the row of
  its own operation before it; its position is its place among that
  operation's rows. A transaction that answers one operation touches only that
  operation's chain, so processes answering different operations never wait
  for each other (one chain for all capped PostgreSQL at about 900 answers a
  second here, issue 18).

An operation's first row (its opening) is always a chain row, so deleting an
operation leaves a gap in the one chain. A **seal** (``audit_seal``, and the
re-key row) is a chain row that lists each operation's row count and last hash
where they moved since the seal before: rows deleted from the end of an
operation's chain are caught once a seal named them. ``audit anchor`` seals
first, so an anchor covers every operation. What stays uncaught is the same as
for one chain: a tail written after the last seal or anchor.

`check_rows` is the check itself, pure: rows in seq order in, a
`VerifyResult` out, keeping one entry per operation. `verify_chain` reads the
database (read-only, one snapshot) and runs it.
"""

from __future__ import annotations

import hmac
import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pollwarden.audit.chain import (
    AUDIT_KEY_ENV,
    CHAIN,
    GENESIS_HASH,
    OPERATION_LINK,
    REKEY_KIND,
    REKEY_OPERATION,
    SEAL_KINDS,
    Anchor,
    AuditKeyError,
    AuditRow,
    has_operation_chains,
    iter_rows,
    location_of,
    open_read_only,
    parse_payload,
)

if TYPE_CHECKING:
    from pollwarden.store.location import DatabaseLocation

__all__ = [
    "VerifyResult",
    "check_rows",
    "describe_mode",
    "refuse_unless_rekeyable",
    "rekey_chain",
    "seal_entries",
    "verify_chain",
]


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify_chain`.

    ``first_broken_seq`` is the seq of the first row that fails (for a deleted
    chain row: its missing place in the chain, which is its seq where every row
    is a chain row); ``problem`` says what is wrong. ``head_seq``/``head_hash``
    describe the last chain row read (what an anchor records). ``mode`` is how
    the chain was checked: ``"keyed"`` (every row authenticated with the key),
    ``"rekeyed"`` (keyed from the re-key row at ``rekey_seq`` on;
    ``unkeyed_prefix`` unkeyed rows before it) or ``"unkeyed"`` (plain SHA-256,
    no key given). :func:`describe_mode` says what each can and cannot detect.
    """

    ok: bool
    rows_checked: int
    first_broken_seq: int | None
    problem: str | None
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    unkeyed_prefix: int = 0
    mode: str = "unkeyed"
    rekey_seq: int | None = None
    operations: int = 0
    per_operation: bool = False  # some operation keeps a chain of its own (PostgreSQL)


# Where operations keep chains of their own (PostgreSQL), what "the tail" is.
_TAILS = (
    "a deleted tail means the rows written after the last anchor, and, of each operation, its rows "
    "written after the last seal naming it (a serving process seals every minute; `audit anchor` seals first)"
)


def describe_mode(result: VerifyResult) -> list[str]:
    """What a verification in ``result.mode`` detects and what it cannot, in plain words."""
    lines = _describe_mode(result)
    return [*lines, _TAILS] if result.per_operation else lines


def _describe_mode(result: VerifyResult) -> list[str]:
    if result.mode == "keyed":
        return [
            f"mode: keyed (HMAC-SHA256 with {AUDIT_KEY_ENV}); every row is authenticated by the key",
            "detects: an edited, inserted, deleted or reordered row, and any rewrite by someone without the key",
            "cannot detect: a deleted tail (verify against an anchor kept elsewhere: --anchor), or a rewrite "
            "by someone who holds the key",
        ]
    if result.mode == "rekeyed":
        return [
            f"mode: keyed from the re-key row at seq {result.rekey_seq} on (HMAC-SHA256 with "
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


def seal_entries(payload: str) -> list[tuple[str, int, str]]:
    """What a seal's payload names: (operation id, its row count, its last row's hash) for each operation.

    A payload not of a seal's shape names nothing; its row's own hash is checked with the rest, so an
    edited seal is caught there.
    """
    entries = parse_payload(payload).get("operations")
    named: list[tuple[str, int, str]] = []
    if not isinstance(entries, list):
        return named
    for entry in entries:  # pyright: ignore[reportUnknownVariableType]
        if isinstance(entry, list) and len(entry) == 3:  # pyright: ignore[reportUnknownArgumentType]
            op, rows, digest = entry  # pyright: ignore[reportUnknownVariableType]
            if isinstance(op, str) and isinstance(rows, int) and isinstance(digest, str):
                named.append((op, rows, digest))
    return named


@dataclass
class _Chain:
    """One operation's chain so far: how many rows, and the last one's hash."""

    rows: int
    last_hash: str
    last_seq: int


def _missing(first: int, last: int, what: str) -> str:
    return f"{what} {first} is missing" if first == last else f"{what}s {first}..{last} are missing"


def check_rows(
    rows: Iterable[AuditRow],
    *,
    key: bytes | None,
    anchor: Anchor | None = None,
    rekeyed_at: int | None = None,
    rekey_seq: int | None = None,
    recorded: Mapping[str, tuple[int, str | None]] | None = None,
) -> VerifyResult:
    """Check rows given in seq order; where the chain first breaks, if anywhere (pure).

    Each chain row must take the next place in the one chain and link to the chain row before it;
    each operation row the next place in its operation's chain, linking to that operation's row
    before it; every stored hash must match the recomputed one. With ``key`` every row must be
    keyed, except the unkeyed rows before the re-key row named by ``rekeyed_at`` (its seq).
    A seal (`SEAL_KINDS`, a chain row) must find each operation it names with exactly the rows it
    names before it in seq order, the last one carrying the hash it names (the seal held each named
    operation's row while it read it, so no row of theirs can fall between): a row cut from an
    operation's end, inserted, or moved across a seal is caught.
    ``recorded``: each operation's row count and last hash as its own row records them
    (PostgreSQL), which must agree with its chain. With ``anchor`` the anchored row must be a
    chain row still carrying the anchored hash.
    """
    expected_position = 1
    chain_hash = GENESIS_HASH
    head_seq = 0
    checked = 0
    unkeyed_prefix = 0
    seen_keyed = False
    anchored_hash: str | None = None
    chains: dict[str, _Chain] = {}
    per_operation = False
    mode = "unkeyed" if key is None else ("rekeyed" if rekeyed_at is not None else "keyed")

    def result(first_broken: int | None = None, problem: str | None = None) -> VerifyResult:
        return VerifyResult(
            ok=problem is None,
            rows_checked=checked,
            first_broken_seq=first_broken,
            problem=problem,
            head_seq=head_seq,
            head_hash=chain_hash,
            unkeyed_prefix=unkeyed_prefix,
            mode=mode,
            rekey_seq=rekeyed_at if rekeyed_at is not None else rekey_seq,
            operations=len(chains),
            per_operation=per_operation,
        )

    for row in rows:
        seq = row.seq
        mine = chains.get(row.operation_id)
        if row.link == CHAIN:
            if row.position != expected_position:
                if row.position < expected_position:
                    return result(seq, f"row {seq} repeats place {row.position} of the chain")
                if row.position == seq:  # every row a chain row: the place is the seq
                    missing = _missing(expected_position, seq - 1, "row")
                    return result(expected_position, f"seq gap: {missing} (deleted from the chain)")
                missing = _missing(expected_position, row.position - 1, "chain row")
                return result(expected_position, f"chain gap before row {seq}: {missing} (deleted)")
            linked_to = chain_hash
            before = f"row {seq - 1}" if row.position == seq else "the chain row before it"
        elif row.link == OPERATION_LINK:
            if mine is None:
                return result(
                    seq,
                    f"row {seq} continues the chain of operation {row.operation_id!r}, which has no first "
                    "row: its opening row was deleted, or this row was inserted",
                )
            if row.position != mine.rows + 1:
                if row.position <= mine.rows:
                    return result(seq, f"row {seq} repeats place {row.position} of {row.operation_id!r}")
                missing = _missing(mine.rows + 1, row.position - 1, "row")
                return result(seq, f"before row {seq}, {row.operation_id!r}'s {missing} (deleted)")
            linked_to = mine.last_hash
            before = f"{row.operation_id!r}'s row before it"
            per_operation = True
        else:
            return result(seq, f"row {seq} has an unknown link {row.link!r}")

        if key is not None and seq == rekeyed_at and (not row.keyed or row.kind != REKEY_KIND):
            return result(seq, f"row {seq} is not the keyed re-key row ({REKEY_KIND}) named by --rekeyed-at")
        if row.keyed:
            seen_keyed = True
            if key is None:
                return result(seq, f"row {seq} is keyed (HMAC); set {AUDIT_KEY_ENV} to verify")
        elif key is not None:
            if seen_keyed:
                return result(
                    seq,
                    f"row {seq} is not keyed although earlier rows are: "
                    "rewritten without the key (downgrade to plain SHA-256)",
                )
            if rekeyed_at is None or seq >= rekeyed_at:
                hint = (
                    f"; the chain was re-keyed at seq {rekey_seq}: pass --rekeyed-at {rekey_seq} to accept the "
                    "unkeyed rows before it, which the key cannot authenticate"
                    if rekey_seq is not None and rekeyed_at is None
                    else ""
                )
                return result(
                    seq,
                    f"row {seq} is not keyed, so the key cannot authenticate it "
                    f"(rewritten without the key, or written before the key was set){hint}",
                )
            unkeyed_prefix += 1
        if not hmac.compare_digest(row.prev_hash, linked_to):
            return result(seq, f"prev_hash of row {seq} does not match the hash of {before}")
        if not hmac.compare_digest(row.hash_with(key if row.keyed else None), row.hash):
            reason = "row edited" + (", or the key differs from the one that wrote it" if row.keyed else "")
            return result(seq, f"hash mismatch at row {seq} ({reason})")

        checked += 1
        if row.link == CHAIN:
            expected_position += 1
            chain_hash = row.hash
            head_seq = seq
        if row.operation_id == REKEY_OPERATION:
            # A row about the chain itself (a seal, the re-key) belongs to no operation's chain.
            if row.kind in SEAL_KINDS:
                for op, count, digest in seal_entries(row.payload):
                    named = chains.get(op)
                    have = 0 if named is None else named.rows
                    if have != count or named is None or not hmac.compare_digest(named.last_hash, digest):
                        problem = (
                            f"{_missing(have + 1, count, 'row')} (deleted)"
                            if have < count
                            else f"it has {have} rows before it, ending otherwise (rows inserted, moved or rewritten)"
                        )
                        return result(
                            seq, f"the seal at row {seq} names {count} rows of operation {op!r}: {problem}"
                        )
        else:
            if mine is None:
                mine = chains[row.operation_id] = _Chain(0, GENESIS_HASH, 0)
            mine.rows += 1
            mine.last_hash = row.hash
            mine.last_seq = seq
        if anchor is not None and seq == anchor.seq:
            if row.link != CHAIN:
                return result(seq, f"the anchor names row {seq}, which is not a row of the one chain")
            anchored_hash = row.hash

    for op, (rows_recorded, last_hash) in (recorded or {}).items():
        have = chains.get(op)
        if (
            have is None
            or have.rows != rows_recorded
            or (last_hash is not None and have.last_hash != last_hash)
        ):
            count = 0 if have is None else have.rows
            return result(
                head_seq + 1 if have is None else have.last_seq,
                f"operation {op!r} records {rows_recorded} audit rows, but its chain holds {count}: rows were "
                "deleted from its end, or written behind its back",
            )
    if key is not None and rekeyed_at is not None and rekeyed_at > head_seq:
        return result(head_seq + 1, f"--rekeyed-at {rekeyed_at} is beyond the head (seq {head_seq})")
    if anchor is not None:
        if anchor.seq > head_seq:
            return result(
                head_seq + 1,
                f"anchor at seq {anchor.seq} is beyond the head (seq {head_seq}): tail truncated",
            )
        if anchor.seq == 0:
            anchored_hash = GENESIS_HASH
        if anchored_hash is None or not hmac.compare_digest(anchored_hash, anchor.hash):
            return result(anchor.seq, f"row {anchor.seq} hash differs from the anchor: chain rewritten")
    return result()


# Everything a verification reads, in one snapshot (`open_read_only` gives one on PostgreSQL).
_REKEY_SEQ = "SELECT seq FROM audit WHERE kind = ? ORDER BY seq LIMIT 1"
# Each operation's own record of its chain (PostgreSQL's operations table; SQLite keeps none).
_RECORDED_HEADS = "SELECT operation_id, audit_rows, audit_hash FROM operations WHERE audit_rows > 0"


def verify_chain(
    db_path: Path | str | DatabaseLocation,
    key: bytes | None,
    anchor: Anchor | None = None,
    *,
    rekeyed_at: int | None = None,
) -> VerifyResult:
    """Check the whole audit and return where it first breaks, if anywhere (`check_rows`).

    Reads every row in seq order in one read-only snapshot, the seals first. With
    ``key`` every row must be keyed, except the unkeyed rows before the re-key
    row whose seq is ``rekeyed_at`` (a chain re-keyed by :func:`rekey_chain`);
    without it a keyed row cannot be checked and verification fails with a
    request to set ``POLLWARDEN_AUDIT_KEY``. With ``anchor`` the anchored chain
    row must still carry the anchored hash (catches a truncated or rewritten
    tail). Raises :class:`AuditError` if the database cannot be read.
    """
    where = location_of(db_path)
    with open_read_only(where) as conn:
        found = conn.execute(_REKEY_SEQ, (REKEY_KIND,)).fetchone()
        recorded = (
            {str(op): (int(n), None if h is None else str(h)) for op, n, h in conn.execute(_RECORDED_HEADS)}
            if has_operation_chains(conn, where)
            else None
        )
        return check_rows(
            iter_rows(conn, where),
            key=key,
            anchor=anchor,
            rekeyed_at=rekeyed_at,
            rekey_seq=None if found is None else int(found[0]),
            recorded=recorded,
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


def rekey_payload(
    by: str, result: VerifyResult, operations: list[list[object]] | None = None
) -> dict[str, object]:
    """The re-key row's payload: who, what it follows, and (on PostgreSQL, a seal) each operation's
    chain head not sealed yet."""
    payload: dict[str, object] = {
        "decision": REKEY_KIND,
        "note": f"re-keyed by {by}: rows after this one are HMAC-keyed",
        "by": by,
        "unkeyed_rows": result.rows_checked,
        "unkeyed_head_hash": result.head_hash,
    }
    if operations is not None:
        payload["operations"] = operations
    return payload


def rekey_chain(db_path: Path | str | DatabaseLocation, key: bytes, *, by: str, at: datetime) -> int:
    """Start keying an unkeyed chain: verify it, then append the keyed re-key row; return its seq.

    The only way a keyed server may continue an unkeyed chain. Under the write
    lock (so nothing is appended in between) the whole unkeyed chain must
    verify; the re-key row records who re-keyed it, how many unkeyed rows it
    follows and the head hash it links to, and seals every operation's chain
    (so the unkeyed rows of every operation are linked to it). Raises
    :class:`AuditKeyError` when the chain is empty (a keyed server starts it
    keyed), already keyed, or broken.
    """
    from pollwarden.store.sqlite.executor import append_audit  # the engine's one append path

    where = location_of(db_path)
    if not where.is_sqlite:
        from pollwarden.store.postgres.offline import rekey

        def verified(moved: list[list[object]]) -> dict[str, object]:
            # Under the re-key's locks: nothing is appended while the unkeyed chain verifies.
            result = verify_chain(where, None)
            refuse_unless_rekeyable(result)
            return rekey_payload(by, result, moved)

        return rekey(where, key, at=at, payload_of=verified)
    with closing(sqlite3.connect(str(where.path), isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = verify_chain(where, None)
            refuse_unless_rekeyable(result)
            # Every SQLite row is a chain row: the re-key row's link covers them all; nothing to seal.
            seq = append_audit(
                conn,
                operation_id=REKEY_OPERATION,
                at=at,
                kind=REKEY_KIND,
                payload=rekey_payload(by, result),
                key=key,
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return seq
