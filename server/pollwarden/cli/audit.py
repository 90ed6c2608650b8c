"""``pollwarden audit …`` subcommands: show, export, verify, anchor, rekey.

show, export, verify and anchor are offline commands: they read the database
file read-only (a copy works too) and print to stdout; ``show`` and ``export``
first write the summary rows of refused calls counted since the last row, when
the file is writable, and on PostgreSQL ``anchor`` first seals every
operation's chain (one chain row, `pollwarden.audit.verify`), so the anchor
covers them. rekey is the one that writes a decision: the audited
re-key row that lets a keyed server continue a chain that was unkeyed. The HMAC
key is read from ``POLLWARDEN_AUDIT_KEY`` and is never printed.

Exit codes: 0 ok, 1 chain broken / operation not found / anchor refused,
2 an error (no database there, unreadable file or anchor), as for every command (cli.py).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pollwarden.access.operation_names import resolve_name
from pollwarden.audit.chain import (
    AUDIT_KEY_ENV,
    REKEY_KIND,
    AuditError,
    AuditKeyError,
    audit_key_from_env,
    audit_operation_ids,
    export_jsonl,
    read_anchor,
    read_rows,
    write_anchor,
)
from pollwarden.audit.story import render_story
from pollwarden.audit.verify import VerifyResult, describe_mode, rekey_chain, verify_chain
from pollwarden.cli.options import (
    add_database_options,
    database_from,
    require_existing_database,
    with_examples,
)
from pollwarden.core.files import prepare_database_file, write_private_file
from pollwarden.core.untrusted import quoted
from pollwarden.store.location import DatabaseLocation
from pollwarden.store.sqlite.offline import flush_refusals_before_reading

__all__ = ["add_audit_commands"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

Handler = Callable[[argparse.Namespace], int]


def _on_database(handler: Callable[[argparse.Namespace, DatabaseLocation], int]) -> Handler:
    """Find the database as every command does (--db, POLLWARDEN_DB, the data directory); never create one."""

    def run(args: argparse.Namespace) -> int:
        db = database_from(args).location
        require_existing_database(db)
        return handler(args, db)

    return run


def _describe(result: VerifyResult) -> str:
    """The verdict, then the mode and what it can and cannot detect (one per line)."""
    if result.ok:
        verdict = (
            f"audit chain OK: {result.rows_checked} rows, head seq {result.head_seq} hash {result.head_hash}"
        )
    else:
        verdict = f"audit chain BROKEN at seq {result.first_broken_seq}: {result.problem}"
    return "\n".join([verdict, *describe_mode(result)])


def _bring_story_up_to_date(args: argparse.Namespace, db: DatabaseLocation) -> None:
    """Refused calls counted since the last row are written first (their summary rows), if the file allows."""
    busy_timeout = database_from(args).busy_timeout_seconds
    if db.is_sqlite:
        why_not = flush_refusals_before_reading(
            db.path, audit_key=audit_key_from_env(), busy_timeout=busy_timeout
        )
    else:
        from pollwarden.store.postgres.offline import on_store

        _, why_not = on_store(
            db,
            lambda store: store.flush_refusals(),
            audit_key=audit_key_from_env(),
            busy_timeout=busy_timeout,
        )
    if why_not is not None:
        print(
            f"pollwarden audit: refused calls counted since the last row are not shown ({why_not})",
            file=sys.stderr,
        )


def _named(db: DatabaseLocation, name: str) -> str | None:
    """The stored id an operator's name means (`@NAME/ID`, or an unambiguous `ID`); None, said why, if none."""
    named = resolve_name(name, audit_operation_ids(db, name))
    if named.problem is not None:
        print(f"pollwarden audit: {named.problem} in the audit", file=sys.stderr)
    return named.operation_id


