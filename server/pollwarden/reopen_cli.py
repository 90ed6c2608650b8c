"""``pollwarden reopen OPERATION_ID --reason TEXT``: an operator says the cause of a refusal is fixed.

After ``authorization_denied``, ``integration_failure`` or
``account_context_changed`` nothing is sent for the job under any operation id
(one job, one budget: a new operation id gets the stopped operation back).
Once a person has fixed the cause (the credentials, the provider table, the
account), an operator reopens the operation: it waits again inside the same
budget and deadline, with its counters kept, and never before a
``Retry-After`` still in force. Like ``approve``, it needs a person: an
interactive terminal where the facts are shown and the operation id is typed,
or ``--operator-key FILE`` (the decision is signed; the signature is kept in the
audit). The reopen is audited (``reopened``: reason, who, how authenticated)
and applies only if the operation is still as it was shown.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path

import anyio

from pollwarden.audit import audit_key_from_env
from pollwarden.cli_options import add_database_options, with_examples, writable_existing_database
from pollwarden.clock import SystemClock
from pollwarden.config import ServerConfig, load_config
from pollwarden.errors import ConfigError
from pollwarden.job_identity import reopen_next_check_at, reopen_refusal, reopen_summary
from pollwarden.operator_keys import (
    METHOD_TTY,
    PUBKEYS_ENV,
    REQUIRE_ENV,
    DecisionFacts,
    OperatorKey,
    describe_keys,
    load_operator_key,
)
from pollwarden.store import open_store
from pollwarden.timefmt import iso
from pollwarden.untrusted import one_line, quoted

__all__ = ["add_reopen_command"]

# The kind a reopen's signature covers (DecisionFacts.kind); never an approval row's kind.
REOPEN_KIND = "reopen"
MAX_REASON = 500

NOT_A_PERSON = (
    "pollwarden reopen needs a person: run it at an interactive terminal (stdin and stdout must be a terminal; "
    "the facts are shown and you type the operation id), or pass --operator-key FILE with an operator key the "
    "agent cannot read. Nothing was reopened"
)


def _operator_key(config: ServerConfig, path: str) -> OperatorKey:
    key = load_operator_key(Path(path).expanduser())
    if config.operator.find(key.public.key_id) is None:
        raise ConfigError(
            f"the operator key {path} (id {key.public.key_id}) is not among the operator public keys "
            f"({PUBKEYS_ENV}: {describe_keys(config.operator.keys)}); add its public line to that file. "
            "Nothing was reopened"
        )
    return key


def _require_person(config: ServerConfig) -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ConfigError(NOT_A_PERSON)
    if config.operator.require_key:
        raise ConfigError(
            f"the operator requires an operator key for every decision ({REQUIRE_ENV}): pass --operator-key FILE. "
            "Nothing was reopened"
        )


def _confirmed(operation_id: str) -> bool:
    try:
        typed = input(f"Type {quoted(operation_id)} to reopen it (anything else leaves it undecided): ")
    except EOFError:
        return False
    return typed.strip() == operation_id


async def _reopen(config: ServerConfig, operation_id: str, reason: str, by: str, key_path: str | None) -> int:
    reason = reason.strip()
    if not reason:
        raise ConfigError("--reason must say what was fixed, e.g. --reason 'rotated the API token'")
    reason = reason[:MAX_REASON]
    key = _operator_key(config, key_path) if key_path else None
    writable_existing_database(config.db_path)
    async with open_store(
        config.database, audit_key=audit_key_from_env(), busy_timeout_seconds=config.busy_timeout_seconds
    ) as store:
        record = await store.get(operation_id)
        if record is None:
            print(f"no operation {quoted(operation_id)}; nothing was reopened", file=sys.stderr)
            return 1
        refusal = reopen_refusal(record)
        if refusal is not None:
            print(refusal, file=sys.stderr)
            return 1
        if key is None:
            _require_person(config)
        for line in reopen_summary(record):
            print(one_line(line))
        print(f"Reason: {quoted(reason)}")
        if key is None and not _confirmed(operation_id):
            print(f"{quoted(operation_id)}: nothing reopened", file=sys.stderr)
            return 1
        at = SystemClock().now()
        request_json = json.dumps(
            {"reason": reason, "stop_reason": record.stop_reason, "stop_detail": record.stop_detail},
            sort_keys=True,
        )
        facts = DecisionFacts(
            approval_id=f"reopen:{record.operation_id}:{record.version}",
            operation_id=record.operation_id,
            kind=REOPEN_KIND,
            bound_version=record.version,
            request_json=request_json,
            decision="approved",
            decided_at=at,
            decided_by=by,
        )
        next_at = reopen_next_check_at(record, at)
        reopened = await store.reopen(
            operation_id,
            bound_version=record.version,
            next_check_at=next_at,
            at=at,
            extra={
                "reason": reason,
                "reopened_by": by,
                "authenticated_by": key.method if key is not None else METHOD_TTY,
                "signature": facts.sign(key) if key is not None else None,
                "signed_request": request_json,
                "stop_reason_before": record.stop_reason,
                "bound_version": record.version,
                "decided_at": at,
            },
        )
    if reopened is None:
        print(
            f"{quoted(operation_id)} changed while you were deciding; nothing was reopened — run it again",
            file=sys.stderr,
        )
        return 1
    print(
        f"{quoted(operation_id)} reopened by {quoted(by)}: the agent's next check_status may send a status request "
        f"from {iso(next_at)}, inside the same budget ({reopened.status_requests_used} of "
        f"{reopened.max_status_requests} used) and deadline ({iso(reopened.effective_deadline)})"
    )
    return 0


def cmd_reopen(args: argparse.Namespace) -> int:
    """Reopen an operation stopped by a refusal, as a person at a terminal or with an operator key."""
    config = load_config(db=args.db, busy_timeout=args.busy_timeout, operator_pubkeys=args.operator_pubkeys)
    return anyio.run(_reopen, config, args.operation_id, args.reason, args.by, args.operator_key)


def add_reopen_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """Add ``reopen``."""
    p = sub.add_parser(
        "reopen",
        help="after authorization_denied, integration_failure or account_context_changed: the cause is fixed",
        description="Reopen an operation stopped by authorization_denied, integration_failure or "
        "account_context_changed, once a person fixed the cause. It waits again inside the same budget and "
        "deadline. Needs a person at an interactive terminal (type the operation id) or --operator-key FILE.",
    )
    add_database_options(p)
    p.add_argument("operation_id")
    p.add_argument("--reason", required=True, help="what was fixed (recorded in the audit)")
    p.add_argument("--by", default=getpass.getuser(), help="who decided (recorded; default: your user name)")
    p.add_argument(
        "--operator-key",
        metavar="FILE",
        help="sign the decision with this operator key instead of a terminal",
    )
    p.add_argument(
        "--operator-pubkeys",
        metavar="FILE",
        help=f"the operator public keys the server trusts (env {PUBKEYS_ENV})",
    )
    with_examples(
        p,
        "pollwarden reopen acme-3f2c9a1b04de --reason 'rotated the API key'   # at a terminal",
        "pollwarden reopen acme-3f2c9a1b04de --reason 'table fixed' --operator-key ~/.config/pollwarden/operator.key",
    )
    p.set_defaults(func=cmd_reopen)
