"""The fake provider must be trustworthy: other tests prove pollwarden's behaviour with it."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx2
import pytest
from pydantic import ValidationError

from tests.support.fake_provider import (
    FakeProvider,
    Step,
    drop_connection,
    failed,
    http,
    pending,
    running_fake_provider,
    serve_fake_provider,
    succeeded,
)
from tests.support.live import REPO_ROOT

# SQLite only: the subject is the fake provider itself (tests/conftest.py).
pytestmark = pytest.mark.one_engine


@pytest.fixture(scope="module")
def served() -> Iterator[FakeProvider]:
    # One server for the module keeps the file fast; each test starts from a reset.
    with running_fake_provider() as fake:
        yield fake


@pytest.fixture
def fake(served: FakeProvider) -> FakeProvider:
    served.reset()
    return served


@pytest.fixture
def client(fake: FakeProvider) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=fake.base_url, timeout=5.0) as c:
        yield c


def test_a_scripted_job_answers_each_step_in_order_then_repeats_the_last(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    fake.script("exp_1", [pending("queued"), http(503, headers={"Retry-After": "1"}), succeeded()])

    answers = [client.get("/v1/jobs/exp_1") for _ in range(5)]

    assert [r.status_code for r in answers] == [200, 503, 200, 200, 200]
    assert answers[0].json() == {"state": "queued"}
    assert answers[1].headers["retry-after"] == "1"
    assert answers[2].json() == {"state": "succeeded", "result_url": "https://files.example/exp_1.csv"}
    assert answers[4].json() == answers[2].json()
    assert [e["step_index"] for e in fake.status_requests("exp_1")] == [0, 1, 2, 2, 2]


def test_builders_make_the_documented_bodies(fake: FakeProvider, client: httpx2.Client) -> None:
    fake.script("b", [pending(progress=50), failed(error={"code": "E1"})])

    assert client.get("/v1/jobs/b").json() == {"state": "running", "progress": 50}
    assert client.get("/v1/jobs/b").json() == {"state": "failed", "error": {"code": "E1"}}


def test_an_unscripted_job_answers_404_not_found(fake: FakeProvider, client: httpx2.Client) -> None:
    answer = client.get("/v1/jobs/nobody")

    assert answer.status_code == 404
    assert answer.json() == {"error": "not found"}
    assert len(fake.status_requests("nobody")) == 1


def test_a_default_submission_answers_202_with_an_id_and_a_location(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    answer = client.post("/v1/jobs", json={"report": "q1"})

    assert answer.status_code == 202
    job_id = answer.json()["id"]
    assert answer.json() == {"id": job_id, "state": "queued"}
    assert answer.headers["location"] == f"/v1/jobs/{job_id}"
    [entry] = fake.requests_for(job_id)
    assert entry["route"] == "submit"
    assert json.loads(entry["body"]) == {"report": "q1"}


def test_a_reused_idempotency_key_returns_the_same_job_without_creating_another(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    first = client.post("/v1/jobs", json={}, headers={"Idempotency-Key": "k-1"})
    again = client.post("/v1/jobs", json={}, headers={"Idempotency-Key": "k-1"})
    other = client.post("/v1/jobs", json={}, headers={"Idempotency-Key": "k-2"})

    assert first.json()["id"] == again.json()["id"]
    assert other.json()["id"] != first.json()["id"]
    submissions = [e for e in fake.log() if e["route"] == "submit"]
    assert [e["idempotency_key"] for e in submissions] == ["k-1", "k-1", "k-2"]
    assert [e["idempotent_replay"] for e in submissions] == [False, True, False]


def test_a_dropped_submission_still_creates_the_job_a_retry_with_the_same_key_finds(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    fake.script_submit([drop_connection(), http(202, body={"id": "{job_id}"})])
    fake.script_new_jobs([pending("queued")])

    with pytest.raises(httpx2.TransportError):
        client.post("/v1/jobs", json={}, headers={"Idempotency-Key": "k"})
    retry = client.post("/v1/jobs", json={}, headers={"Idempotency-Key": "k"})

    job_id = retry.json()["id"]
    assert [e["job_id"] for e in fake.log()] == [job_id, job_id]
    assert client.get(f"/v1/jobs/{job_id}").json() == {"state": "queued"}


def test_cancel_answers_202_by_default_and_follows_its_own_script(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    assert client.post("/v1/jobs/c1/cancel").json() == {"id": "c1", "state": "cancelled"}

    fake.script_cancel("c2", [http(409, body={"error": "already done"})])
    assert client.post("/v1/jobs/c2/cancel").status_code == 409


def test_the_log_records_every_header_lower_cased_and_the_body(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    fake.script("h", [pending()])

    client.get("/v1/jobs/h?verbose=1", headers={"Authorization": "Bearer s3cret", "X-Trace": "t"})

    [entry] = fake.status_requests("h")
    assert entry["headers"]["authorization"] == "Bearer s3cret"
    assert entry["headers"]["x-trace"] == "t"
    assert all(name == name.lower() for name in entry["headers"])
    assert entry["query"] == "verbose=1"
    assert entry["status"] == 200
    assert entry["finished_at"] is not None
    assert entry["started_at"] <= entry["finished_at"]


def test_a_long_request_body_is_logged_truncated_to_10_kb(fake: FakeProvider, client: httpx2.Client) -> None:
    client.post("/v1/jobs", content=b"x" * 50_000)

    [entry] = fake.log()
    assert entry["body_bytes"] == 50_000
    assert len(entry["body"]) == 10 * 1024


def test_an_encoded_job_id_is_routed_and_logged_exactly_as_sent(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    fake.script("../admin", [pending()])

    answer = client.get("/v1/jobs/..%2Fadmin")

    assert answer.json() == {"state": "running"}
    [entry] = fake.status_requests("../admin")
    assert entry["raw_path"] == "/v1/jobs/..%2Fadmin"
    assert entry["raw_job_id"] == "..%2Fadmin"


def test_unknown_paths_answer_404_and_are_logged(fake: FakeProvider, client: httpx2.Client) -> None:
    answer = client.get("/admin", headers={"Authorization": "Bearer s3cret"})

    assert answer.status_code == 404
    [entry] = fake.log()
    assert (entry["route"], entry["raw_path"], entry["status"]) == ("unknown", "/admin", 404)
    assert entry["headers"]["authorization"] == "Bearer s3cret"


def test_sequential_requests_for_one_job_are_never_in_flight_together(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    fake.script("seq", [pending()])

    for _ in range(20):
        client.get("/v1/jobs/seq")

    assert fake.max_in_flight("seq") == 1


def test_two_concurrent_slow_requests_for_one_job_are_both_in_flight(fake: FakeProvider) -> None:
    fake.script("race", [pending().replace(delay_seconds=0.3)])

    both_ready = threading.Barrier(2, timeout=10)

    def poll(_: int) -> int:
        # A client each, so the two requests really use two connections at once; both built before
        # either asks (building one can take longer than the 0.3 s answer on a loaded machine).
        with httpx2.Client(base_url=fake.base_url, timeout=5.0) as own:
            both_ready.wait()
            return own.get("/v1/jobs/race").status_code

    with ThreadPoolExecutor(max_workers=2) as pool:
        statuses = list(pool.map(poll, range(2)))

    assert statuses == [200, 200]
    assert fake.max_in_flight("race") == 2
    assert sorted(e["in_flight"] for e in fake.status_requests("race")) == [1, 2]


def test_a_gzip_bomb_step_declares_gzip_and_inflates_to_the_scripted_size(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    fake.script("bomb", [Step(gzip_bomb_bytes=1_000_000)])

    with client.stream("GET", "/v1/jobs/bomb") as answer:
        compressed = b"".join(answer.iter_raw())

    assert answer.headers["content-encoding"] == "gzip"
    assert len(compressed) < 10_000
    assert gzip.decompress(compressed) == bytes(1_000_000)


def test_close_connection_gives_the_client_a_transport_error_and_the_next_request_works(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    fake.script("drop", [drop_connection(), pending()])

    with pytest.raises(httpx2.TransportError):
        client.get("/v1/jobs/drop")
    after = client.get("/v1/jobs/drop")

    assert after.json() == {"state": "running"}
    dropped, answered = fake.status_requests("drop")
    assert (dropped["dropped"], dropped["status"]) == (True, None)
    assert (answered["dropped"], answered["status"]) == (False, 200)
    assert fake.max_in_flight("drop") == 1


def test_a_trickled_body_arrives_slowly_and_stays_in_flight_until_done(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    # 10-byte pieces every 50 ms: 40 bytes take three pauses, about 0.15 s.
    fake.script("slow", [pending().replace(trickle_bytes_per_second=200, trickle_total_bytes=40)])

    started = time.monotonic()
    with client.stream("GET", "/v1/jobs/slow") as answer:
        pieces = list(answer.iter_raw())
    elapsed = time.monotonic() - started

    body = b"".join(pieces)
    assert len(body) == 40
    assert json.loads(body) == {"state": "running"}  # padding is JSON whitespace
    assert len(pieces) >= 2
    assert elapsed >= 0.12
    [entry] = fake.status_requests("slow")
    assert entry["finished_at"] is not None
    assert entry["finished_at"] - entry["started_at"] >= 0.12


def test_leaving_the_context_cuts_off_a_request_still_being_answered() -> None:
    errors: list[Exception] = []

    def poll(base_url: str) -> None:
        try:
            httpx2.get(f"{base_url}/v1/jobs/stuck", timeout=10.0)
        except httpx2.TransportError as exc:
            errors.append(exc)

    with ThreadPoolExecutor(max_workers=1) as pool:
        with running_fake_provider() as fake:
            fake.script("stuck", [pending().replace(delay_seconds=30)])
            waiting = pool.submit(poll, fake.base_url)
            while not fake.status_requests("stuck"):
                time.sleep(0.01)
            left_at = time.monotonic()
        waiting.result(timeout=5)
        assert time.monotonic() - left_at < 1.5

    assert len(errors) == 1
    [entry] = fake.status_requests("stuck")
    assert entry["dropped"]


def test_the_control_endpoints_script_read_and_reset_over_http(
    fake: FakeProvider, client: httpx2.Client
) -> None:
    steps = [pending("queued").model_dump(mode="json"), Step(raw_body=b"\xff\x00").model_dump(mode="json")]
    assert client.post("/_control/script", json={"job_id": "remote", "steps": steps}).json() == {"ok": True}

    assert client.get("/v1/jobs/remote").json() == {"state": "queued"}
    assert client.get("/v1/jobs/remote").content == b"\xff\x00"
    log = client.get("/_control/log").json()
    assert [e["raw_path"] for e in log] == ["/v1/jobs/remote", "/v1/jobs/remote"]
    assert client.get("/_control/log", params={"job_id": "other"}).json() == []

    bad = client.post("/_control/script", json={"job_id": "x", "steps": [{"stauts": 200}]})
    assert bad.status_code == 400

    assert client.post("/_control/reset").json() == {"ok": True}
    assert client.get("/_control/log").json() == []
    assert client.get("/v1/jobs/remote").status_code == 404


def test_a_step_with_two_bodies_is_refused() -> None:
    with pytest.raises(ValidationError):
        Step(body={"state": "running"}, raw_body_text="running")


def test_serve_fake_provider_runs_inside_a_task_group() -> None:
    async def scenario() -> int:
        status = 0
        async with anyio.create_task_group() as tg:
            fake = await tg.start(serve_fake_provider)
            fake.script("async", [succeeded()])
            async with httpx2.AsyncClient(base_url=fake.base_url) as c:
                status = (await c.get("/v1/jobs/async")).status_code
            tg.cancel_scope.cancel()
        return status

    assert anyio.run(scenario) == 200


def test_the_module_runs_standalone_and_prints_its_base_url() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "server"), str(REPO_ROOT / "providers")]),
    }
    with subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_provider", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    ) as proc:
        try:
            assert proc.stderr is not None
            base_url = proc.stderr.readline().strip()
            assert base_url.startswith("http://127.0.0.1:")
            answer = httpx2.get(f"{base_url}/v1/jobs/none", timeout=5.0)
            assert answer.status_code == 404
        finally:
            proc.send_signal(signal.SIGINT)
            returncode = proc.wait(timeout=5)
    assert returncode == 0
