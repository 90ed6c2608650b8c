"""Run MCP clients nobody on this project wrote against a real `pollwarden serve`.

- The MCP Inspector CLI, over stdio and streamable HTTP, in both protocol eras
  (2025-11-25 "legacy" and 2026-07-28 "modern"): it lists the tools and
  resource templates, starts an operation, checks it (one status request to
  the fake provider), reads the operation resource, and gets a plain refusal
  naming a bad argument.
- The conformance suite's server scenarios that apply to a server without the
  suite's own test tools and resources, over streamable HTTP.
- The Inspector CLI against a token-protected `serve --auth-tokens FILE`
  (issue 19): refused without a token; with a bearer header (`--header`) it
  lists the tools in both eras, and one principal's operation is an unknown id
  for another. The conformance suite (0.1.16) has no authorization scenarios
  for a server: its `auth/*` scenarios test clients against its own
  authorization server, and `conformance server` sends no token, so none of its
  server scenarios can run against a token-protected server.

The npm packages are pinned in package-lock.json; run-real-clients.sh
installs them (with the Node 22 they need) and then this script. It prints
one line per check and ends with "N passed, M failed"; the exit code is 1 if
anything failed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root: tests/support holds the fake-provider set-up

from tests.support.live import fake_provider_workdir, script_running, write_provider_table  # noqa: E402

BIN = HERE / "node_modules" / ".bin"
PYTHON = sys.executable
CORE_TOOLS = {"start_operation", "check_status", "request_extension", "get_operation", "list_operations"}
ERAS = ("legacy", "modern")
# Server scenarios of @modelcontextprotocol/conformance that apply to any server. The others
# call the suite's own test tools (test_reconnection, test_error_handling, …), read its test
# resources (test://…) or prompts, or need logging / completion, which pollwarden does not offer.
SCENARIOS = (
    "server-initialize",
    "ping",
    "tools-list",
    "resources-list",
    "dns-rebinding-protection",
    "server-sse-multiple-streams",
)
STEP_TIMEOUT_SECONDS = 90


class Checks:
    """Named pass/fail results, printed as they happen."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        if ok:
            self.passed += 1
            print(f"PASS {name}", flush=True)
        else:
            self.failed.append(name)
            print(f"FAIL {name}: {detail[:2000]}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited early ({proc.returncode}): {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listened on 127.0.0.1:{port} within 30 s: {log.read_text()[-2000:]}")