def _show(args: argparse.Namespace, db: DatabaseLocation) -> int:
    _bring_story_up_to_date(args, db)
    operation_id = _named(db, args.operation)
    if operation_id is None:
        return EXIT_FAILED
    rows = read_rows(db, operation_id)
    if not rows:
        print(f"pollwarden audit: no audit rows for operation {quoted(operation_id)}", file=sys.stderr)
        return EXIT_FAILED
    for line in render_story(rows):
        print(line)
    return EXIT_OK


def _export(args: argparse.Namespace, db: DatabaseLocation) -> int:
    operation_id: str | None = args.operation
    out: str | None = args.out
    _bring_story_up_to_date(args, db)
    if operation_id is not None:
        named = resolve_name(operation_id, audit_operation_ids(db, operation_id))
        if named.ambiguous:
            print(f"pollwarden audit: {named.problem}", file=sys.stderr)
            return EXIT_FAILED
        operation_id = named.operation_id or operation_id  # none: exports nothing, as before
    if out is None or out == "-":
        export_jsonl(db, sys.stdout, operation_id)
        sys.stdout.flush()
        return EXIT_OK
    target = Path(out)
    try:
        # Private (0600), written whole, never through a symlink at --out.
        with write_private_file(target) as handle:
            count = export_jsonl(db, handle, operation_id)
    except OSError as exc:
        print(f"pollwarden audit: cannot write {target}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"exported {count} audit rows to {target}")
    return EXIT_OK


def _verify(args: argparse.Namespace, db: DatabaseLocation) -> int:
    anchor_file: str | None = args.anchor
    anchor = read_anchor(Path(anchor_file)) if anchor_file is not None else None
    result = verify_chain(db, audit_key_from_env(), anchor, rekeyed_at=args.rekeyed_at)
    print(_describe(result))
    if result.ok and anchor is not None:
        print(f"anchor matched: seq {anchor.seq} taken at {anchor.at}")
    return EXIT_OK if result.ok else EXIT_FAILED


def _anchor(args: argparse.Namespace, db: DatabaseLocation) -> int:
    out = Path(str(args.out))
    result = verify_chain(db, audit_key_from_env(), rekeyed_at=args.rekeyed_at)
    if not result.ok:
        # Anchoring a broken chain would launder it.
        print(_describe(result))
        print("refusing to anchor a broken chain")
        return EXIT_FAILED
    if not db.is_sqlite:
        _seal_first(args, db)
    try:
        anchor = write_anchor(db, out)
    except OSError as exc:
        print(f"pollwarden audit: cannot write {out}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"anchored audit head seq {anchor.seq} hash {anchor.hash} at {anchor.at} to {out}")
    return EXIT_OK


def _seal_first(args: argparse.Namespace, db: DatabaseLocation) -> None:
    """On PostgreSQL, seal the operations' chains so the anchor covers their latest rows too."""
    from pollwarden.store.postgres.offline import on_store

    busy_timeout = database_from(args).busy_timeout_seconds
    at = datetime.now(UTC).timestamp()
    sealed, why_not = on_store(
        db, lambda store: store.seal(at=at), audit_key=audit_key_from_env(), busy_timeout=busy_timeout
    )
    if why_not is not None:
        print(
            f"pollwarden audit: could not seal the operations' chains first ({why_not}); the anchor covers "
            "each operation's rows up to the last seal only",
            file=sys.stderr,
        )
    elif sealed:
        print(f"sealed the audit chains of {sealed} operations")


def _add_rekeyed_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rekeyed-at",
        metavar="SEQ",
        type=int,
        default=None,
        help="with POLLWARDEN_AUDIT_KEY set, the seq of the re-key row (from `audit rekey`): the unkeyed rows "
        "before it are accepted, which the key cannot authenticate",
    )


def _rekey(args: argparse.Namespace, db: DatabaseLocation) -> int:
    key = audit_key_from_env()
    if key is None:
        print(
            f"pollwarden audit: rekey needs {AUDIT_KEY_ENV} set to the key the server will use",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if db.is_sqlite:
        if not db.path.is_file():
            raise AuditError(f"audit database not found: {db}")
        prepare_database_file(db.path)
    by: str = args.by
    try:
        seq = rekey_chain(db, key, by=by, at=datetime.now(UTC))
    except AuditKeyError as exc:
        print(f"pollwarden audit: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"re-keyed the audit chain at seq {seq} (an audited {REKEY_KIND} row, by {quoted(by)}); rows from here on "
        f"are HMAC-keyed. Verify with: pollwarden audit verify --rekeyed-at {seq}"
    )
    return EXIT_OK


def _audit_usage(parser: argparse.ArgumentParser) -> Handler:
    def run(args: argparse.Namespace) -> int:
        del args
        parser.print_usage(sys.stderr)
        print("pollwarden audit: choose a subcommand: show, export, verify, anchor, rekey", file=sys.stderr)
        return EXIT_USAGE

    return run


def add_audit_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """Add ``audit show|export|verify|anchor`` to a CLI's subparsers.

    Every leaf parser sets ``func`` to a handler ``(argparse.Namespace) -> int``
    returning the exit code; the caller runs ``sys.exit(args.func(args))``.
    """
    audit = subparsers.add_parser(
        "audit",
        help="show, export, verify or anchor the audit chain",
        description="Read the tamper-evident audit chain (read-only; works on a copy of the database).",
    )
    audit.set_defaults(func=_audit_usage(audit))
    commands = audit.add_subparsers(dest="audit_command", metavar="{show,export,verify,anchor,rekey}")

    show = commands.add_parser("show", help="print the decision story of one operation")
    show.add_argument("operation", metavar="OPERATION", help="operation id")
    add_database_options(show)
    with_examples(show, "pollwarden audit show report-export-2025-04-18-01 --db ~/pollwarden.db")
    show.set_defaults(func=_on_database(_show))

    export = commands.add_parser("export", help="write audit rows as JSON lines")
    export.add_argument("--operation", metavar="ID", default=None, help="only this operation's rows")
    export.add_argument("--out", metavar="FILE", default=None, help="output file (default: stdout)")
    add_database_options(export)
    with_examples(
        export,
        "pollwarden audit export --out audit.jsonl",
        "pollwarden audit export --operation report-export-2025-04-18-01 | jq .kind",
    )
    export.set_defaults(func=_on_database(_export))

    verify = commands.add_parser(
        "verify",
        help="check the hash chain (uses POLLWARDEN_AUDIT_KEY when set)",
        description="Exit 0 when the chain is intact, 1 when it is broken.",
    )
    verify.add_argument("--anchor", metavar="FILE", default=None, help="anchor file from 'audit anchor'")
    _add_rekeyed_option(verify)
    add_database_options(verify)
    with_examples(
        verify, "pollwarden audit verify", "pollwarden audit verify --anchor /safe/place/anchor.json"
    )
    verify.set_defaults(func=_on_database(_verify))

    anchor = commands.add_parser(
        "anchor",
        help="verify, then record the chain head in a file kept outside the database's reach",
    )
    anchor.add_argument("--out", metavar="FILE", required=True, help="anchor file to write")
    _add_rekeyed_option(anchor)
    add_database_options(anchor)
    with_examples(anchor, "pollwarden audit anchor --out /safe/place/anchor.json")
    anchor.set_defaults(func=_on_database(_anchor))

    rekey = commands.add_parser(
        "rekey",
        help="start keying an unkeyed chain: verify it, then write an audited re-key row",
        description=f"With {AUDIT_KEY_ENV} set: verify the unkeyed chain, then append the keyed {REKEY_KIND} "
        "row a keyed server may continue from. The only way from an unkeyed chain to a keyed one.",
    )
    rekey.add_argument("--by", default=getpass.getuser(), help="who re-keys (recorded)")
    add_database_options(rekey)
    with_examples(rekey, "POLLWARDEN_AUDIT_KEY=... pollwarden audit rekey --by ops-alice")
    rekey.set_defaults(func=_on_database(_rekey))
