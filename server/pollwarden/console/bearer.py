"""An operator's bearer token in place of the console's cookie (`pollwarden console --auth-tokens FILE`).

A request carrying ``Authorization: Bearer <token>`` is judged by the token
alone, never by a cookie: a token the console's verifier does not accept is
refused with 401, one without ``pollwarden:operator`` (an agent's token) with
403, and otherwise the request acts for the principal the token names. Another
site's form cannot send a header, so a bearer request needs no CSRF token.
"""

from __future__ import annotations

import logging

from mcp.server.auth.provider import TokenVerifier
from starlette.responses import PlainTextResponse, Response

from pollwarden.access.principals import SCOPE_OPERATOR

__all__ = ["judge"]

log = logging.getLogger("pollwarden.console")

_REALM = 'Bearer realm="pollwarden console"'


def _refused(status: int, message: str, challenge: str) -> Response:
    return PlainTextResponse(
        f"refused: {message}; nothing was shown or decided",
        status_code=status,
        headers={"www-authenticate": challenge},
    )


async def judge(verifier: TokenVerifier | None, header: str | None) -> str | Response | None:
    """None: no bearer token (the cookie decides); the operator's name; or the refusal to send."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return _refused(401, "the Authorization header must be 'Bearer <token>'", _REALM)
    if verifier is None:
        return _refused(
            401,
            "this console takes no bearer tokens (start it with --auth-tokens FILE to accept operator tokens)",
            _REALM,
        )
    access = await verifier.verify_token(token)
    if access is None:
        log.warning("console: a bearer token that is not in the token file was refused")
        return _refused(401, "the bearer token is not valid", f'{_REALM}, error="invalid_token"')
    if SCOPE_OPERATOR not in access.scopes:
        log.warning("console: %r has no %s scope; refused", access.client_id, SCOPE_OPERATOR)
        return _refused(
            403,
            f"the console needs a token with the {SCOPE_OPERATOR} scope (an agent's token cannot use it)",
            f'{_REALM}, error="insufficient_scope", scope="{SCOPE_OPERATOR}"',
        )
    return access.client_id
