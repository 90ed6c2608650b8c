"""The exceptions pollwarden raises, in one tree.

PollwardenError
├── ConfigError            bad flags, environment or provider tables
├── OperationError         a tool call that cannot be carried out as asked
│   ├── OperationNotFound
│   ├── OperationConflict  same operation_id, different request
│   └── InvalidRequest     an argument that is wrong, with the fix
├── StoreError             the database cannot be used (locked, read-only, missing)
└── TransportFailure       no usable answer from the provider (counts against its budget)
    ├── ProviderTimeout
    ├── ProviderConnectError
    └── ResponseTooSlow
"""

from __future__ import annotations


class PollwardenError(Exception):
    """Base of every error pollwarden raises on purpose."""


class ConfigError(PollwardenError):
    """Flags, environment or provider tables are wrong; the message names the fix."""


class OperationError(PollwardenError):
    """A tool call that cannot be carried out as asked."""


class OperationNotFound(OperationError):
    """No operation has this id."""


class OperationConflict(OperationError):
    """The operation id exists with a different provider, job or payload."""


class InvalidRequest(OperationError):
    """An argument is wrong; the message says which and how to fix it."""


class StoreError(PollwardenError):
    """The database cannot be used right now; nothing recorded was lost."""


class TransportFailure(PollwardenError):
    """No usable answer from the provider: we cannot know what it saw."""

    kind = "transport_error"


class ProviderTimeout(TransportFailure):
    """The provider did not answer in time."""

    kind = "timeout"


class ProviderConnectError(TransportFailure):
    """The connection failed or was lost."""

    kind = "connection_error"


class ResponseTooSlow(TransportFailure):
    """The body arrived too slowly to finish within the total time per request."""

    kind = "response_too_slow"
