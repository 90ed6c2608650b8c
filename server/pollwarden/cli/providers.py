"""`pollwarden providers list` and `pollwarden providers check`: the tables, and a table against samples."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from pollwarden.cli.options import with_examples
from pollwarden.config import load_config, load_provider_tables
from pollwarden.core.errors import ConfigError
from pollwarden.core.timefmt import iso, parse_iso
from pollwarden.provider_io.table_check import (
    SampleError,
    describe_preview,
    describe_table,
    preview_answer,
    read_sample,
)
from pollwarden_providers.interpret import BodyError, parse_json_object
from pollwarden_providers.loader import TableError, load_table
from pollwarden_providers.table import ProviderTable
from pollwarden_providers.webhook import read_event

__all__ = ["add_provider_commands"]


def _configured_tables(args: argparse.Namespace) -> dict[str, ProviderTable]:
    return load_provider_tables(load_config(providers=args.providers or []))


def cmd_providers_list(args: argparse.Namespace) -> int:
    """Print every table the server would load: the shipped ones, then the configured directories."""
    tables = _configured_tables(args)
    for index, table in enumerate(tables.values()):
        if index:
            print()
        print("\n".join(describe_table(table)))
    return 0


def _table_for_check(args: argparse.Namespace) -> ProviderTable:
    path = Path(args.table)
    if path.suffix == ".toml" or os.sep in args.table or path.is_file():
        return load_table(path)
    tables = _configured_tables(args)
    table = tables.get(args.table)
    if table is None:
        raise TableError(
            args.table,
            "",
            "is neither a table file nor the name of a loaded provider",
            f"give the path of a *.toml file, or one of: {', '.join(sorted(tables))}",
        )
    return table


def cmd_providers_check(args: argparse.Namespace) -> int:
    """Validate a table; with samples, show how each would be classified and what the controller would do."""
    try:
        at = parse_iso(args.at) if args.at else time.time()
    except ValueError as exc:
        raise ConfigError(f"--at: {exc}") from exc
    table = _table_for_check(args)  # a wrong table is a TableError, reported by main
    print(f"ok: the table is valid  ({table.source})")
    print("\n".join(describe_table(table)))
    unreadable = 0
    samples: list[str] = args.response or []
    for sample in samples:
        print()
        try:
            answer = read_sample(Path(sample), received_at=at)
        except SampleError as exc:
            print(f"pollwarden: {exc}", file=sys.stderr)
            unreadable += 1
            continue
        preview = preview_answer(table, answer, started_at=at - args.started_seconds_ago, job_id=args.job_id)
        print("\n".join(describe_preview(sample, preview, at)))
    webhooks: list[str] = args.webhook or []
    webhook_headers: list[str] = args.webhook_header or []
    for sample in webhooks:
        print()
        problem = _check_webhook(table, Path(sample), webhook_headers)
        if problem is not None:
            print(f"pollwarden: {problem}", file=sys.stderr)
            unreadable += 1
    return 1 if unreadable else 0


def _check_webhook(table: ProviderTable, path: Path, header_lines: list[str]) -> str | None:
    """Print what a saved webhook body would do (its signature is not checked here); a problem, or None."""
    if table.webhook is None:
        return f"{path}: the table {table.name} has no [webhook] section, so no webhook is received for it"
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            return (
                f"--webhook-header {line!r}: write it as 'Name: value', e.g. 'X-GitHub-Event: workflow_run'"
            )
        headers[name.strip().lower()] = value.strip()
    try:
        body = parse_json_object(path.read_bytes())
    except OSError as exc:
        return f"{path}: cannot read it ({exc.strerror})"
    except BodyError as exc:
        return f"{path}: {exc}; a webhook sample is the JSON body the provider posts"
    event = read_event(table.webhook, body, headers)
    print(f"{path}")
    if event.problem is not None:
        print(f"  acknowledged and ignored (counted, not stored): {event.problem}")
    elif not event.wakes:
        listed = ", ".join(table.webhook.events)
        print(f"  acknowledged and ignored: event type {event.event_type!r} is not one of {listed}")
    else:
        print(
            f"  event {event.event_type!r} for job {event.job_id!r}: brings the next status check of a "
            "waiting operation on that job forward to now (the status request decides)"
        )
    return None


def add_provider_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:  # pyright: ignore[reportPrivateUsage]
    """Register `providers list` and `providers check`."""
    providers = sub.add_parser(
        "providers", help="list provider tables, or check one against sample responses"
    )
    providers_sub = providers.add_subparsers(dest="providers_command", required=True)

    def add_dirs(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--providers",
            action="append",
            metavar="DIR",
            help="a directory of provider *.toml tables, added to the shipped ones; repeatable "
            "(env POLLWARDEN_PROVIDERS)",
        )

    listing = providers_sub.add_parser(
        "list", help="every table the server would load, with states and limits"
    )
    add_dirs(listing)
    with_examples(
        listing, "pollwarden providers list", "pollwarden providers list --providers ~/pollwarden-tables"
    )
    listing.set_defaults(func=cmd_providers_list)

    check = providers_sub.add_parser(
        "check",
        help="validate a table and show what the controller would do with sample responses",
        description="Validate TABLE (a *.toml file, or the name of a shipped or configured provider). "
        "Each --response is a status answer: a JSON body (read as HTTP 200) or a raw response as "
        "'curl -i' prints it. It is decided as the first status answer of an operation tracking an "
        "existing job with the table's defaults.",
    )
    check.add_argument("table", metavar="TABLE")
    check.add_argument("--response", action="append", metavar="SAMPLE", help="a sample answer; repeatable")
    check.add_argument(
        "--at", help=f"evaluate the samples at this RFC 3339 time (default: now, e.g. {iso(0)})"
    )
    check.add_argument(
        "--started-seconds-ago",
        type=float,
        default=60.0,
        help="how long before --at the operation started (default 60; matters for 404 windows)",
    )
    check.add_argument(
        "--job-id",
        help="the job the operation tracks (default: the id each sample repeats in response.job_id_field)",
    )
    check.add_argument(
        "--webhook",
        action="append",
        metavar="BODY",
        help="a saved webhook body (JSON): show its event type, its job id and whether it wakes; repeatable",
    )
    check.add_argument(
        "--webhook-header",
        action="append",
        metavar="'NAME: VALUE'",
        help="a header sent with the --webhook bodies, e.g. 'X-GitHub-Event: workflow_run'; repeatable",
    )
    add_dirs(check)
    with_examples(
        check,
        "pollwarden providers check ./acme.toml",
        "pollwarden providers check openai-batch --response samples/in_progress.json --response 'curl-i.txt'",
    )
    check.set_defaults(func=cmd_providers_check)
