"""Telling subscribed clients when an operation changes, whichever process changed it.

A client subscribes to `pollwarden://operations/{id}` (or `.../audit`): with
`subscriptions/listen` in the 2026-07-28 era, with `resources/subscribe` in
2025-11-25. Several server processes share one database, so a change made by
another process is only visible in the database: a bounded watcher re-reads
the subscribed operations on a short interval and sends
`notifications/resources/updated` when one changed. It uses only the store's
public read (`get`).

What counts as a change is pure (`watch_key`): for the operation view its
status, provider state or stop reason; for the audit story any new recorded
version of the operation.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import unquote

import anyio

log = logging.getLogger("pollwarden")

URI_PREFIX = "pollwarden://operations/"
AUDIT_SUFFIX = "/audit"
# How often the watcher re-reads subscribed operations, and how many URIs one server watches.
WATCH_INTERVAL_SECONDS = 0.5
MAX_WATCHED_URIS = 1000
# Shares of that cap (issue 31): one session (a 2025-11-25 connection or one listen stream), one principal.
MAX_URIS_PER_SESSION = 100
MAX_URIS_PER_PRINCIPAL = 250


@dataclass(frozen=True)
class Watched:
    """What a resource URI names: an operation's view, or its audit story."""

    operation_id: str
    audit: bool


def parse_uri(uri: str) -> Watched | None:
    """The operation a pollwarden resource URI names, or None for any other URI."""
    if not uri.startswith(URI_PREFIX):
        return None
    rest = uri[len(URI_PREFIX) :]
    audit = rest.endswith(AUDIT_SUFFIX)
    if audit:
        rest = rest[: -len(AUDIT_SUFFIX)]
    operation_id = unquote(rest)
    return Watched(operation_id, audit) if operation_id else None


class Watchable(Protocol):
    """What the watcher reads of an operation record."""

    @property
    def status(self) -> str: ...
    @property
    def state(self) -> str | None: ...
    @property
    def stop_reason(self) -> str | None: ...
    @property
    def version(self) -> int: ...


def watch_key(watched: Watched, record: Watchable | None) -> Hashable:
    """What must differ for a subscriber to be told the resource changed."""
    if record is None:
        return None
    if watched.audit:
        return record.version
    return (record.status, record.state, record.stop_reason)


def changed(before: Mapping[str, Hashable], after: Mapping[str, Hashable]) -> list[str]:
    """The URIs whose key moved; a URI seen for the first time has no 'before' and is not a change."""
    return [uri for uri, key in after.items() if uri in before and before[uri] != key]


class Reader(Protocol):
    """The one store read the watcher needs."""

    async def get(self, operation_id: str) -> Watchable | None: ...


Notify = Callable[[str], Awaitable[bool]]


