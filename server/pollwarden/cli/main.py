"""`pollwarden` command line: serve, demo, approvals, reopen, audit and providers.

The stdio server owns stdout for JSON-RPC: everything human goes to stderr
there. Operator commands (approvals, audit) print to stdout as CLIs do.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from pollwarden.access.auth import (
    TOKENS_ENV,
    AuthOptions,
    add_token_commands,
    auth_settings,
    build_verifier,
    resource_url_for,
)
from pollwarden.access.operator_keys import PUBKEYS_ENV, REQUIRE_ENV
from pollwarden.access.principals import PrincipalLimits, PrincipalLogFilter
from pollwarden.cli.approvals import add_approval_commands
from pollwarden.cli.audit import add_audit_commands
from pollwarden.cli.doctor import add_doctor_command
from pollwarden.cli.http_options import add_http_arguments, http_options
from pollwarden.cli.metrics import add_metrics_command
from pollwarden.cli.options import add_database_options, database_from, with_examples
from pollwarden.cli.policy import add_policy_commands, check_serving_policy
from pollwarden.cli.providers import add_provider_commands
from pollwarden.cli.reopen import add_reopen_command
from pollwarden.cli.webhooks import add_webhook_commands, serve_wrapper
from pollwarden.config import (
    APPROVAL_CHOICES,
    STATE_KEY_ENV,
    ServerConfig,
    default_db_path,
    load_config,
    load_provider_tables,
    state_keys_from_env,
)
from pollwarden.console.cli import add_console_command
from pollwarden.core.errors import ConfigError, PollwardenError
from pollwarden.core.files import ensure_private_dir
from pollwarden.core.untrusted import OneLineFormatter
from pollwarden.ops import decision_log
from pollwarden.ops.decision_log import JsonLinesFormatter
from pollwarden.ops.metrics import add_metrics_arguments, metrics_options_from

log = logging.getLogger("pollwarden")

# Exit codes of every command: 0 done; 1 a command's own "no" (chain broken, nothing decided, not found);
# 2 an error (the message says what was wrong and how to fix it); 130 Ctrl+C; 141 the reader of stdout
# left (as a process killed by SIGPIPE reports it).
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141
LOG_FORMAT_ENV = "POLLWARDEN_LOG_FORMAT"


def serve_config(args: argparse.Namespace) -> ServerConfig:
    """The server configuration from `serve`'s flags, the environment and the defaults."""
    providers: list[str] = args.providers or []
    config = load_config(
        db=args.db,
        providers=providers,
        approval=args.approval,
        operator_pubkeys=args.operator_pubkeys,
        require_operator_key=True if args.require_operator_key else None,
        busy_timeout=args.busy_timeout,
    )
    if database_from(args).is_default or in_data_directory(config):
        # The default lives in the user's data directory, which may not exist yet: create it private.
        # So does a --db naming a file there (as the client examples do). Any other missing
        # directory is refused: a typo must not start an empty database somewhere unexpected.
        ensure_private_dir(config.db_path.parent)
    return config


