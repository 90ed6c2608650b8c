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
import sys
import uuid

import anyio

from pollwarden.access.operator_keys import METHOD_TTY, PUBKEYS_ENV
from pollwarden.access.person_gate import SERVER_VERIFIES, Deciding, operator_key_for, require_person
from pollwarden.audit.chain import audit_key_from_env
from pollwarden.cli.options import add_database_options, with_examples, writable_existing_database
from pollwarden.cli.policy import deciding_config
from pollwarden.config import ServerConfig, load_config
from pollwarden.core.clock import SystemClock
from pollwarden.core.errors import ConfigError
from pollwarden.core.timefmt import iso
from pollwarden.core.untrusted import one_line, quoted
from pollwarden.core.vocabulary import ApprovalKind
from pollwarden.flows.operator_decision import decide
from pollwarden.rules.job_identity import reopen_refusal, reopen_summary
from pollwarden.store import open_store

__all__ = ["add_reopen_command"]

# How long a recorded reopen waits for the agent's next check before it expires.
REOPEN_TTL_SECONDS = 7 * 24 * 3600.0
MAX_REASON = 500

DECIDING = Deciding(
    "pollwarden reopen", "the facts are shown and you type the operation id", "Nothing was reopened"
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
    config = await deciding_config(config)  # the stricter of this command's policy and the database's
    key = operator_key_for(config, key_path, DECIDING) if key_path else None
    writable_existing_database(config.database)
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
            require_person(config, DECIDING)
        for line in reopen_summary(record):
            print(one_line(line))
        print(f"Reason: {quoted(reason)}")
        if key is None and not _confirmed(operation_id):
            print(f"{quoted(operation_id)}: nothing reopened", file=sys.stderr)
            return 1
        at = SystemClock().now()
        # Recorded as a decided approval, never applied here: whoever runs this command may be the
        # agent, so the server verifies who decided against its own keys before anything changes.
        asked = await store.open_approval(
            approval_id=f"ap-{uuid.uuid4().hex[:10]}",
            record=record,
            kind=ApprovalKind.REOPEN,
            request={"reason": reason, "stop_reason": record.stop_reason, "stop_detail": record.stop_detail},
            at=at,
            ttl_seconds=REOPEN_TTL_SECONDS,
        )
        decision = await decide(
            store, asked.approval_id, approve=True, by=by, at=at, method=METHOD_TTY, key=key
        )
    if not decision.ok:
        print(decision.message, file=sys.stderr)
        return 1
    print(
        f"{quoted(operation_id)}: reopen recorded by {quoted(by)} ({asked.approval_id}); the server verifies who "
        "decided and reopens it on the agent's next check_status, inside the same budget and deadline "
        f"({record.status_requests_used} of {record.max_status_requests} used, until "
        f"{iso(record.effective_deadline)}); nothing is sent before that call"
    )
    if key is not None:
        print(SERVER_VERIFIES, file=sys.stderr)
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
