"""The demo's job provider: a few scripted answers to ``GET /v1/jobs/{job_id}`` on 127.0.0.1.

Each job answers with its script in turn (the last answer repeats). It counts
the status requests and how many were in flight at once, so the demo can show
what pollwarden sent. The hostile fake provider the tests use lives with them
(tests/support/fake_provider.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RESULT_URL = "https://files.example/{job_id}.csv"


@dataclass(frozen=True)
class Answer:
    """One scripted answer: a status code, headers and a JSON body."""

    status: int = 200
    body: Mapping[str, Any] = field(default_factory=dict[str, Any])
    headers: Mapping[str, str] = field(default_factory=dict[str, str])


def pending(state: str = "running") -> Answer:
    """A 200 saying the job is still `state`."""
    return Answer(body={"state": state})


def succeeded(job_id: str) -> Answer:
    """A 200 saying the job succeeded, with its result URL."""
    return Answer(body={"state": "succeeded", "result_url": RESULT_URL.format(job_id=job_id)})


def http(
    status: int, headers: Mapping[str, str] | None = None, body: Mapping[str, Any] | None = None
) -> Answer:
    """Any other answer, e.g. ``http(503, headers={"Retry-After": "1"})``."""
    return Answer(status=status, body=dict(body or {}), headers=dict(headers or {}))


class DemoProvider:
    """The scripts, and what the provider saw."""

    def __init__(self) -> None:
        self.base_url = ""
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Answer]] = {}
        self._served: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self._max_in_flight: dict[str, int] = {}

    def script(self, job_id: str, answers: Sequence[Answer]) -> None:
        """Answer status requests for `job_id` with `answers` in turn (the last one repeats)."""
        with self._lock:
            self._scripts[job_id] = list(answers)
            self._served[job_id] = 0

    def status_requests(self, job_id: str) -> int:
        """How many status requests for `job_id` arrived."""
        with self._lock:
            return self._served.get(job_id, 0)

    def max_in_flight(self, job_id: str) -> int:
        """The most status requests for `job_id` that were in flight at once."""
        with self._lock:
            return self._max_in_flight.get(job_id, 0)

    def begin(self, job_id: str) -> Answer | None:
        """The next answer for a status request on `job_id` (None: no such job); `end` follows it."""
        with self._lock:
            script = self._scripts.get(job_id)
            if script is None:
                return None
            answer = script[min(self._served[job_id], len(script) - 1)]
            self._served[job_id] += 1
            self._in_flight[job_id] = self._in_flight.get(job_id, 0) + 1
            self._max_in_flight[job_id] = max(self._max_in_flight.get(job_id, 0), self._in_flight[job_id])
            return answer

    def end(self, job_id: str) -> None:
        """A status request `begin` answered has been sent."""
        with self._lock:
            self._in_flight[job_id] -= 1


def _handler(provider: DemoProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            prefix = "/v1/jobs/"
            job_id = self.path[len(prefix) :] if self.path.startswith(prefix) else ""
            scripted = provider.begin(job_id) if job_id else None
            try:
                answer = scripted or http(404, body={"error": "no such job"})
                payload = json.dumps(answer.body).encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            finally:
                if scripted is not None:
                    provider.end(job_id)

        def log_message(self, format: str, *args: Any) -> None:
            del format, args  # the demo prints what pollwarden decided, not an access log

    return Handler


@contextmanager
def running_demo_provider() -> Generator[DemoProvider]:
    """Serve a demo provider on a free 127.0.0.1 port for the ``with`` block."""
    provider = DemoProvider()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(provider))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="demo-provider", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        provider.base_url = f"http://{host!s}:{port}"
        yield provider
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
