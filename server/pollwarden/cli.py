"""`pollwarden` command line: serve, demo, approvals, audit and providers.

The stdio server owns stdout for JSON-RPC: everything human goes to stderr
there. Operator commands (approvals, audit) print to stdout as CLIs do.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import anyio

from pollwarden.audit_cli import add_audit_commands
from pollwarden.clock import SystemClock
from pollwarden.config import ServerConfig, load_config
from pollwarden.errors import ConfigError, PollwardenError
from pollwarden.providers_cli import add_provider_commands
from pollwarden.store import open_store
from pollwarden.timefmt import iso
from pollwarden_providers.loader import TableError

log = logging.getLogger("pollwarden")

# Only on these does the MCP SDK keep its DNS-rebinding protection on.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", help="SQLite file shared by every pollwarden process (env POLLWARDEN_DB)")


def _config(args: argparse.Namespace) -> ServerConfig:
    providers: list[str] = getattr(args, "providers", None) or []
    config = load_config(db=args.db, providers=providers, approval=getattr(args, "approval", None))
    if args.db is None and not os.environ.get("POLLWARDEN_DB"):
        # The default lives in the user's data directory, which may not exist yet.
        config.db_path.parent.mkdir(parents=True, exist_ok=True)
    return config


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the MCP server over stdio (default) or streamable HTTP on 127.0.0.1."""
    from pollwarden.server import build_server, controller_factory

    if args.transport == "http" and args.host not in LOOPBACK_HOSTS and not args.allow_non_loopback:
        raise ConfigError(
            f"--host {args.host} is not a loopback address: the MCP SDK then turns off its DNS-rebinding "
            "protection and anyone who can reach the port may call the tools. Serve on 127.0.0.1 behind an "
            "authenticating proxy, or pass --allow-non-loopback if you really mean it"
        )
    config = _config(args)
    factory = controller_factory(config)  # refuses a wrong provider table before serving
    server = build_server(factory)
    log.info("pollwarden serving (%s), database %s", args.transport, config.db_path)
    if args.transport == "http":
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The built-in demo (see demo.py)."""
    from pollwarden.demo import run_demo

    return run_demo(args.db)


async def _approvals_list(config: ServerConfig, show_all: bool) -> int:
    async with open_store(config.database, busy_timeout_seconds=config.busy_timeout_seconds) as store:
        approvals = await store.list_approvals(status=None if show_all else "pending")
    if not approvals:
        print("no pending approvals" if not show_all else "no approvals")
        return 0
    for a in approvals:
        request = a.request
        print(
            f"{a.approval_id}  {a.status:<8} {a.operation_id}  asks +{request.get('extra_seconds', 0):g} s, "
            f"+{request.get('extra_status_requests', 0)} checks  (asked {iso(a.asked_at)}, expires {iso(a.expires_at)})"
        )
        question = str(request.get("question", ""))
        for line in question.splitlines():
            print(f"    {line}")
    return 0


async def _decide(config: ServerConfig, approval_id: str, approve: bool, by: str) -> int:
    async with open_store(config.database, busy_timeout_seconds=config.busy_timeout_seconds) as store:
        approval = await store.decide_approval(approval_id, approve=approve, by=by, at=SystemClock().now())
    if approval is None:
        print(
            f"no approval {approval_id!r}; `pollwarden approvals list` shows the pending ones",
            file=sys.stderr,
        )
        return 1
    if approval.status == "expired":
        print(
            f"{approval_id} had expired at {iso(approval.expires_at)}; nothing was approved", file=sys.stderr
        )
        return 1
    if approval.status == "void":
        print(
            f"{approval_id} is void: operation {approval.operation_id} changed (state, counters or deadline) "
            "after the person was asked; nothing was approved — the agent must ask again",
            file=sys.stderr,
        )
        return 1
    if approval.status not in ("approved", "denied"):
        print(f"{approval_id} is already {approval.status}; nothing changed", file=sys.stderr)
        return 1
    print(
        f"{approval_id} {approval.status} for {approval.operation_id}; the agent's next check_status applies it"
    )
    return 0


def cmd_approvals(args: argparse.Namespace) -> int:
    """List approvals waiting for an operator."""
    return anyio.run(_approvals_list, _config(args), args.all)


def cmd_approve(args: argparse.Namespace) -> int:
    """Approve a pending extension."""
    return anyio.run(_decide, _config(args), args.approval_id, True, args.by)


def cmd_deny(args: argparse.Namespace) -> int:
    """Deny a pending extension."""
    return anyio.run(_decide, _config(args), args.approval_id, False, args.by)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="pollwarden", description="Bounded waiting on external jobs, as an MCP server."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (to stderr)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the MCP server (stdio by default)")
    _add_common(serve)
    serve.add_argument(
        "--providers",
        action="append",
        metavar="DIR",
        help="a directory of provider *.toml tables, added to the shipped ones; repeatable "
        "(env POLLWARDEN_PROVIDERS, separated by the path separator)",
    )
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP only; loopback by default")
    serve.add_argument("--port", type=int, default=8000, help="HTTP only")
    serve.add_argument(
        "--allow-non-loopback",
        action="store_true",
        help="HTTP only: allow a --host other than loopback (turns off DNS-rebinding protection)",
    )
    serve.add_argument(
        "--approval",
        choices=["elicitation", "tool-confirmation"],
        help="how extensions are approved (env POLLWARDEN_APPROVAL); see README before using tool-confirmation",
    )
    serve.set_defaults(func=cmd_serve)

    demo = sub.add_parser("demo", help="run the built-in demo against a local fake provider")
    demo.add_argument("--db", help="keep the demo's database here (default: a temporary file)")
    demo.set_defaults(func=cmd_demo)

    approvals = sub.add_parser("approvals", help="list approvals waiting for an operator")
    approvals_sub = approvals.add_subparsers(dest="approvals_command", required=True)
    approvals_list = approvals_sub.add_parser("list", help="pending approvals (--all for every one)")
    _add_common(approvals_list)
    approvals_list.add_argument("--all", action="store_true")
    approvals_list.set_defaults(func=cmd_approvals)

    for name, func, verb in (("approve", cmd_approve, "approve"), ("deny", cmd_deny, "deny")):
        p = sub.add_parser(name, help=f"{verb} a pending extension by its id")
        _add_common(p)
        p.add_argument("approval_id")
        p.add_argument("--by", default=os.environ.get("USER", "operator"), help="who decided (recorded)")
        p.set_defaults(func=func)

    add_audit_commands(sub)
    add_provider_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `pollwarden` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per provider request is noise at INFO; pollwarden logs its own decisions.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
    except (ConfigError, PollwardenError, TableError) as exc:
        print(f"pollwarden: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `pollwarden providers list | head`: the reader left; say nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