@contextmanager
def background(args: list[str], log: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A child process listening on `port`, stopped (by its own handle) afterwards."""
    with log.open("wb") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=child_env())
        try:
            wait_for_port(port, proc, log)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLWARDEN_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # Node 22 from node_modules first
    return env


def run(args: list[str]) -> tuple[int, str, str]:
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=STEP_TIMEOUT_SECONDS, env=child_env(), check=False
    )
    return done.returncode, done.stdout, done.stderr


def inspector(target: list[str], era: str, method: str, *extra: str) -> tuple[int, Any, str]:
    """One Inspector CLI call; (exit code, the parsed JSON on stdout or None, stderr)."""
    code, out, err = run(
        [
            str(BIN / "inspector"),
            "--cli",
            "-q",
            "--format",
            "json",
            "--protocol-era",
            era,
            "--method",
            method,
            *extra,
            *target,
        ]
    )
    try:
        parsed = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        parsed = None
    return code, parsed, err + out


def call(target: list[str], era: str, tool: str, arguments: dict[str, Any]) -> tuple[int, Any, str]:
    return inspector(
        target, era, "tools/call", "--tool-name", tool, "--tool-args-json", json.dumps(arguments)
    )


def structured(result: Any) -> dict[str, Any]:
    inner = (result or {}).get("result") or {}
    return inner.get("structuredContent") or {}


def error_text(result: Any) -> str:
    inner = (result or {}).get("result") or {}
    return " ".join(block.get("text", "") for block in inner.get("content") or [])


def inspector_checks(checks: Checks, transport: str, target: list[str], base_url: str) -> None:
    """The same story over one transport, in both eras."""
    for era in ERAS:
        where = f"inspector {transport} {era}"
        op = f"rc-{transport}-{era}"
        anyio.run(script_running, base_url, op)  # the fake answers "running" for good

        code, listed, err = inspector(target, era, "tools/list")
        names = {tool["name"] for tool in ((listed or {}).get("result") or {}).get("tools", [])}
        checks.check(f"{where}: tools/list", code == 0 and names >= CORE_TOOLS, err)

        code, templates, err = inspector(target, era, "resources/templates/list")
        uris = {
            t["uriTemplate"] for t in ((templates or {}).get("result") or {}).get("resourceTemplates", [])
        }
        checks.check(
            f"{where}: resources/templates/list",
            code == 0 and "pollwarden://operations/{operation_id}" in uris,
            err,
        )

        code, started, err = call(
            target, era, "start_operation", {"provider": "acme", "operation_id": op, "provider_job_id": op}
        )
        checks.check(
            f"{where}: start_operation", code == 0 and structured(started).get("status") == "waiting", err
        )

        code, checked, err = call(target, era, "check_status", {"operation_id": op, "wait_seconds": 5})
        view = structured(checked)
        checks.check(
            f"{where}: check_status polls once",
            code == 0 and (view.get("outcome"), view.get("state")) == ("polled", "running"),
            err,
        )

        code, read, err = inspector(target, era, "resources/read", "--uri", f"pollwarden://operations/{op}")
        contents = ((read or {}).get("result") or {}).get("contents") or [{}]
        try:
            resource = json.loads(contents[0].get("text") or "{}")
        except json.JSONDecodeError:
            resource = {}
        checks.check(f"{where}: resources/read", code == 0 and resource.get("status_requests_used") == 1, err)

        bad = {
            "provider": "acme",
            "provider_job_id": "x",
            "business_deadline_at": "9999-12-31T23:59:59-23:59",
        }
        code, refused, err = call(target, era, "start_operation", bad)
        text = error_text(refused)
        checks.check(
            f"{where}: a bad argument is refused by name",
            code == 5 and "business_deadline_at" in text and "Error executing tool" not in text,
            f"exit {code}: {text or err}",
        )


def conformance_checks(checks: Checks, url: str) -> None:
    for scenario in SCENARIOS:
        code, out, err = run([str(BIN / "conformance"), "server", "--url", url, "--scenario", scenario])
        checks.check(f"conformance {scenario}", code == 0 and "0 failed" in out, out[-1500:] + err[-500:])


def add_token(tokens: Path, name: str) -> str:
    """`pollwarden tokens add NAME` for real; the token it prints once."""
    code, out, err = run(
        [
            PYTHON,
            "-m",
            "pollwarden",
            "tokens",
            "add",
            name,
            "--scopes",
            "pollwarden:agent",
            "--file",
            str(tokens),
        ]
    )
    if code != 0:
        raise SystemExit(f"pollwarden tokens add {name} failed: {err}")
    return out.strip()


def auth_checks(checks: Checks, serve: list[str], tmp: Path, base_url: str) -> None:
    """A token-protected server: no token, no entry; a bearer header per principal; principals apart."""
    tokens = tmp / "tokens"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    target = ["--server-url", url, "--transport", "http"]
    args = [*serve, "--transport", "http", "--port", str(port), "--auth-tokens", str(tokens)]
    with background(args, tmp / "http-auth.log", port):
        code, _, err = inspector(target, "modern", "tools/list")
        # The Inspector reads the 401 challenge and wants an OAuth flow it cannot run unattended.
        checks.check(
            "inspector http+tokens: refused without a token (the client is told to authorize)",
            code != 0 and "auth_required" in err,
            err,
        )
        for era in ERAS:
            code, listed, err = inspector(
                target, era, "tools/list", "--header", f"Authorization: Bearer {alice}"
            )
            names = {tool["name"] for tool in ((listed or {}).get("result") or {}).get("tools", [])}
            checks.check(
                f"inspector http+tokens {era}: tools/list with a bearer token",
                code == 0 and names >= CORE_TOOLS,
                err,
            )
        op = "rc-auth"
        anyio.run(script_running, base_url, op)
        as_alice = [*target, "--header", f"Authorization: Bearer {alice}"]
        code, started, err = call(
            as_alice,
            "modern",
            "start_operation",
            {"provider": "acme", "operation_id": op, "provider_job_id": op},
        )
        checks.check(
            "inspector http+tokens: alice starts an operation",
            code == 0 and structured(started).get("status") == "waiting",
            err,
        )
        as_bob = [*target, "--header", f"Authorization: Bearer {bob}"]
        code, theirs, err = call(as_bob, "modern", "get_operation", {"operation_id": op})
        checks.check(
            "inspector http+tokens: alice's operation is an unknown id for bob",
            code == 5 and "no operation" in error_text(theirs).lower(),
            f"exit {code}: {error_text(theirs) or err}",
        )


def main() -> int:
    checks = Checks()
    started = time.monotonic()
    with fake_provider_workdir(prefix="pollwarden-real-clients-") as (tmp, base_url):
        tables = tmp / "tables"
        write_provider_table(tables, "acme", base_url, base_delay_seconds=0.2, max_delay_seconds=0.5)
        db = tmp / "pollwarden.db"
        serve = [PYTHON, "-m", "pollwarden", "serve", "--db", str(db), "--providers", str(tables)]

        inspector_checks(checks, "stdio", ["--", *serve], base_url)

        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        with background([*serve, "--transport", "http", "--port", str(port)], tmp / "http.log", port):
            inspector_checks(checks, "http", ["--server-url", url, "--transport", "http"], base_url)
            conformance_checks(checks, url)
        auth_checks(checks, serve, tmp, base_url)
    print(f"real clients: {time.monotonic() - started:.0f} s")
    print(f"{checks.passed} passed, {len(checks.failed)} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
