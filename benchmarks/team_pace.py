"""Two server instances on one PostgreSQL, one fleet pace, agents that do what they are told (issue 29).

    python -m benchmarks.team_pace                   # ~70 s: two runs of 30 s
    python -m benchmarks.team_pace --seconds 10      # shorter
    python -m benchmarks.team_pace --engine sqlite   # both instances on one SQLite file

Two `pollwarden serve` processes (stdio) share one PostgreSQL database (a scratch
schema on `POLLWARDEN_TEST_PG`'s server); instance B reaches it through a TCP
proxy in this process that delays every chunk by `--delay-ms` (default 25 ms each
way, so +50 ms a round trip: the issue's slow path). The fake provider's table
has a [fleet] pace of 5/s, burst 3. 20 operations, 10 started on each instance,
whose jobs stay "running"; each operation's agent calls `check_status` through
its instance for `--seconds`:

- run "jitter": `wait_seconds=0`, then sleeps the `retry_after_seconds` it was told
  plus 0.1-0.5 s (the issue's livelock run);
- run "wait": `wait_seconds=5`, again at once.

Prints, per run, the provider's requests per second (by the fake's own clock,
from the first to the last request), the share of the pace used, each
instance's requests, operations with no request, and the busiest window against
`burst + rate·w` (the fake's timestamps). Writes results/team_pace.json
(team_pace_sqlite.json with `--engine sqlite`: two processes on one file, no
added round trip).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
from anyio.abc import SocketStream
from mcp.client import Client

if not __package__:  # run as `python benchmarks/team_pace.py`: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.live import (
    FakeControl,
    call,
    fake_provider_workdir,
    reliability_table,
    script_running,
    serve_params,
    write_table,
)

from benchmarks.measure import DEFAULT_PG_URL, RESULTS_DIR, dump_json, scratch_schema
from benchmarks.pace_simulation import JITTER, envelope_excess
from pollwarden.store import DatabaseLocation

RATE = 5.0
BURST = 3
OPERATIONS = 20


async def _pump(source: SocketStream, sink: SocketStream, delay: float) -> None:
    """A delay line: each chunk leaves `delay` s after it arrived, in order, and chunks in flight overlap
    (as on a link with that latency); sleeping per chunk before reading the next would cap the
    connection at one chunk per `delay` and turn a pipelined trip into several."""
    send, receive = anyio.create_memory_object_stream[tuple[float, bytes]](max_buffer_size=1024)

    async def deliver() -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            async with receive:
                async for due, chunk in receive:
                    await anyio.sleep(max(0.0, due - time.monotonic()))
                    await sink.send(chunk)
        with contextlib.suppress(Exception):
            await sink.send_eof()

    async with anyio.create_task_group() as tg:
        tg.start_soon(deliver)
        async with send:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                while True:
                    chunk = await source.receive()
                    await send.send((time.monotonic() + delay, chunk))


async def delaying_proxy(target_host: str, target_port: int, delay: float, task_status: Any) -> None:
    """Listen on 127.0.0.1 (a free port, reported at start) and forward to the target, `delay` s each way."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def handle(client: SocketStream) -> None:
        async with (
            client,
            await anyio.connect_tcp(target_host, target_port) as server,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(_pump, client, server, delay)
            tg.start_soon(_pump, server, client, delay)

    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    task_status.started(port)
    await listener.serve(handle)


def _via(url: str, port: int) -> str:
    """The same PostgreSQL URL, through 127.0.0.1:port."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


async def run(kind: str, url: str, seconds: float, delay: float, seed: int) -> dict[str, Any]:
    """One run of 20 agents on two instances; its numbers. `url`: a PostgreSQL URL, or a SQLite file's
    path (both instances open that file; no proxy, so `delay` does not apply)."""
    rng = random.Random(seed)
    sqlite = not url.startswith("postgres")
    parts = urlsplit(url)
    with fake_provider_workdir() as (workdir, base_url):
        tables = workdir / "tables"
        table = reliability_table(
            "acme", base_url, base_delay_seconds=0.5, max_delay_seconds=1.0, default_max_status_requests=200
        )
        table["limits"]["max_status_requests"] = 10_000
        table["fleet"] = {"max_requests_per_second": RATE, "burst": BURST}
        write_table(tables, table)
        ops = [f"{kind}-{i:02d}" for i in range(OPERATIONS)]
        instance_of = {op: "A" if n % 2 == 0 else "B" for n, op in enumerate(ops)}
        await script_running(base_url, *ops)
        async with anyio.create_task_group() as tg:
            if sqlite:
                a_db = b_db = DatabaseLocation.sqlite(url)
            else:
                port = await tg.start(
                    delaying_proxy, parts.hostname or "127.0.0.1", parts.port or 5432, delay
                )
                a_db = DatabaseLocation.postgres(url)
                b_db = DatabaseLocation.postgres(_via(url, port))
            async with Client(serve_params(a_db, tables)) as a, Client(serve_params(b_db, tables)) as b:
                clients = {"A": a, "B": b}
                for op in ops:
                    await call(
                        clients[instance_of[op]],
                        "start_operation",
                        provider=table["name"],
                        operation_id=op,
                        provider_job_id=op,
                        max_status_requests=10_000,
                    )
                end = time.monotonic() + seconds
                answers: Counter[str] = Counter()

                async def agent(op: str) -> None:
                    client = clients[instance_of[op]]
                    while time.monotonic() < end:
                        wait = 5.0 if kind == "wait" else 0.0
                        left = end - time.monotonic()
                        result = await call(
                            client, "check_status", operation_id=op, wait_seconds=min(wait, left)
                        )
                        answers[f"{result['outcome']}/{result['delay_source']}"] += 1
                        if kind == "jitter":
                            pause = (result["retry_after_seconds"] or 0.0) + rng.uniform(*JITTER)
                            await anyio.sleep(min(pause, max(0.0, end - time.monotonic())))

                async with anyio.create_task_group() as agents:
                    for op in ops:
                        agents.start_soon(agent, op)
            tg.cancel_scope.cancel()
        fake = FakeControl(base_url)
        try:
            log = [e for op in ops for e in await fake.status_requests(op)]
        finally:
            await fake.aclose()
    stamps = sorted(float(e["started_at_wall"]) for e in log)
    per_op = Counter(str(e["job_id"]) for e in log)
    per_instance = Counter(instance_of[str(e["job_id"])] for e in log)
    span = (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return {
        "run": kind,
        "seconds": seconds,
        "engine": "sqlite" if sqlite else "postgres",
        "b_extra_round_trip_ms": 0 if sqlite else round(2 * delay * 1000),
        "requests": len(stamps),
        "requests_per_second": round(len(stamps) / span, 2) if span else 0.0,
        "pace_used": round(len(stamps) / (BURST - 1 + RATE * span), 3) if span else 0.0,
        "by_instance": dict(sorted(per_instance.items())),
        "operations_without_a_request": sum(1 for op in ops if per_op[op] == 0),
        "requests_per_operation_min_max": [min(per_op[op] for op in ops), max(per_op[op] for op in ops)],
        "busiest_window_excess": round(envelope_excess(stamps, rate=RATE, burst=BURST), 3),
        # The pace is taken at the decision; the request reaches the provider a commit and an HTTP
        # request later, and B's commit is one slower round trip later than A's.
        "busiest_window_excess_with_b_round_trip_slack": round(
            envelope_excess(stamps, rate=RATE, burst=BURST, slack=2 * delay), 3
        ),
        "answers": dict(answers.most_common()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Both runs; print and write the numbers."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--delay-ms", type=float, default=25.0, help="added to each direction for instance B")
    parser.add_argument("--pg", default=DEFAULT_PG_URL)
    parser.add_argument(
        "--engine",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="sqlite: both instances on one SQLite file in a temporary directory (no added round trip)",
    )
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for kind in ("jitter", "wait"):
        if args.engine == "sqlite":
            with tempfile.TemporaryDirectory(prefix="pollwarden-team-pace-") as tmp:
                row = anyio.run(run, kind, str(Path(tmp) / "team.db"), args.seconds, 0.0, args.seed)
        else:
            with scratch_schema(args.pg, f"team_pace_{kind}") as url:
                row = anyio.run(run, kind, url, args.seconds, args.delay_ms / 1000, args.seed)
        rows.append(row)
        print(
            f"{kind:<7} {row['requests']:>4} requests  {row['requests_per_second']:5.2f}/s of {RATE:g}/s  "
            f"used {row['pace_used']:.0%}  A/B {row['by_instance']}  none for {row['operations_without_a_request']} "
            f"ops  per op {row['requests_per_operation_min_max']}  window excess {row['busiest_window_excess']}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("team_pace.json" if args.engine == "postgres" else "team_pace_sqlite.json")
    dump_json(
        path,
        {
            "benchmark": "team_pace",
            "python": platform.python_version(),
            "fleet": {"max_requests_per_second": RATE, "burst": BURST},
            "rows": rows,
        },
        sort_keys=False,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
