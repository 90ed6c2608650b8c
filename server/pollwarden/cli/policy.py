"""The database's approval policy in each process, and `pollwarden policy show|set` (issue 31).

`deciding_config` is what a deciding command applies (the stricter of its own
policy and the database's), `check_serving_policy` what `serve` checks before
it serves (`pollwarden.access.policy_gate`). The rules are `pollwarden.access.approval_policy`'s.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import anyio

from pollwarden.access.approval_policy import ALL_CHANNELS, ApprovalPolicy, describe, parse_channels
from pollwarden.access.operator_keys import describe_keys, load_operator_key, load_public_keys
from pollwarden.access.person_gate import interactive
from pollwarden.access.policy_gate import serving_config, stored_policy
from pollwarden.audit.chain import audit_key_from_env
from pollwarden.cli.options import add_database_options, with_examples, writable_existing_database
from pollwarden.config import ServerConfig, load_config
from pollwarden.core.clock import SystemClock
from pollwarden.core.errors import ConfigError, StoreError
from pollwarden.store import open_store

__all__ = ["add_policy_commands", "check_serving_policy", "deciding_config"]


async def deciding_config(config: ServerConfig) -> ServerConfig:
    """A deciding command's configuration: the stricter of its own policy and the database's."""
    writable_existing_database(config.database)
    async with open_store(
        config.database, audit_key=audit_key_from_env(), busy_timeout_seconds=config.busy_timeout_seconds
    ) as store:
        return (await stored_policy(store, config))[0]


def _config(args: argparse.Namespace) -> ServerConfig:
    return load_config(db=args.db, busy_timeout=args.busy_timeout)


async def _show(config: ServerConfig) -> int:
    writable_existing_database(config.database)
    async with open_store(
        config.database, audit_key=audit_key_from_env(), busy_timeout_seconds=config.busy_timeout_seconds
    ) as store:
        print(f"approval policy of {config.database}: {describe(await store.approval_policy())}")
    return 0


def _wanted(args: argparse.Namespace, stored: ApprovalPolicy) -> ApprovalPolicy:
    """The policy `set` asks for: what it names, the stored one for the rest."""
    require = (
        stored.require_operator_key
        if args.require_operator_key is None
        else args.require_operator_key == "yes"
    )
    channels = stored.channels if args.channels is None else parse_channels(args.channels)
    keys = stored.operator_keys
    if args.operator_pubkeys:
        keys = load_public_keys(Path(args.operator_pubkeys).expanduser())
    if require and not keys:
        raise ConfigError(
            "requiring an operator key needs the public keys it trusts: pass --operator-pubkeys FILE (the "
            "lines `pollwarden operator-key init` printed). Nothing was changed"
        )
    return ApprovalPolicy(require, channels, keys if require else ())


def _proof(args: argparse.Namespace, stored: ApprovalPolicy) -> str:
    """Who changes the policy: the holder of a trusted operator key while one is required, else a person."""
    if stored.require_operator_key:
        if not args.operator_key:
            raise ConfigError(
                f"the database's policy requires an operator key ({describe(stored)}): pass --operator-key FILE "
                "with one of the keys it trusts. Nothing was changed"
            )
        key = load_operator_key(Path(args.operator_key).expanduser())
        if key.public.key_id not in {k.key_id for k in stored.operator_keys}:
            raise ConfigError(
                f"the operator key {args.operator_key} (id {key.public.key_id}) is not among the keys the "
                f"database's policy trusts ({describe_keys(stored.operator_keys)}). Nothing was changed"
            )
        return key.method
    if not interactive():
        raise ConfigError(
            "pollwarden policy set needs a person: run it at an interactive terminal (stdin and stdout must be "
            "a terminal). Nothing was changed"
        )
    return "tty"


async def _set(args: argparse.Namespace, config: ServerConfig) -> int:
    writable_existing_database(config.database)
    async with open_store(
        config.database, audit_key=audit_key_from_env(), busy_timeout_seconds=config.busy_timeout_seconds
    ) as store:
        stored = await store.approval_policy()
        wanted = _wanted(args, stored)
        method = _proof(args, stored)
        by = f"{args.by} ({method})"
        await store.write_approval_policy(wanted, at=SystemClock().now(), by=by, only_raising_to_a_key=False)
        print(f"approval policy of {config.database}: {describe(await store.approval_policy())}")
    print(
        "note: every server on this database checks it when it applies a decision; a server started with a "
        "weaker policy refuses to start",
        file=sys.stderr,
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Print the database's approval policy."""
    return anyio.run(_show, _config(args))


def cmd_set(args: argparse.Namespace) -> int:
    """Change the database's approval policy (a person, or a trusted operator key while one is required)."""
    return anyio.run(_set, args, _config(args))


def add_policy_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """`pollwarden policy show|set`."""
    policy = sub.add_parser("policy", help="the database's approval policy, which every process applies")
    verbs = policy.add_subparsers(dest="policy_command", required=True)
    show = verbs.add_parser("show", help="print the approval policy stored in the database")
    add_database_options(show)
    show.set_defaults(func=cmd_show)
    with_examples(show, "pollwarden policy show --db ~/pollwarden/pollwarden.db")
    change = verbs.add_parser("set", help="change the approval policy stored in the database")
    add_database_options(change)
    change.add_argument(
        "--require-operator-key",
        choices=["yes", "no"],
        help="whether every decision made outside the client must be signed with a trusted operator key",
    )
    change.add_argument(
        "--operator-pubkeys",
        metavar="FILE",
        help="the operator public keys the database trusts while a key is required",
    )
    change.add_argument(
        "--channels",
        metavar="LIST",
        help=f"the approval channels that count, comma-separated, from: {', '.join(sorted(ALL_CHANNELS))}",
    )
    change.add_argument(
        "--operator-key",
        metavar="FILE",
        help="a private operator key the database trusts (needed while the policy requires one)",
    )
    change.add_argument(
        "--by", default=os.environ.get("USER", "operator"), help="who changes it (audited in the row)"
    )
    change.set_defaults(func=cmd_set)
    with_examples(
        change,
        "pollwarden policy set --require-operator-key yes --operator-pubkeys ~/.config/pollwarden/operator.pub",
        "pollwarden policy set --channels elicitation,operator --operator-key ~/.config/pollwarden/operator.key",
    )


async def _preflight(config: ServerConfig) -> ServerConfig:
    async with open_store(
        config.database, audit_key=audit_key_from_env(), busy_timeout_seconds=config.busy_timeout_seconds
    ) as store:
        return await serving_config(store, config, at=SystemClock().now())


def check_serving_policy(config: ServerConfig) -> ServerConfig:
    """Before a server serves: its configuration under the database's policy (refused when weaker).

    A database that cannot be opened is not refused here: the server stays up and says why on every
    call, and `controller_factory` applies the policy once the database opens.
    """
    try:
        return anyio.run(_preflight, config)
    except StoreError:
        return config
