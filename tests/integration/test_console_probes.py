"""The console serves /healthz, /readyz and /metrics at their usual paths, outside its secret prefix."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from tests.integration.test_console_pages import harness, serving, settings_for, waiting
from tests.support.fake_provider import FakeProvider

# SQLite only: the subject is the console's probe paths (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


async def test_the_console_answers_probes_and_scrapes_without_a_login_and_still_checks_the_host(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    await waiting(h, "probed")
    async with serving(settings_for(h)) as (root, _), httpx2.AsyncClient() as client:
        alive = await client.get(root + "/healthz")
        ready = await client.get(root + "/readyz")
        scraped = await client.get(root + "/metrics")
        foreign = await client.get(root + "/metrics", headers={"Host": "evil.example"})
    assert alive.json() == {"status": "ok"}
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    assert 'pollwarden_operations{status="waiting",stop_reason=""} 1.0' in scraped.text
    assert "op-probed" not in scraped.text  # no ids as labels
    assert foreign.status_code != 200