def in_data_directory(config: ServerConfig) -> bool:
    """Whether the database is a SQLite file directly in the user's data directory (where the default is)."""
    if not config.database.is_sqlite:
        return False
    return config.db_path.expanduser().parent == default_db_path().parent


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the MCP server over stdio (default) or streamable HTTP on 127.0.0.1."""
    from pollwarden.surface.http_serve import is_loopback, run_http, transport_security
    from pollwarden.surface.server import build_server, controller_factory

    auth = _auth_options(args)
    http = http_options(args, verifier_configured=auth.configured) if args.transport == "http" else None
    if http is None and auth.configured:
        raise ConfigError(
            "--auth-tokens and --jwt-issuer apply to --transport http (stdio is the local user)"
        )
    settings = verifier = None
    if http is not None:
        transport_security(
            http
        )  # refuse a host or name list that would serve unprotected, before anything else
        if auth.configured:
            if not is_loopback(http.host) and not auth.resource_url:
                raise ConfigError(
                    "beyond loopback, --resource-url must give the URL clients use, e.g. "
                    "https://mcp.example.com/mcp (tokens are issued for it, and the metadata names it)"
                )
            resource = resource_url_for(auth, host=http.host, port=http.port)
            settings = auth_settings(auth, resource_url=resource)
            verifier = build_verifier(auth, resource_url=resource)
    config = serve_config(args)
    check_serving_policy(config)  # a weaker policy than the database's is refused before serving
    config = replace(config, limits=_principal_limits(args))
    tables = load_provider_tables(config)  # refuses a wrong provider table before serving
    factory = controller_factory(config, tables=tables)
    state_keys = state_keys_from_env()
    if http is not None and not state_keys and not config.database.is_sqlite:
        log.warning(
            "serving HTTP on a shared PostgreSQL database without %s: an approval asked through this "
            "instance can be answered only through this instance and before it restarts; set the same "
            "key on every instance",
            STATE_KEY_ENV,
        )
    server = build_server(
        factory,
        state_keys=state_keys,
        auth=settings,
        token_verifier=verifier,
        tasks=args.tasks,
        provider_names=sorted(tables),
    )
    log.info("pollwarden serving (%s), database %s", args.transport, config.database)
    if http is not None:
        run_http(
            server, http, wrap=serve_wrapper(config, tables, metrics_options_from(args))
        )  # with POST /webhooks/{provider}
    else:
        server.run()
    return 0


def _principal_limits(args: argparse.Namespace) -> PrincipalLimits:
    for flag, value in (
        ("--max-active-per-principal", args.max_active_per_principal),
        ("--max-starts-per-minute", args.max_starts_per_minute),
        ("--fleet-slots-per-principal", args.fleet_slots_per_principal),
    ):
        if value is not None and value < 1:
            raise ConfigError(
                f"{flag} must be a whole number of 1 or more (got {value}); omit it for no limit"
            )
    return PrincipalLimits(
        max_active=args.max_active_per_principal,
        max_starts_per_minute=args.max_starts_per_minute,
        fleet_slots=args.fleet_slots_per_principal,
    )


def _auth_options(args: argparse.Namespace) -> AuthOptions:
    tokens = (
        (args.auth_tokens or os.environ.get(TOKENS_ENV)) if args.transport == "http" else args.auth_tokens
    )
    return AuthOptions(
        token_file=Path(tokens).expanduser() if tokens else None,
        jwt_issuer=args.jwt_issuer,
        jwt_jwks_url=args.jwt_jwks_url,
        jwt_audience=args.jwt_audience,
        jwt_principal_claim=args.jwt_principal_claim,
        resource_url=args.resource_url,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    """The built-in demo (see demo.py), or with --team two HTTP instances on one database (demo_team.py)."""
    if args.team:
        from pollwarden.cli.demo_team import run_team_demo

        return run_team_demo(args.db)
    from pollwarden.cli.demo import run_demo

    return run_demo(args.db)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="pollwarden", description="Bounded waiting on external jobs, as an MCP server."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (to stderr)")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get(LOG_FORMAT_ENV, "text"),
        help=f"text lines for people, or JSON lines with one event per decision for a log collector "
        f"(env {LOG_FORMAT_ENV}; default text)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the MCP server (stdio by default)")
    add_database_options(serve)
    serve.add_argument(
        "--providers",
        action="append",
        metavar="DIR",
        help="a directory of provider *.toml tables, added to the shipped ones; repeatable "
        "(env POLLWARDEN_PROVIDERS, separated by the path separator)",
    )
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    add_http_arguments(serve, default_port=8000)
    add_metrics_arguments(serve)
    serve.add_argument(
        "--auth-tokens",
        metavar="FILE",
        help=f"HTTP only: require a bearer token listed (by hash) in FILE, made with `pollwarden tokens add` "
        f"(env {TOKENS_ENV})",
    )
    serve.add_argument(
        "--jwt-issuer",
        metavar="URL",
        help="HTTP only: require a JWT access token from this issuer (its iss), verified against its JWKS",
    )
    serve.add_argument(
        "--jwt-jwks-url",
        metavar="URL",
        help="HTTP only: the issuer's JWKS (default ISSUER/.well-known/jwks.json)",
    )
    serve.add_argument(
        "--jwt-audience",
        metavar="AUD",
        help="HTTP only: the aud tokens must carry (default: the resource URL)",
    )
    serve.add_argument(
        "--jwt-principal-claim",
        default="sub",
        metavar="CLAIM",
        help="HTTP only: the claim naming the principal operations belong to (default sub)",
    )
    serve.add_argument(
        "--resource-url",
        metavar="URL",
        help="HTTP only: this server's URL as clients reach it, e.g. https://mcp.example.com/mcp (the "
        "audience of its tokens; default http://HOST:PORT/mcp on loopback)",
    )
    serve.add_argument(
        "--max-active-per-principal",
        type=int,
        metavar="N",
        help="HTTP with tokens: a principal may have at most N operations waiting at once (default: no limit)",
    )
    serve.add_argument(
        "--max-starts-per-minute",
        type=int,
        metavar="N",
        help="HTTP with tokens: a principal may start at most N operations a minute (default: no limit)",
    )
    serve.add_argument(
        "--fleet-slots-per-principal",
        type=int,
        metavar="N",
        help="while a provider's [fleet] pace is used up, one principal holds at most N of its booked slots, "
        "so others are served in turn (default: no limit; 1 alternates principals)",
    )
    serve.add_argument(
        "--approval",
        choices=APPROVAL_CHOICES,
        help="how extensions are approved (env POLLWARDEN_APPROVAL); 'app' adds Approve/Deny on the MCP App "
        "card to elicitation; see docs/approvals.md before using tool-confirmation",
    )
    serve.add_argument(
        "--tasks",
        action="store_true",
        help="serve MCP Tasks (io.modelcontextprotocol/tasks) to 2026-07-28 clients that declare it: "
        "start_operation answers with a task, tasks/get is check_status with its enforced poll interval",
    )
    serve.add_argument(
        "--operator-pubkeys",
        metavar="FILE",
        help=f"operator public keys whose signed decisions the server verifies (env {PUBKEYS_ENV})",
    )
    serve.add_argument(
        "--require-operator-key",
        action="store_true",
        help=f"apply an operator decision only when signed by one of those keys (env {REQUIRE_ENV}=1)",
    )
    with_examples(
        serve,
        "pollwarden serve --providers ~/pollwarden-tables",
        "pollwarden serve --transport http --port 8000 --db ~/pollwarden/pollwarden.db",
    )
    serve.set_defaults(func=cmd_serve)

    demo = sub.add_parser("demo", help="run the built-in demo against a local fake provider")
    demo.add_argument("--db", help="keep the demo's database here (default: a temporary file)")
    demo.add_argument(
        "--team",
        action="store_true",
        help="two `serve --transport http` instances on one database (--db postgresql://… for a team's), "
        "one budget between them",
    )
    with_examples(
        demo,
        "pollwarden demo",
        "pollwarden demo --db /tmp/demo.db   # keep the database to look at",
        "pollwarden demo --team --db postgresql://postgres@127.0.0.1:5432/test   # two instances, one budget",
    )
    demo.set_defaults(func=cmd_demo)

    add_approval_commands(sub)
    add_reopen_command(sub)
    add_audit_commands(sub)
    add_console_command(sub)
    add_provider_commands(sub)
    add_token_commands(sub)
    add_policy_commands(sub)
    add_webhook_commands(sub)
    add_metrics_command(sub)
    add_doctor_command(sub)
    return parser


def log_handler(*, stream: TextIO | None = None, json_lines: bool = False) -> logging.Handler:
    """The stderr handler: one line per record (text, escaped; or JSON), naming the principal."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(PrincipalLogFilter())  # every line names whom it was for (never a token)
    if json_lines:
        handler.setFormatter(JsonLinesFormatter())
    else:
        handler.setFormatter(
            OneLineFormatter("%(asctime)s %(levelname)s %(name)s [%(principal)s]: %(message)s")
        )
    return handler


def setup_logging(*, verbose: bool, stream: TextIO | None = None, json_lines: bool = False) -> None:
    """Log to stderr, one line per record: logged values (ids, provider text) cannot forge log lines.

    `json_lines`: one JSON object per line, and one event per decision (`pollwarden.ops.decision_log`).
    """
    decision_log.use_json(json_lines)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        handlers=[log_handler(stream=stream, json_lines=json_lines)],
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `pollwarden` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(verbose=bool(args.verbose), json_lines=args.log_format == "json")
    # One line per provider request is noise at INFO; pollwarden logs its own decisions.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
        # Flushed here, so a reader that left (`pollwarden providers list | head`) is met by the handler below.
        sys.stdout.flush()
    except PollwardenError as exc:
        print(f"pollwarden: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_CLOSED_PIPE
    return code


def _discard_stdout() -> None:
    """The reader left: say nothing more, and keep the interpreter's last flush from failing again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
