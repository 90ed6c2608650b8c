"""axe-core in the console's pages: the accessibility violations a person with a screen reader or a keyboard meets.

axe-core is vendored (tests/support/axe/, MPL-2.0, see its README) so CI needs no network. It is loaded
with Playwright's `evaluate`, which the pages' Content-Security-Policy does not govern, so the console is
checked as it is served.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from playwright.async_api import Page

AXE = Path(__file__).parent / "axe" / "axe.min.js"
AXE_SHA256 = "880970c081707360e64f34cea25ff91892f5bc95675b0776925b9709dd8a68bb"  # axe-core 4.10.3

_RUN = """async () => {
  const found = await axe.run(document, { resultTypes: ["violations"] });
  return found.violations
    .filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.impact} ${v.id}: ${v.help} at ${v.nodes.slice(0, 5).map((n) => n.target.join(" ")).join(", ")}`);
}"""


def _source() -> str:
    data = AXE.read_bytes()
    if hashlib.sha256(data).hexdigest() != AXE_SHA256:
        raise RuntimeError(f"{AXE} is not the vendored axe-core 4.10.3 (sha256 differs)")
    return data.decode("utf-8")


async def serious_violations(page: Page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now, one line each (empty: none)."""
    if not await page.evaluate("() => typeof window.axe !== 'undefined'"):
        await page.evaluate(_source())
    return list(await page.evaluate(_RUN))
