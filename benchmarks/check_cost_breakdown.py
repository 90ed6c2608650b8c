"""Where one check_status spends its time above the floor: each layer's median, in one run.

    python benchmarks/check_cost_breakdown.py                 # 1,500 calls of each kind, about 30 s
    python benchmarks/check_cost_breakdown.py --calls 500     # quicker

`check_cost.py` says how far a check is from its floor; this says where the
rest goes. The same in-process client, server and fake provider as
`check_cost.py`, on SQLite; calls of each kind (a no-op tool call, a bare
GET, a not_yet check, a polled check) are interleaved, and every layer of the
path is timed by wrapping its method with a wall-clock timer, in this process
only: the controller's check, the store's check procedure, the hop to the
database thread and the work in it, the provider request, the answer's
transaction and the view. A wrapper adds about a microsecond per layer.

Prints the medians in milliseconds; writes benchmarks/results/check_cost_breakdown.json.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx2

if not __package__:  # run as `python benchmarks/check_cost_breakdown.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.live import fake_provider_workdir, script_running, structured

from benchmarks.check_cost import server_and_store
from benchmarks.measure import RESULTS_DIR, dump_json, machine, quiet_logs
from pollwarden.flows.controller import Controller
from pollwarden.provider_io.provider_http import ProviderHTTP
from pollwarden.store.planned import Store
from pollwarden.store.sqlite.connection import Database
from pollwarden.store.sqlite.engine import SQLiteStore

BLOCK = 50  # calls of one kind in a row

# (owner, method, label): the layers timed, outermost first.
LAYERS: tuple[tuple[type, str, str], ...] = (
    (Controller, "check_status", "controller.check_status"),
    (Controller, "view", "controller.view"),
    (SQLiteStore, "_begin_check", "store.begin_check"),
    (Controller, "_send_and_record", "controller.send_and_record"),
    (ProviderHTTP, "get_status", "http.get_status"),
    (Store, "apply_answer", "store.apply_answer"),
    (Database, "run", "database.hop"),
    (Database, "_in_thread", "database.work"),  # the hop's work, in the database thread
)


def _timing(samples: dict[str, list[float]], label: str, method: Callable[..., Any]) -> Callable[..., Any]:
    if not inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        def timed_sync(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                samples.setdefault(label, []).append(time.perf_counter() - started)

        return timed_sync

    @functools.wraps(method)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await method(*args, **kwargs)
        finally:
            samples.setdefault(label, []).append(time.perf_counter() - started)

    return timed


def instrument(samples: dict[str, list[float]]) -> None:
    """Wrap every layer of `LAYERS` with a timer into `samples`."""
    for owner, name, label in LAYERS:
        setattr(owner, name, _timing(samples, label, getattr(owner, name)))


async def run(calls: int, warmup: int, workdir: Path, base_url: str) -> dict[str, dict[str, float]]:
    """Time each kind of call and each layer under it (after `warmup` blocks); the medians (ms) by kind."""
    await script_running(base_url, "cost-poll", "cost-idle")
    samples: dict[str, list[float]] = {}
    async with (
        server_and_store(workdir / "breakdown.db", base_url) as (client, _),
        httpx2.AsyncClient(base_url=base_url, timeout=10.0, trust_env=False) as http,
    ):
        instrument(samples)

        kinds: dict[str, Callable[[], Coroutine[Any, Any, Any]]] = {
            "bare_get": lambda: http.get("/v1/jobs/cost-poll"),
            "noop": lambda: client.call_tool("noop", {"operation_id": "poll"}),
            "check_status not_yet": lambda: client.call_tool("check_status", {"operation_id": "idle"}),
            "check_status polled": lambda: client.call_tool("check_status", {"operation_id": "poll"}),
        }
        timed: dict[str, dict[str, list[float]]] = {name: {"call": []} for name in kinds}
        for block in range(warmup + calls // BLOCK):  # interleaved in blocks: drift hits every kind alike
            for name, work in kinds.items():
                for _ in range(BLOCK):
                    samples.clear()
                    started = time.perf_counter()
                    value = await work()
                    elapsed = time.perf_counter() - started
                    if name.startswith("check_status") and not name.endswith(structured(value)["outcome"]):
                        raise RuntimeError(f"{name}: got {structured(value)}")
                    if block >= warmup:
                        timed[name]["call"].append(elapsed)
                        for label, values in samples.items():
                            timed[name].setdefault(label, []).append(sum(values))
    return {
        name: {label: round(statistics.median(values) * 1000, 3) for label, values in layers.items()}
        for name, layers in timed.items()
    }


def render(result: dict[str, dict[str, float]]) -> str:
    """Each kind's call median, then its layers' medians."""
    lines: list[str] = []
    for name, layers in result.items():
        lines.append(f"{name:<24} {layers['call']:>8.3f} ms")
        lines.extend(f"    {label:<28} {ms:>8.3f}" for label, ms in layers.items() if label != "call")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Start the fake provider, time the layers, print and save the medians."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1500, help=f"calls of each kind (in blocks of {BLOCK})")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "check_cost_breakdown.json")
    args = parser.parse_args(argv)
    if not BLOCK <= args.calls <= 100_000:
        parser.error(f"--calls must be {BLOCK} to 100000")
    quiet_logs()
    with fake_provider_workdir() as (workdir, base_url):
        result = anyio.run(run, args.calls, 1, workdir, base_url)
    print(f"check_status by layer, medians over {args.calls} calls of each kind (SQLite, in-process client)")
    print(render(result))
    dump_json(args.out, {"machine": machine(processor=True), "calls": args.calls, "medians_ms": result})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
