"""Outage is not ambiguity: status requests that fail tell a person what really happened (issue 30, item 7).

The stop reason keeps its contract name (`delivery_ambiguous`, DESIGN §1.11),
but a status GET only observes: after three refused connections, three 503s or
three dropped connections nothing was submitted, and the detail, the
escalation message say so, telling the three apart as the
submission path already does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import check, make_harness, track
from tests.support.fake_provider import FakeProvider, Step, drop_connection, http
from tests.support.ports import free_port

# SQLite only: the subject is the words of an outage (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]

NOTHING_SUBMITTED = "A status request only observes the job: nothing was submitted or changed at the provider"


def assert_told_truthfully(v: dict[str, Any], what: str) -> None:
    assert (v["status"], v["stop_reason"]) == ("escalated", "delivery_ambiguous")
    assert v["stop_detail"].startswith(f"{what} for status requests (last: ")
    assert "transport failures 3 of 3" in v["stop_detail"]
    assert NOTHING_SUBMITTED in v["stop_detail"]
    assert "cannot know what the provider saw" not in v["stop_detail"]
    message = v["escalation"]["message"]
    assert f"Detail: {what} for status requests" in message
    assert NOTHING_SUBMITTED in message
    assert v["allowed_actions"] == ["request_extension"]


async def test_three_refused_connections_say_the_provider_could_not_be_reached_and_nothing_was_submitted(
    tmp_path: Path, fake: FakeProvider
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every connection is refused
    h = make_harness(tmp_path, fake, table={"base_url": nobody})
    async with h.client() as client:
        await track(client, "down")
        views = [await check(client, "down", wait=30) for _ in range(3)]
    assert [v["transport_failures_used"] for v in views] == [1, 2, 3]
    assert_told_truthfully(views[-1], "the provider could not be reached")


@pytest.mark.parametrize(
    ("failures", "what"),
    [
        pytest.param(
            [http(503), http(503), http(503)], "the provider answered with a server error (5xx)", id="503s"
        ),
        pytest.param(
            [drop_connection(), drop_connection(), drop_connection()],
            "the provider gave no complete answer",
            id="dropped-connections",
        ),
    ],
)
async def test_three_failed_status_reads_name_what_failed_and_that_nothing_was_submitted(
    tmp_path: Path, fake: FakeProvider, failures: list[Step], what: str
) -> None:
    fake.script("sick", failures)
    h = make_harness(tmp_path, fake)
    async with h.client() as client:
        await track(client, "sick")
        views = [await check(client, "sick", wait=30) for _ in range(3)]
    assert_told_truthfully(views[-1], what)
    assert len(fake.status_requests("sick")) == 3