@dataclass
class Subscriptions:
    """Who listens to which URI, and what each URI looked like when last read.

    `listeners` counts open 2026-07-28 listen streams per URI (the SDK's bus
    delivers to them); `senders` holds, per URI, one notify function per
    2025-11-25 session that subscribed (False back from one drops it: the
    session is gone).
    """

    max_uris: int = MAX_WATCHED_URIS
    max_per_session: int = MAX_URIS_PER_SESSION
    max_per_principal: int = MAX_URIS_PER_PRINCIPAL
    listeners: dict[str, int] = field(default_factory=dict[str, int])
    senders: dict[str, dict[object, Notify]] = field(default_factory=dict[str, dict[object, Notify]])
    keys: dict[str, Hashable] = field(default_factory=dict[str, Hashable])
    # Who holds what: each principal's count (subscriptions and listened URIs), each session's URIs and owner.
    held: dict[str, int] = field(default_factory=dict[str, int])
    by_session: dict[object, set[str]] = field(default_factory=dict[object, set[str]])
    owner_of: dict[object, str] = field(default_factory=dict[object, str])
    # Sessions that ended (their connection was collected); forgotten at the next subscribe or tick.
    gone: list[object] = field(default_factory=list[object])

    def refusal(self, principal: str, session: object | None, uris: list[str]) -> str | None:
        """Why these new URIs do not fit (the server's cap, the session's or the principal's share), or None."""
        new = [
            u for u in dict.fromkeys(uris) if session is None or u not in self.by_session.get(session, set())
        ]
        if not self.room_for(new):
            return f"this server watches at most {self.max_uris} resources; end another subscription first"
        mine = len(self.by_session.get(session, set())) if session is not None else 0
        if mine + len(new) > self.max_per_session:
            return (
                f"one session may watch at most {self.max_per_session} resources; unsubscribe from one first"
            )
        if self.held.get(principal, 0) + len(new) > self.max_per_principal:
            return (
                f"one principal may watch at most {self.max_per_principal} resources across its sessions; "
                "unsubscribe from one first"
            )
        return None

    def _hold(self, principal: str, count: int) -> None:
        left = self.held.get(principal, 0) + count
        if left > 0:
            self.held[principal] = left
        else:
            self.held.pop(principal, None)

    def forget_gone(self) -> None:
        """Drop every subscription of the sessions that ended."""
        while self.gone:
            session = self.gone.pop()
            for uri in list(self.by_session.get(session, ())):
                self.unsubscribe(uri, session)
            self.by_session.pop(session, None)
            self.owner_of.pop(session, None)

    def uris(self) -> set[str]:
        """Every URI somebody listens to."""
        return set(self.listeners) | {uri for uri, sessions in self.senders.items() if sessions}

    def room_for(self, uris: list[str]) -> bool:
        """Whether these URIs fit under the cap."""
        return len(self.uris() | set(uris)) <= self.max_uris

    async def baseline(self, reader: Reader, uris: list[str]) -> None:
        """Remember what a newly subscribed URI looks like now, so the next change is seen."""
        for uri in uris:
            watched = parse_uri(uri)
            if watched is not None and uri not in self.keys:
                self.keys[uri] = watch_key(watched, await reader.get(watched.operation_id))

    def listen(self, uris: list[str], principal: str = "") -> None:
        """A listen stream of `principal` opened for these URIs."""
        self._hold(principal, len(uris))
        for uri in uris:
            self.listeners[uri] = self.listeners.get(uri, 0) + 1

    def unlisten(self, uris: list[str], principal: str = "") -> None:
        """A listen stream for these URIs ended."""
        self._hold(principal, -len(uris))
        for uri in uris:
            left = self.listeners.get(uri, 0) - 1
            if left > 0:
                self.listeners[uri] = left
            else:
                self.listeners.pop(uri, None)
        self._forget_unwatched()

    def subscribe(self, uri: str, session: object, notify: Notify, principal: str = "") -> None:
        """A 2025-11-25 session of `principal` subscribed to `uri`."""
        held = self.by_session.setdefault(session, set())
        if uri not in held:
            held.add(uri)
            self._hold(principal, 1)
        self.owner_of[session] = principal
        self.senders.setdefault(uri, {})[session] = notify

    def unsubscribe(self, uri: str, session: object) -> None:
        """A 2025-11-25 session unsubscribed from `uri`."""
        if uri in self.by_session.get(session, set()):
            self.by_session[session].discard(uri)
            self._hold(self.owner_of.get(session, ""), -1)
        self.senders.get(uri, {}).pop(session, None)
        self._forget_unwatched()

    def _forget_unwatched(self) -> None:
        watched = self.uris()
        for uri in [u for u in self.keys if u not in watched]:
            del self.keys[uri]
        for uri in [u for u, sessions in self.senders.items() if not sessions]:
            del self.senders[uri]

    async def tick(self, reader: Reader, publish: Callable[[str], Awaitable[None]]) -> list[str]:
        """Read every watched operation once; tell the subscribers of each URI that changed."""
        self.forget_gone()
        current: dict[str, Hashable] = {}
        for uri in sorted(self.uris()):
            watched = parse_uri(uri)
            if watched is not None:
                current[uri] = watch_key(watched, await reader.get(watched.operation_id))
        moved = changed(self.keys, current)
        self.keys.update(current)
        for uri in moved:
            if uri in self.listeners:
                await publish(uri)
            for session, notify in list(self.senders.get(uri, {}).items()):
                if not await notify(uri):
                    self.unsubscribe(uri, session)
        return moved


async def run_watcher(
    subscriptions: Subscriptions,
    reader: Reader,
    publish: Callable[[str], Awaitable[None]],
    *,
    interval: float = WATCH_INTERVAL_SECONDS,
) -> None:
    """Re-read the subscribed operations every `interval` seconds until cancelled (a failed read is logged)."""
    while True:
        await anyio.sleep(interval)
        if not subscriptions.uris():
            continue
        try:
            await subscriptions.tick(reader, publish)
        except Exception:  # the database may be locked or gone for a moment; try again next tick
            log.warning("resource watcher: could not read the subscribed operations", exc_info=True)
