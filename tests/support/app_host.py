"""A real MCP Apps host for pollwarden's card: the ext-apps app-bridge in headless Chromium.

The host is what Claude, ChatGPT or VS Code do, in a page: it reads the card's
`ui://` resource through an MCP client connected to `pollwarden serve`, renders
it in a sandboxed iframe under the CSP its `_meta.ui.csp` asks for, hands it a
tool result, and forwards the tools the page calls to the server through the same
client. The browser side is clients/app-host/host.js bundled with the pinned
`@modelcontextprotocol/ext-apps` (clients/app-host/build-host.sh, which CI runs;
it is built here on first use where npm is present).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp.client import Client
from mcp.client.extension import advertise
from mcp_types import CallToolResult
from playwright.async_api import BrowserContext, Frame, Page

from pollwarden.surface.app_card import CARD_URI
from tests.support.browser import chromium

HOST_DIR = Path(__file__).resolve().parents[2] / "clients" / "app-host"
HOST_BUNDLE = HOST_DIR / "dist" / "host.js"
AXE = HOST_DIR / "dist" / "axe.min.js"
# What a client that renders MCP Apps advertises (the SDK's `client_supports_apps` looks for both).
APPS = advertise("io.modelcontextprotocol/ui", {"mimeTypes": ["text/html;profile=mcp-app"]})
HOST_PAGE = '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>host</title></head><body></body></html>'
CARD_WIDTH = 320
# A directory to save the card's screenshots in (the README's come from benchmarks/results).
SCREENSHOTS_ENV = "POLLWARDEN_APP_SCREENSHOTS"
MOUNT_SECONDS = 30.0  # the handshake and first render; a hang fails with the page's console below


def host_missing() -> str | None:
    """Why the test host cannot be built here, or None once it is built."""
    if HOST_BUNDLE.exists() and AXE.exists():
        return None
    if shutil.which("npm") is None:
        return "npm is missing: the MCP App test host (clients/app-host) cannot be built"
    subprocess.run([str(HOST_DIR / "build-host.sh")], check=True, timeout=600, capture_output=True)
    return None


def wire(result: CallToolResult) -> dict[str, Any]:
    """A tool result as the host receives it on the wire (camelCase, no nulls)."""
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass
class CardHost:
    """One browser and the MCP client the host talks to the server through."""

    browser: BrowserContext
    client: Client
    html: str
    csp: dict[str, Any]
    calls: list[str] = field(default_factory=list[str])

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(name)
        return wire(await self.client.call_tool(name, arguments))

    async def page(self) -> Page:
        """A fresh host page with the bridge loaded and tools forwarded to the server."""
        page = await self.browser.new_page()
        await page.set_content(HOST_PAGE)
        await page.add_script_tag(content=HOST_BUNDLE.read_text(encoding="utf-8"))
        await page.expose_function("hostCallTool", self._call_tool)
        return page

    async def show(
        self, tool: str, arguments: dict[str, Any], result: CallToolResult, *, theme: str = "light"
    ) -> tuple[Page, Frame]:
        """Render the card for one tool call, as a host does with a tool whose `_meta.ui` names it."""
        page = await self.page()
        mount = {
            "html": self.html,
            "csp": self.csp,
            "toolInput": arguments,
            "toolResult": wire(result),
            "theme": theme,
            "width": CARD_WIDTH,
        }
        with anyio.fail_after(MOUNT_SECONDS):
            await page.evaluate("(m) => window.pollwardenHost.mount(m)", mount)
        frame = page.frames[1]
        await frame.wait_for_selector("main h1")
        return page, frame

    async def snapshot(self, page: Page, name: str) -> None:
        """Save the card as `app-card-NAME.png` in $POLLWARDEN_APP_SCREENSHOTS, when set (the README's)."""
        where = os.environ.get(SCREENSHOTS_ENV)
        if where:
            height = await page.evaluate(
                "() => Math.ceil(document.querySelector('iframe').getBoundingClientRect().bottom)"
            )
            await page.set_viewport_size({"width": CARD_WIDTH + 40, "height": int(height) + 20})
            await page.locator("iframe").screenshot(path=str(Path(where) / f"app-card-{name}.png"))

    async def model_visible(self) -> list[str]:
        """The tool names a host shows the model: ext-apps' own test of `_meta.ui.visibility`."""
        page = await self.page()
        tools = [wire_tool(t) for t in (await self.client.list_tools()).tools]
        names: list[str] = await page.evaluate("(t) => window.pollwardenHost.modelVisible(t)", tools)
        await page.close()
        return names


def wire_tool(tool: Any) -> dict[str, Any]:
    """A tool definition as it travels (camelCase, `_meta`)."""
    value: dict[str, Any] = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value


@asynccontextmanager
async def card_host(client: Client) -> AsyncGenerator[CardHost]:
    """A browser host for the card, reading the `ui://` page through `client`."""
    [page] = (await client.read_resource(CARD_URI)).contents
    meta: dict[str, Any] = dict(page.meta or {})
    html = str(getattr(page, "text", ""))
    async with chromium(CARD_WIDTH + 40, 900) as browser:
        yield CardHost(browser, client, html, dict(meta.get("ui", {}).get("csp", {})))


async def axe_violations(frame: Frame) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations in the card (the pinned clients/app-host copy)."""
    await frame.add_script_tag(content=AXE.read_text(encoding="utf-8"))
    found: list[dict[str, Any]] = await frame.evaluate(
        "async () => (await axe.run(document)).violations"
        ".filter(v => v.impact === 'serious' || v.impact === 'critical')"
        ".map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.target.join(' '))}))"
    )
    return found


async def page_call(frame: Frame, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tools/call the page itself sends its host (a page that ignores what the card offers)."""
    script = """([name, args]) => new Promise((resolve) => {
        const id = 'direct-' + Math.random();
        window.addEventListener('message', (e) => { if (e.data && e.data.id === id) resolve(e.data); });
        window.parent.postMessage({jsonrpc: '2.0', id, method: 'tools/call', params: {name, arguments: args}}, '*');
    })"""
    answer: dict[str, Any] = await frame.evaluate(script, [name, arguments])
    return answer


def dumps(value: object) -> str:
    """JSON for assertion messages."""
    return json.dumps(value, indent=1, default=str)[:3000]
