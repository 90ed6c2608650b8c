"""Memory of a `serve --transport http` process across throwaway sessions (issue 31, item 5).

Fills the database with N operations, then opens S sessions one after the
other, each calling `list_operations(limit=N)` once and leaving; prints the
server's resident set size (VmRSS) before, after S sessions and after 2*S, and
writes `results/session_memory.json`. Memory that stays bounded shows as the
second half adding little; what the SSE event store keeps per session is the
lead's part of issue 31 (BoundedEventStore), so run it after that lands too.

    .venv/bin/python benchmarks/session_memory.py --operations 500 --sessions 60
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

if not __package__:  # run as `python benchmarks/session_memory.py`: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.live import REPO_ROOT, fake_provider_process, write_provider_table

from benchmarks.measure import RESULTS_DIR, dump_json, machine


def rss_mib(pid: int) -> float:
    """The process's resident set size in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS line")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def one_session(url: str, tool: str, arguments: dict[str, object]) -> None:
    async with (
        httpx2.AsyncClient(timeout=60, trust_env=False) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        await client.call_tool(tool, arguments)


async def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    with anyio.fail_after(60):
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"pollwarden serve exited with {proc.returncode}")
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
                continue
            await stream.aclose()
            return


def start_serve(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """`python -m pollwarden serve …`, its stderr to `log_path` (stopped by the caller)."""
    with log_path.open("wb") as log:
        return subprocess.Popen([sys.executable, *args], stderr=log, cwd=str(REPO_ROOT))


async def measure(operations: int, sessions: int, workdir: Path, base_url: str) -> dict[str, object]:
    tables = workdir / "tables"
    tables.mkdir()
    write_provider_table(tables, "acme", base_url)
    port = free_port()
    args = ["-m", "pollwarden", "serve", "--transport", "http", "--port", str(port)]
    args += ["--db", str(workdir / "p.db"), "--providers", str(tables)]
    url = f"http://127.0.0.1:{port}/mcp"
    proc = start_serve(args, workdir / "serve.log")
    try:
        await wait_listening(port, proc)
        async with (
            httpx2.AsyncClient(timeout=60, trust_env=False) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            for n in range(operations):
                await client.call_tool(
                    "start_operation",
                    {"provider": "acme", "operation_id": f"op-{n}", "provider_job_id": f"j{n}"},
                )
        listing = {"limit": operations}
        await one_session(url, "list_operations", listing)  # warm: imports, caches, the first page
        before = rss_mib(proc.pid)
        started = time.monotonic()
        for _ in range(sessions):
            await one_session(url, "list_operations", listing)
        middle = rss_mib(proc.pid)
        for _ in range(sessions):
            await one_session(url, "list_operations", listing)
        after = rss_mib(proc.pid)
        elapsed = time.monotonic() - started
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return {
        "operations": operations,
        "sessions_per_half": sessions,
        "rss_mib_before": round(before, 1),
        "rss_mib_after_first_half": round(middle, 1),
        "rss_mib_after_second_half": round(after, 1),
        "second_half_growth_mib": round(after - middle, 1),
        "seconds": round(elapsed, 1),
    }


def main() -> None:
    """Run once and print the numbers."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--operations", type=int, default=500)
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "session_memory.json")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pollwarden-mem-") as tmp:
        workdir = Path(tmp)
        with fake_provider_process(workdir) as base_url:
            result = anyio.run(measure, options.operations, options.sessions, workdir, base_url)
    for key, value in result.items():
        print(f"{key:28} {value}")
    dump_json(options.out, {"machine": machine(), "result": result})


if __name__ == "__main__":
    main()
