"""Headless Chromium from the system packages, driven by Playwright (the console's tests and screenshots).

Playwright's own browser download does not work on these machines, so the
browser is Debian's ``chromium`` (``apt-get install -y chromium``), launched
with a fresh user-data directory and no background traffic.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

from playwright.async_api import BrowserContext, async_playwright

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

NO_CHROMIUM = (
    "no system Chromium (chromium not on PATH nor at /usr/bin/chromium): install it with "
    "`apt-get install -y chromium` to run the console's browser tests (.ci/run does)"
)


def chromium_path() -> str | None:
    """The system Chromium, or None when it is not installed."""
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


@asynccontextmanager
async def chromium(width: int = 1280, height: int = 900) -> AsyncGenerator[BrowserContext]:
    """A fresh browser context (its own user-data directory), closed and removed afterwards."""
    executable = chromium_path()
    if executable is None:
        raise RuntimeError(NO_CHROMIUM)
    with tempfile.TemporaryDirectory(prefix="pollwarden-chromium-") as profile:
        async with async_playwright() as playwright:
            context = await playwright.chromium.launch_persistent_context(
                profile,
                executable_path=executable,
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": width, "height": height},
            )
            try:
                yield context
            finally:
                await context.close()
