"""Who is calling: the principal a request acts for, and what its scopes allow.

stdio (and loopback HTTP without a verifier) is the local user, principal
``local``, who may do everything. Over authenticated streamable HTTP the SDK's
bearer middleware verifies the token and puts an `AccessToken` in a context
variable; its ``client_id`` is the principal's name (the verifiers in
`pollwarden.access.auth` set it) and its scopes say what the principal may do.
"""

from __future__ import annotations

import logging
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcp.server.auth.provider import AccessToken

__all__ = [
    "LOCAL",
    "SCOPE_AGENT",
    "SCOPE_OPERATOR",
    "Principal",
    "PrincipalLimits",
    "PrincipalLogFilter",
    "current_principal",
    "jwt_principal",
    "principal_name_problem",
]

SCOPE_AGENT = "pollwarden:agent"
SCOPE_OPERATOR = "pollwarden:operator"
KNOWN_SCOPES = (SCOPE_AGENT, SCOPE_OPERATOR)
MAX_PRINCIPAL_LENGTH = 128
LOCAL_NAME = "local"
# Principals are namespaced by their verifier (issue 31): a JWT's principal is "jwt:" and its claim, so a
# JWT with sub=alice is never the token file's alice. Token-file names keep their names (existing
# databases keep working) and may not start with it.
JWT_NAMESPACE = "jwt:"


@dataclass(frozen=True)
class Principal:
    """The caller: a name operations are recorded under, and what it may do."""

    name: str
    operator: bool = False
    authenticated: bool = False  # False: stdio or unauthenticated loopback HTTP (the local user)

    @property
    def sees_everything(self) -> bool:
        """Whether this caller reads every principal's operations (the local user and operators)."""
        return self.operator or not self.authenticated


LOCAL = Principal(LOCAL_NAME, operator=True, authenticated=False)


@dataclass(frozen=True)
class PrincipalLimits:
    """Fair shares an operator sets; each applies to every principal alike (None: no limit).

    `max_active` and `max_starts_per_minute` bound authenticated principals (the
    local user of stdio is the operator); `fleet_slots` bounds every principal,
    the local user included: while a provider's shared `[fleet]` pace is used up,
    one principal holds at most this many booked slots of it.
    """

    max_active: int | None = None
    max_starts_per_minute: int | None = None
    fleet_slots: int | None = None


def principal_name_problem(name: str) -> str | None:
    """Why `name` cannot name a principal, or None (it is stored, logged and shown to people)."""
    if not name or len(name) > MAX_PRINCIPAL_LENGTH or name != name.strip():
        return f"must be 1 to {MAX_PRINCIPAL_LENGTH} characters without leading or trailing spaces"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Zs") for c in name) or "/" in name:
        return "must not contain '/', spaces, control or invisible format characters"
    if name == LOCAL_NAME:
        return f"{LOCAL_NAME!r} is the local user of stdio; choose another name"
    if name.startswith(JWT_NAMESPACE):
        return f"names starting with {JWT_NAMESPACE!r} are the JWT issuer's principals; choose another name"
    return None


def jwt_principal(claim: str) -> str | None:
    """The principal a JWT's principal claim names (`JWT_NAMESPACE` and the claim), or None if unusable."""
    if principal_name_problem(claim) is not None or len(JWT_NAMESPACE + claim) > MAX_PRINCIPAL_LENGTH:
        return None
    return JWT_NAMESPACE + claim


class PrincipalLogFilter(logging.Filter):
    """Adds ``principal`` (the caller of the request being served, ``local`` otherwise) to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Tag the record; never drops one."""
        record.principal = current_principal().name
        return True


# The SDK's context variable for the verified token. Read only once the SDK has loaded it: a process
# that never loaded it (the CLI) serves no request, and need not pay the SDK's import (0.6 s).
_AUTH_CONTEXT = "mcp.server.auth.middleware.auth_context"


def current_principal() -> Principal:
    """The principal of the request being served: the verified token's, else the local user."""
    context = sys.modules.get(_AUTH_CONTEXT)
    if context is None:
        return LOCAL
    get_access_token: Callable[[], AccessToken | None] = context.get_access_token
    token = get_access_token()
    if token is None:
        return LOCAL
    return Principal(token.client_id, operator=SCOPE_OPERATOR in token.scopes, authenticated=True)
