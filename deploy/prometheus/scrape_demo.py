"""Scrape a demo run with a real Prometheus, and check the dashboard's and alerts' queries against it.

Needs the `prometheus` and `promtool` binaries (Debian: ``apt-get install prometheus``). Runs
``pollwarden demo`` into a fresh database, serves it with ``pollwarden metrics`` on 127.0.0.1,
lets Prometheus scrape it every second, then runs every query of deploy/grafana/pollwarden.json
and the alert rules through Prometheus's HTTP API and prints what each returned. Exit 1 when a
query fails or the scrape found no pollwarden metric.

    .venv/bin/python deploy/prometheus/scrape_demo.py
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
POLLWARDEN = Path(sys.executable).with_name("pollwarden")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def query(prometheus: str, expr: str) -> dict[str, object]:
    url = f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def wait_for(what: str, ready: object, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if callable(ready) and ready():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} did not come up within {seconds:g} s")


def main() -> int:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        print("prometheus/promtool are not installed (apt-get install prometheus)", file=sys.stderr)
        return 2
    subprocess.run(["promtool", "check", "rules", str(HERE / "alerts.yml")], check=True)
    work = Path(tempfile.mkdtemp(prefix="pollwarden-prometheus-"))
    db = work / "demo.db"
    subprocess.run([str(POLLWARDEN), "demo", "--db", str(db)], check=True, stdout=subprocess.DEVNULL)
    metrics_port, prom_port = free_port(), free_port()
    config = work / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{HERE / 'alerts.yml'}']\n"
        "scrape_configs:\n"
        f"  - job_name: pollwarden\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    subprocess.run(["promtool", "check", "config", str(config)], check=True)
    started: list[subprocess.Popen[bytes]] = []
    try:
        started.append(
            subprocess.Popen(
                [str(POLLWARDEN), "metrics", "--db", str(db), "--port", str(metrics_port)],
                stderr=subprocess.DEVNULL,
            )
        )
        started.append(
            subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={work / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stderr=subprocess.DEVNULL,
            )
        )
        prometheus = f"http://127.0.0.1:{prom_port}"
        wait_for(
            "the first scrape",
            lambda: bool(query(prometheus, "pollwarden_operations")["data"]["result"]),  # type: ignore[index]
        )
        time.sleep(3)  # a few more scrapes, so rate() has two points
        dashboard = json.loads((ROOT / "deploy/grafana/pollwarden.json").read_text())
        exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
        failed = 0
        for expr in exprs:
            answer = query(prometheus, expr)
            result = answer.get("data", {}).get("result", [])  # type: ignore[union-attr]
            ok = answer.get("status") == "success"
            failed += not ok
            print(f"{'ok ' if ok else 'ERR'} {len(result):>2} series  {expr}")
        up = query(prometheus, "pollwarden_operations")["data"]["result"]  # type: ignore[index]
        print("\npollwarden_operations as Prometheus scraped it:")
        for series in up:  # type: ignore[union-attr]
            print(f"  {series['metric']} = {series['value'][1]}")
        rules = json.loads(urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10).read())
        names = [r["name"] for g in rules["data"]["groups"] for r in g["rules"]]
        print(f"\nalert rules loaded: {', '.join(names)}")
        return 1 if failed or not up else 0
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
