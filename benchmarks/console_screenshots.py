"""Screenshots of the operator console for the README, from the demo's database, and page timings.

Runs `pollwarden demo` into a fresh database (one job that succeeds after a
503 + Retry-After, one that escalates and asks for an extension a person must
decide), serves the console on 127.0.0.1, logs in with its one-time URL in
headless system Chromium, and saves a PNG of each page to
benchmarks/results/console-*.png, including the Approvals page after the
stuck job's extension was approved in the browser. Prints how long each page
took to load.

    .venv/bin/python -m benchmarks.console_screenshots
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from playwright.async_api import Page
from tests.support.browser import chromium

from pollwarden.cli.demo import DEMO_TABLE
from pollwarden.config import ServerConfig, load_provider_tables
from pollwarden.console.app import ConsoleSettings, create_app
from pollwarden.console.cli import running_console
from pollwarden.store import DatabaseLocation
from pollwarden.surface.http_serve import HttpOptions, transport_security

RESULTS = Path(__file__).parent / "results"


async def _shoot(db: Path, tables: Path) -> None:
    config = ServerConfig(database=DatabaseLocation.sqlite(db), provider_dirs=(tables,))
    token = secrets.token_urlsafe(32)
    options = HttpOptions(port=0)
    settings = ConsoleSettings(
        config=config,
        login_token=token,
        allowed_hosts=tuple(transport_security(options).allowed_hosts or ()),
        tables=load_provider_tables(config),
    )
    async with running_console(create_app(settings), options) as root, chromium(1440, 900) as browser:
        base = root + settings.prefix
        page = await browser.new_page()
        await page.goto(f"{base}/login?token={token}")
        await page.screenshot(path=str(RESULTS / "console-login.png"), full_page=True)
        async with page.expect_navigation(url=f"{base}/"):
            await page.click("#log-in")
        await _pages(page, base, "", 1440)
        await page.set_viewport_size({"width": 390, "height": 844})
        await _pages(page, base, "-phone", 390)
        await page.set_viewport_size({"width": 1440, "height": 900})
        await page.goto(base + "/approvals")
        await page.click("button.approve")
        await page.screenshot(path=str(RESULTS / "console-approved.png"), full_page=True)
        print(f"approved in the browser: {await page.inner_text('.flash')}")


async def _pages(page: Page, base: str, suffix: str, width: int) -> None:
    shots = [
        ("operations", "/"),
        ("operation", "/operation?id=demo-export-ok"),
        ("escalated", "/operation?id=demo-export-stuck"),
        ("approvals", "/approvals"),
        ("providers", "/providers"),
        ("audit", "/audit"),
    ]
    for name, path in shots:
        started = time.perf_counter()
        await page.goto(base + path)
        elapsed = (time.perf_counter() - started) * 1000
        await page.screenshot(path=str(RESULTS / f"console-{name}{suffix}.png"), full_page=True)
        scroll = await page.evaluate("() => document.documentElement.scrollWidth")
        print(f"{name + suffix:<17} {path:<34} loaded in {elapsed:6.1f} ms, {scroll} px wide at {width} px")


def main() -> int:
    """Make the screenshots; return an exit code."""
    RESULTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pollwarden-screens-") as tmp:
        db = Path(tmp) / "demo.db"
        demo = subprocess.run(
            [sys.executable, "-m", "pollwarden", "demo", "--db", str(db)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if demo.returncode != 0:
            print(demo.stdout + demo.stderr, file=sys.stderr)
            return 1
        tables = Path(tmp) / "tables"
        tables.mkdir()
        # The demo's table, as the demo served it (its fake provider has stopped; only the page needs it).
        (tables / "demo-export.toml").write_text(DEMO_TABLE.format(base_url="http://127.0.0.1:9"))
        anyio.run(_shoot, db, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
