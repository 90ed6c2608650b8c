"""``pollwarden console``: serve the operator console on 127.0.0.1 and print its one-time login URL.

Deciding here meets the same operator authentication as ``pollwarden approve``:
the console starts only at an interactive terminal (stdin and stdout are
terminals; the login URL is shown only there), or with ``--operator-key FILE``,
whose key then signs every decision made in the browser. An agent's shell tool
(no terminal, no key) cannot start one and so cannot approve its own
extension. With ``POLLWARDEN_REQUIRE_OPERATOR_KEY`` the key is required.

The login URL carries the key's authority, so it is shown only on a terminal:
a console started without one (with ``--operator-key``, its output going to a
log) writes the URL to an owner-only file instead (``--login-url-file``,
default ``console-login.url`` in the user's data directory) and prints only
where it is.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import socket
import sys
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from pollwarden.access.operator_keys import PUBKEYS_ENV
from pollwarden.access.person_gate import Deciding, operator_key_for, require_person
from pollwarden.access.principals import SCOPE_OPERATOR
from pollwarden.audit.chain import audit_key_from_env
from pollwarden.cli.options import add_database_options, with_examples, writable_existing_database
from pollwarden.cli.policy import deciding_config
from pollwarden.config import default_db_path, load_config, load_provider_tables
from pollwarden.core.errors import ConfigError
from pollwarden.core.files import write_private_file
from pollwarden.surface.listening import HttpOptions

if TYPE_CHECKING:  # the HTTP stack is imported where the console serves, not by every CLI call
    import uvicorn

__all__ = ["DEFAULT_PORT", "add_console_command", "bind", "running_console", "uvicorn_config"]

log = logging.getLogger("pollwarden.console")

DEFAULT_PORT = 8750

DECIDING = Deciding(
    "pollwarden console",
    "the one-time login URL is shown only there",
    "Nothing was started",
    run="start",
    with_key=" (every decision made in the console is then signed with it)",
    pass_key="start the console with --operator-key FILE",
)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port` (port 0: any free port), so the URL can name the real port."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bare, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port") from exc
    sock.listen(64)
    sock.setblocking(False)
    return sock


def uvicorn_config(app: object, options: HttpOptions) -> uvicorn.Config:
    """uvicorn set up as ``serve --transport http`` is: bounded connections, slow requests cut off."""
    import uvicorn

    from pollwarden.surface.http_serve import GuardedH11Protocol

    protocol = type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"request_timeout_seconds": options.request_timeout_seconds},
    )
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        http=protocol,
        limit_concurrency=options.max_connections,
        timeout_keep_alive=options.keep_alive_seconds,
        h11_max_incomplete_event_size=options.max_header_bytes,
        timeout_graceful_shutdown=2,
        log_config=None,
        access_log=False,
        lifespan="on",
    )


@asynccontextmanager
async def running_console(app: object, options: HttpOptions | None = None) -> AsyncGenerator[str]:
    """Serve `app` in this event loop (tests, screenshots); yields its base URL (a free port by default).

    The socket listens before this yields, so a request made at once waits in
    the backlog until uvicorn has finished starting; no polling for readiness.
    """
    import uvicorn

    options = options or HttpOptions(port=0)
    sock = bind(options.host, options.port)
    server = uvicorn.Server(uvicorn_config(app, options))
    port = int(sock.getsockname()[1])
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(server.serve, [sock])
        try:
            yield f"http://{options.host}:{port}"
        finally:
            server.should_exit = True


def cmd_console(args: argparse.Namespace) -> int:
    """Check who is starting the console, print the login URL, and serve until interrupted."""
    try:
        from pollwarden.console.app import ConsoleSettings, create_app
    except ImportError as exc:  # jinja2 is the optional extra [console]
        raise ConfigError(
            f"the console needs its optional dependencies ({exc.name} is missing): install the [console] "
            "extra; from a clone: .venv/bin/pip install -e '.[console]' (or pip install 'pollwarden[console]')"
        ) from exc

    options = HttpOptions(
        host=args.host,
        port=args.port,
        allow_non_loopback=bool(args.allow_non_loopback),
        allowed_hosts=tuple(args.allowed_host or ()),
        # As for `serve`: beyond loopback only with a verifier (operators' bearer tokens; see SECURITY.md).
        verifier_configured=bool(args.auth_tokens),
    )
    import uvicorn

    from pollwarden.surface.http_serve import transport_security

    security = transport_security(options)  # the same host rule as `serve`
    config = load_config(
        db=args.db,
        providers=args.providers or [],
        operator_pubkeys=args.operator_pubkeys,
        busy_timeout=args.busy_timeout,
    )
    writable_existing_database(config.database)
    config = anyio.run(deciding_config, config)  # the stricter of this console's policy and the database's
    key = operator_key_for(config, args.operator_key, DECIDING) if args.operator_key else None
    if key is None:
        require_person(config, DECIDING)
    verifier = None
    if args.auth_tokens:
        from pollwarden.access.auth import TokenFileVerifier

        verifier = TokenFileVerifier(Path(args.auth_tokens).expanduser())  # refuses a wrong or empty file
    settings = ConsoleSettings(
        config=config,
        login_token=secrets.token_urlsafe(32),
        allowed_hosts=tuple(security.allowed_hosts or ()),
        key=key,
        by=args.by,
        audit_key=audit_key_from_env(),
        refresh_seconds=args.refresh,
        tables=load_provider_tables(config),
        verifier=verifier,
        idle_timeout_seconds=args.idle_timeout * 60,
        anchor_dir=Path(args.anchor_dir).expanduser() if args.anchor_dir else None,
    )
    app = create_app(settings)
    sock = bind(options.host, options.port)
    port = int(sock.getsockname()[1])
    shown_host = f"[{options.host.strip('[]')}]" if ":" in options.host else options.host
    base = f"http://{shown_host}:{port}"
    print(f"pollwarden console on {base}{settings.prefix}/ (database {config.database})", flush=True)
    print(
        f"decisions are recorded as {settings.decided_by!r}, authenticated by {settings.method}", flush=True
    )
    if args.auth_tokens:
        print(
            f"operators' bearer tokens from {args.auth_tokens} (scope {SCOPE_OPERATOR}) are accepted too: "
            f"Authorization: Bearer <token> on {base}{settings.prefix}/",
            flush=True,
        )
    login_url = f"{base}{settings.login_path}?token={settings.login_token}"
    if sys.stdout.isatty():
        print(
            f"open this URL once to log in (it works one time; keep it private):\n\n    {login_url}\n",
            flush=True,
        )
    else:
        where = _write_login_url(login_url, args.login_url_file)
        print(
            f"no terminal to show the login URL on (output may go to a log others read): it is in {where} "
            "(readable by you only); open it once to log in",
            flush=True,
        )
    server = uvicorn.Server(uvicorn_config(app, options))
    server.run(sockets=[sock])
    return 0


def _write_login_url(url: str, path: str | None) -> Path:
    """Write the login URL to an owner-only file (0600, replaced whole, never through a symlink); its path."""
    target = Path(path).expanduser() if path else default_db_path().parent / "console-login.url"
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with write_private_file(target) as handle:
            handle.write(url + "\n")
    except OSError as exc:
        raise ConfigError(
            f"cannot write the login URL to {target}: {exc.strerror or exc}; choose another --login-url-file. "
            "Nothing was started"
        ) from exc
    return target


def add_console_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """Add ``pollwarden console``."""
    p = with_examples(
        sub.add_parser(
            "console",
            help="serve the operator console (every wait, every approval) on 127.0.0.1",
            description="Serve the operator console and print a one-time login URL. Needs a person at an "
            "interactive terminal, or --operator-key FILE (decisions are then signed with it).",
        ),
        "pollwarden console --db ~/.local/share/pollwarden/pollwarden.db",
        "pollwarden console --port 0 --operator-key ~/operator.key",
    )
    add_database_options(p)
    p.add_argument(
        "--providers",
        action="append",
        metavar="DIR",
        help="a directory of provider *.toml tables, as given to `serve` (env POLLWARDEN_PROVIDERS)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="loopback by default; another needs --allow-non-loopback"
    )
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0 picks a free one"
    )
    p.add_argument("--allow-non-loopback", action="store_true", help="as for `serve`: needs --allowed-host")
    p.add_argument(
        "--allowed-host", action="append", metavar="NAME", help="a Host name browsers use (repeatable)"
    )
    p.add_argument(
        "--operator-key",
        metavar="FILE",
        help="sign every decision made in the console with this operator key (no terminal needed then)",
    )
    p.add_argument(
        "--operator-pubkeys",
        metavar="FILE",
        help=f"the operator public keys the server trusts (env {PUBKEYS_ENV})",
    )
    p.add_argument(
        "--by", default="operator", help="who decides, recorded as '<by> (console)' (default: operator)"
    )
    p.add_argument(
        "--auth-tokens",
        metavar="FILE",
        help=f"also accept an operator's bearer token listed in FILE (`pollwarden tokens add NAME --scopes "
        f"{SCOPE_OPERATOR}`); agent tokens are refused",
    )
    p.add_argument(
        "--refresh", type=int, default=10, metavar="SECONDS", help="how often open pages refresh (0: never)"
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=30,
        metavar="MINUTES",
        help="log a browser out after this long without a request from the person (default 30)",
    )
    p.add_argument(
        "--anchor-dir",
        metavar="DIR",
        help="the Audit page may verify against anchor files in DIR, by name (regular files up to 64 KiB)",
    )
    p.add_argument(
        "--login-url-file",
        metavar="FILE",
        help="without a terminal, write the one-time login URL here, owner-only "
        "(default: console-login.url in the data directory)",
    )
    p.set_defaults(func=cmd_console)
