"""The exceptions pollwarden raises on purpose, in one tree.

PollwardenError                    the root (defined in pollwarden_providers.errors, re-exported here)
├── ConfigError                    bad flags, environment or operator keys
│   └── SampleError                a sample response file `providers check` cannot read
├── OperationError                 a tool call that cannot be carried out as asked
│   ├── OperationNotFound
│   ├── OperationConflict          same operation_id, different request
│   └── InvalidRequest             an argument that is wrong, with the fix
├── StoreError                     the database cannot be used (locked, read-only, missing)
│   ├── GuardFailed                a guarded write found its row changed; rolled back (store/postgres)
│   ├── PaceTurnBusy               turns at a pace row went by, not this check's: told to come back (store/postgres)
│   └── PaceTurnStuck              no turn at a pace row went by: the row, or the turn, is held (store/postgres)
├── AuditError                     the audit chain cannot be read (missing file, no audit table, bad anchor)
│   └── AuditKeyError              the chain and the HMAC key disagree
├── WebhookRefused                 a webhook request refused before it changed anything (webhooks.py; an HTTP status)
└── raised by the provider tables (pollwarden_providers, which never imports pollwarden):
    ├── TableError                 a provider table that cannot be used (also a ValueError)
    ├── EgressError                a URL would leave the provider's origin (also a ValueError)
    ├── BodyError                  a provider's body is not a JSON object we can read (also a ValueError)
    └── MissingCredentialError     the table's credential variable is unset or unusable (also a LookupError)

A tool call turns any of them into a tool error with the message; the
``pollwarden`` command prints it and exits 2. A provider that does not answer
is no exception: it is a recorded `NoAnswer` (see rules/status_answer.py). Anything else
that escapes is a bug.
"""

from __future__ import annotations

from pollwarden_providers.errors import PollwardenError

__all__ = [
    "AuditError",
    "AuditKeyError",
    "ConfigError",
    "InvalidRequest",
    "OperationConflict",
    "OperationError",
    "OperationNotFound",
    "PollwardenError",
    "SampleError",
    "StoreError",
    "WebhookRefused",
]


class ConfigError(PollwardenError):
    """Flags, environment or operator keys are wrong; the message names the fix."""


class SampleError(ConfigError):
    """A sample response file that cannot be read, naming the file and the fix."""


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


class AuditError(PollwardenError):
    """The audit database cannot be read (missing file, no audit table, bad anchor file)."""


class AuditKeyError(AuditError):
    """The chain and the key disagree: a keyed chain continued without the key, or an unkeyed one with it."""


class WebhookRefused(PollwardenError):
    """A webhook request refused before it changed anything: the HTTP status to answer and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
