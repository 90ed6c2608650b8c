"""``pollwarden approvals list``, ``approve``, ``deny`` and ``operator-key``: a person decides.

An agent with a shell can run any command its user can, so ``approve`` and
``deny`` ask for proof that a person decided:

* at an interactive terminal (stdin and stdout are terminals), the question is
  shown with every untrusted value on one quoted line, and the person types the
  approval id; a non-interactive call (an agent's shell tool) is refused;
* or ``--operator-key FILE``: the decision is signed with an operator key the
  agent cannot read, whose public key the operator configured
  (``POLLWARDEN_OPERATOR_PUBKEYS``).

How the decision was authenticated is recorded with it and in the audit; the
controller checks it again before applying it (see ``operator_keys``).
``approvals list`` reads an existing database and never creates one.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path

import anyio

from pollwarden.access.operator_keys import METHOD_TTY, PUBKEYS_ENV, generate_key_file, load_operator_key
from pollwarden.access.person_gate import SERVER_VERIFIES, Deciding, operator_key_for, require_person
from pollwarden.audit.chain import audit_key_from_env
from pollwarden.cli.options import add_database_options, with_examples, writable_existing_database
from pollwarden.cli.policy import deciding_config
from pollwarden.config import ServerConfig, load_config
from pollwarden.core.clock import SystemClock
from pollwarden.core.errors import ConfigError
from pollwarden.core.records import ApprovalRecord
from pollwarden.core.timefmt import iso
from pollwarden.core.untrusted import one_line, quoted
from pollwarden.flows.operator_decision import decide, header, not_found, refusal
from pollwarden.store import open_store

__all__ = ["add_approval_commands", "decided_line", "question_lines"]


def _config(args: argparse.Namespace) -> ServerConfig:
    return load_config(
        db=args.db,
        busy_timeout=args.busy_timeout,
        operator_pubkeys=getattr(args, "operator_pubkeys", None),
    )


def question_lines(approval: ApprovalRecord) -> list[str]:
    """The stored question, one escaped line each."""
    # The stored question was built with every untrusted value quoted; escaping each line
    # again guards against a row written into the database by hand.
    question = str(approval.request.get("question", ""))
    return [f"    {one_line(line)}" for line in question.splitlines()]


async def _list(config: ServerConfig, show_all: bool) -> int:
    writable_existing_database(config.database)
    async with open_store(
        config.database, audit_key=audit_key_from_env(), busy_timeout_seconds=config.busy_timeout_seconds
    ) as store:
        approvals = await store.list_approvals(status=None if show_all else "pending")
    if not approvals:
        print("no pending approvals" if not show_all else "no approvals")
        return 0
    for approval in approvals:
        print(header(approval))
        if approval.decided_by is not None:
            print(f"    {decided_line(approval)}")
        for line in question_lines(approval):
            print(line)
    return 0


def decided_line(approval: ApprovalRecord) -> str:
    """Who decided an approval, how it was authenticated, and when."""
    method = approval.decided_method or "not recorded"
    return (
        f"{approval.status} by {quoted(approval.decided_by)} at {iso(approval.decided_at)}, "
        f"authenticated by {quoted(method)}"
    )


def _deciding(verb: str) -> Deciding:
    return Deciding(
        f"pollwarden {verb}", "the question is shown and you type the approval id", "Nothing was decided"
    )


def _confirmed(approval: ApprovalRecord, verb: str) -> bool:
    try:
        typed = input(
            f"Type {quoted(approval.approval_id)} to {verb} it (anything else leaves it undecided): "
        )
    except EOFError:
        return False
    return typed.strip() == approval.approval_id


async def _decide(
    config: ServerConfig, approval_id: str, approve: bool, by: str, key_path: str | None
) -> int:
    verb = "approve" if approve else "deny"
    config = await deciding_config(config)  # the stricter of this command's policy and the database's
    key = operator_key_for(config, key_path, _deciding(verb)) if key_path else None
    writable_existing_database(config.database)
    async with open_store(
        config.database, audit_key=audit_key_from_env(), busy_timeout_seconds=config.busy_timeout_seconds
    ) as store:
        approval = await store.get_approval(approval_id)
        if approval is None:
            print(not_found(approval_id), file=sys.stderr)
            return 1
        if approval.status != "pending":
            print(refusal(approval), file=sys.stderr)
            return 1
        if key is None:
            require_person(config, _deciding(verb))
        print(header(approval))
        for line in question_lines(approval):
            print(line)
        if key is None and not _confirmed(approval, verb):
            print(f"{quoted(approval_id)}: nothing decided", file=sys.stderr)
            return 1
        decision = await decide(
            store, approval_id, approve=approve, by=by, at=SystemClock().now(), method=METHOD_TTY, key=key
        )
    if not decision.ok:
        print(decision.message, file=sys.stderr)
        return 1
    print(decision.message)
    if key is not None:
        print(SERVER_VERIFIES, file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """List approvals waiting for an operator (reads an existing database; never creates one)."""
    return anyio.run(_list, _config(args), bool(args.all))


def cmd_decide(args: argparse.Namespace) -> int:
    """Approve or deny a pending approval, as a person at a terminal or with an operator key."""
    return anyio.run(
        _decide, _config(args), args.approval_id, args.command == "approve", args.by, args.operator_key
    )


def cmd_key_init(args: argparse.Namespace) -> int:
    """Create an operator key file (0600) and print its public line."""
    out = Path(args.out).expanduser()
    try:
        public = generate_key_file(out, args.comment)
    except FileExistsError:
        raise ConfigError(
            f"{out} already exists; choose another --out (an operator key is never overwritten)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror}") from exc
    print(public.line())
    print(
        f"wrote the private key to {out} (mode 600). Keep it where the agent cannot read it (another user, "
        f"outside its sandbox). Add the line above to the file named by {PUBKEYS_ENV} for the server and for "
        "`pollwarden approve`, somewhere the agent cannot write.",
        file=sys.stderr,
    )
    return 0


def cmd_key_show(args: argparse.Namespace) -> int:
    """Print the public line of an operator key file."""
    key = load_operator_key(Path(args.key).expanduser())
    print(key.public.line())
    return 0


def add_approval_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """Add ``approvals list``, ``approve``, ``deny`` and ``operator-key init|show``."""
    approvals = sub.add_parser(
        "approvals", help="list approvals (extensions and cancels) waiting for an operator"
    )
    approvals_sub = approvals.add_subparsers(dest="approvals_command", required=True)
    approvals_list = approvals_sub.add_parser(
        "list", help="pending approvals, extensions and cancels (--all for every one)"
    )
    add_database_options(approvals_list)
    approvals_list.add_argument("--all", action="store_true", help="also the decided, expired and void ones")
    with_examples(
        approvals_list, "pollwarden approvals list", "pollwarden approvals list --all --db ~/pollwarden.db"
    )
    approvals_list.set_defaults(func=cmd_list)

    for name in ("approve", "deny"):
        p = sub.add_parser(
            name,
            help=f"{name} a pending approval (an extension or a cancel): a person at a terminal, or --operator-key",
            description=f"{name.capitalize()} a pending approval: more time or status requests for an operation "
            f"(an extension), or a cancel call to the provider (a cancel). Needs a person at an interactive "
            "terminal (the question is shown; type the approval id) or --operator-key FILE.",
        )
        with_examples(
            p,
            f"pollwarden {name} ap-3f2c9a1b   # at a terminal: shows the question, then type the id",
            f"pollwarden {name} ap-3f2c9a1b --operator-key ~/.config/pollwarden/operator.key --by ops-alice",
        )
        add_database_options(p)
        p.add_argument("approval_id")
        p.add_argument(
            "--by", default=getpass.getuser(), help="who decided (recorded; default: your user name)"
        )
        p.add_argument(
            "--operator-key",
            metavar="FILE",
            help="sign the decision with this operator key (from `pollwarden operator-key init`) instead of "
            "confirming at a terminal",
        )
        p.add_argument(
            "--operator-pubkeys",
            metavar="FILE",
            help=f"the operator public keys the server trusts (env {PUBKEYS_ENV})",
        )
        p.set_defaults(func=cmd_decide)

    key = sub.add_parser("operator-key", help="create or show an operator key that signs decisions")
    key_sub = key.add_subparsers(dest="key_command", required=True)
    init = key_sub.add_parser("init", help="create a private key file (0600) and print its public line")
    init.add_argument(
        "--out", required=True, metavar="FILE", help="where to write the private key (never overwritten)"
    )
    init.add_argument("--comment", default=getpass.getuser(), help="a label kept with the public key")
    with_examples(
        init, "pollwarden operator-key init --out ~/.config/pollwarden/operator.key --comment ops-alice"
    )
    init.set_defaults(func=cmd_key_init)
    show = key_sub.add_parser("show", help="print the public line of a private key file")
    show.add_argument("key", metavar="FILE")
    with_examples(show, "pollwarden operator-key show ~/.config/pollwarden/operator.key")
    show.set_defaults(func=cmd_key_show)
