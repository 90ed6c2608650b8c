"""Streamable HTTP resumption, one session's events apart from every other's.

The SDK gives every session's transport the one event store it was built with
and names a stream by the JSON-RPC request id alone (or `_GET_stream`), so two
sessions whose requests share an id write into the same stream: a replay with
one session's `Last-Event-ID` would send the other's tool results. Here each
session's transport gets a view of its own (`SessionEventStores.for_session`):
streams are keyed by session and stream, an event id is found only through the
view of the session that stored it, and a session's events are dropped when
the session ends. The SDK's session manager binds a session to the principal
that opened it, so a view is also one principal's.

Bounded: at most `max_events` events per stream, `max_streams` streams and
`max_session_bytes` bytes per session, `max_bytes` in all (the least recently
written streams go first).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage, jsonrpc_message_adapter

log = logging.getLogger("pollwarden")

__all__ = ["SessionEventStore", "SessionEventStores", "scope_events_by_session"]


def _size(message: JSONRPCMessage | None) -> int:
    return 0 if message is None else len(jsonrpc_message_adapter.dump_json(message, exclude_none=True))


@dataclass
class _Stream:
    events: deque[tuple[EventId, JSONRPCMessage | None, int]] = field(default_factory=deque[Any])
    size: int = 0


@dataclass
class _Session:
    streams: OrderedDict[StreamId, _Stream] = field(default_factory=OrderedDict[StreamId, _Stream])
    size: int = 0


class SessionEventStores:
    """Every HTTP session's resumption events, each session's kept apart and all of them bounded."""

    def __init__(
        self,
        *,
        max_events: int = 256,
        max_streams: int = 64,
        max_session_bytes: int = 4 * 1024 * 1024,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.max_events = max_events
        self.max_streams = max_streams
        self.max_session_bytes = max_session_bytes
        self.max_bytes = max_bytes
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._owner: dict[EventId, tuple[str, StreamId]] = {}
        self._seq = itertools.count(1)
        self.size = 0

    def for_session(self, session_id: str) -> SessionEventStore:
        """The event store one session's transport uses."""
        return SessionEventStore(self, session_id)

    def drop(self, session_id: str) -> None:
        """Forget a session's events (it ended)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        for stream in session.streams.values():
            for event_id, _, _ in stream.events:
                self._owner.pop(event_id, None)
        self.size -= session.size

    def sessions(self) -> int:
        """How many sessions have events kept."""
        return len(self._sessions)

    def store(self, session_id: str, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Keep one event of a session's stream (None is a priming event: a position, nothing to replay)."""
        event_id = f"{next(self._seq)}-{secrets.token_urlsafe(12)}"
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session()
        self._sessions.move_to_end(session_id)
        stream = session.streams.get(stream_id)
        if stream is None:
            stream = session.streams[stream_id] = _Stream()
        session.streams.move_to_end(stream_id)
        size = _size(message)
        stream.events.append((event_id, message, size))
        stream.size += size
        session.size += size
        self.size += size
        self._owner[event_id] = (session_id, stream_id)
        while len(stream.events) > self.max_events:
            self._drop_oldest_event(session, stream)
        while len(session.streams) > self.max_streams:
            self._drop_stream(session, next(iter(session.streams)))
        while session.size > self.max_session_bytes and stream.events:
            oldest = next(iter(session.streams))
            if oldest != stream_id:
                self._drop_stream(session, oldest)
            else:
                self._drop_oldest_event(session, stream)
        while self.size > self.max_bytes and self._sessions:
            coldest_id, coldest = next(iter(self._sessions.items()))
            if coldest.streams:
                self._drop_stream(coldest, next(iter(coldest.streams)))
            if not coldest.streams:
                self._sessions.pop(coldest_id, None)
        return event_id

    async def replay(
        self, session_id: str, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """Send the events after `last_event_id` of its stream, if this session stored it; else None."""
        owner = self._owner.get(last_event_id)
        if owner is None or owner[0] != session_id:
            if owner is not None:
                log.warning("refused an SSE replay of another session's event")
            return None
        stream_id = owner[1]
        session = self._sessions.get(session_id)
        stream = session.streams.get(stream_id) if session is not None else None
        if stream is None:
            return None
        after = False
        for event_id, message, _ in list(stream.events):
            if after and message is not None:
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream_id

    def _drop_oldest_event(self, session: _Session, stream: _Stream) -> None:
        event_id, _, size = stream.events.popleft()
        self._owner.pop(event_id, None)
        stream.size -= size
        session.size -= size
        self.size -= size

    def _drop_stream(self, session: _Session, stream_id: StreamId) -> None:
        stream = session.streams.pop(stream_id)
        for event_id, _, _ in stream.events:
            self._owner.pop(event_id, None)
        session.size -= stream.size
        self.size -= stream.size


class SessionEventStore(EventStore):
    """One session's view of `SessionEventStores`: what one transport stores and replays."""

    def __init__(self, stores: SessionEventStores, session_id: str) -> None:
        self.stores = stores
        self.session_id = session_id

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Keep one event of this session's stream."""
        return self.stores.store(self.session_id, stream_id, message)

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """Replay this session's events after `last_event_id`; another session's id is unknown here."""
        return await self.stores.replay(self.session_id, last_event_id, send_callback)


def scope_events_by_session(
    manager: object, stores: SessionEventStores, *, sessions_per_principal: int | None = None
) -> bool:
    """Give each session the session manager admits a view of `stores` of its own; drop it at the end.

    With `sessions_per_principal`, a principal (a verified token's client, issuer and subject)
    holding that many open sessions gets the SDK's "Too many open sessions" (503) for one more,
    so one principal's throwaway sessions cannot fill the server's for everyone.

    The SDK (2.3) hands every transport its manager's one store and has no
    public seam for this, so the manager's `_admit_session` and
    `_discard_session` are wrapped. False (nothing changed) when the SDK has
    not got them: the caller then serves without resumption rather than with
    a store that sessions share.
    """
    admit: Callable[[Any], Any] | None = getattr(manager, "_admit_session", None)
    discard: Callable[[str, Any], Awaitable[None]] | None = getattr(manager, "_discard_session", None)
    if admit is None or discard is None:
        return False
    owners: dict[str, tuple[object, ...]] = {}

    def principal_of(requestor: Any) -> tuple[object, ...] | None:
        if not isinstance(requestor, dict):
            return None
        context = cast(dict[str, object], requestor)
        return (context.get("client_id"), context.get("issuer"), context.get("subject"))

    def admit_scoped(requestor: Any) -> Any:
        principal = principal_of(requestor)
        held = sum(1 for owner in owners.values() if owner == principal) if principal is not None else 0
        if sessions_per_principal is not None and held >= sessions_per_principal:
            log.warning("refused a new session: its principal already holds %d", held)
            return None
        transport = admit(requestor)
        session_id = getattr(transport, "mcp_session_id", None)
        if transport is not None and session_id is not None:
            transport._event_store = stores.for_session(session_id)
            if principal is not None:
                owners[session_id] = principal
        return transport

    async def discard_scoped(session_id: str, transport: Any) -> None:
        try:
            await discard(session_id, transport)
        finally:
            stores.drop(session_id)
            owners.pop(session_id, None)

    setattr(manager, "_admit_session", admit_scoped)  # noqa: B010 - an instance's own attribute, by design
    setattr(manager, "_discard_session", discard_scoped)  # noqa: B010
    return True
