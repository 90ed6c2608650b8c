"""Operations belong to a principal; another principal's operation does not exist for an agent.

The id an agent chooses is its own: two principals may both use ``report-1``.
The stored id keeps them apart without a second key: the local user's ids are
stored as given (as before issue 19), an authenticated principal's as
``@NAME/ID``. No chosen id may start with ``@`` and no principal name holds a
``/``, so the two forms never collide, and the stored id is one primary-key
look-up away from the name an agent uses.

An agent's look-up of an id it does not own is the same single primary-key
read as an id nobody has: a miss, answered with the same message. Operators
(and the local user) may also name any operation by its stored id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel

from pollwarden.access.principals import LOCAL_NAME, Principal
from pollwarden.surface.watch import AUDIT_SUFFIX, URI_PREFIX, parse_uri

if TYPE_CHECKING:
    from pollwarden.flows.controller import Controller

__all__ = ["RESERVED_PREFIX", "owner_of", "renamed", "resolve", "shown_id", "stored_id", "watched_uri"]

RESERVED_PREFIX = "@"

M = TypeVar("M", bound=BaseModel)


def stored_id(principal: Principal, name: str) -> str:
    """How `principal`'s operation `name` is stored."""
    if not principal.authenticated or name.startswith(own_prefix(principal)):
        return name
    return f"{own_prefix(principal)}{name}"


def own_prefix(principal: Principal) -> str:
    """The start of every stored id of an authenticated principal."""
    return f"{RESERVED_PREFIX}{principal.name}/"


def owner_of(stored: str) -> str:
    """The principal whose operation the stored id `stored` is (`stored_id`'s form: ``@NAME/ID``, else local)."""
    if stored.startswith(RESERVED_PREFIX) and "/" in stored:
        return stored[len(RESERVED_PREFIX) : stored.index("/")]
    return LOCAL_NAME


def shown_id(principal: Principal, stored: str) -> str:
    """The id `principal` uses for a stored id: its own name for its own operations."""
    prefix = own_prefix(principal)
    if principal.authenticated and stored.startswith(prefix):
        return stored[len(prefix) :]
    return stored


async def resolve(controller: Controller, principal: Principal, name: str) -> str:
    """The stored id of the operation `principal` names `name`, or OperationNotFound exactly as for any unknown id."""
    if not principal.authenticated:
        return name
    own = stored_id(principal, name)
    record = await controller.store.get(own)
    if record is not None and record.owner == principal.name:
        return own
    if principal.operator and await controller.store.get(name) is not None:
        return name
    raise controller.not_found(name)


def watched_uri(principal: Principal, uri: str) -> str:
    """The resource URI the watcher follows for `principal`'s `uri`: its own operation, never another's.

    A subscription names an id as the caller uses it; the watcher reads stored
    ids, so an agent's ``pollwarden://operations/x`` follows its own ``x`` (and
    the update names the stored form), never another principal's.
    """
    watched = parse_uri(uri)
    if watched is None or not principal.authenticated:
        return uri
    name = watched.operation_id
    if principal.operator and name.startswith(RESERVED_PREFIX):
        return uri
    return URI_PREFIX + quote(stored_id(principal, name), safe="") + (AUDIT_SUFFIX if watched.audit else "")


_ID_KEYS = frozenset({"operation_id", "requested_operation_id", "duplicate_of"})


def _rename(value: Any, principal: Principal) -> Any:
    if isinstance(value, dict):
        return {
            k: (shown_id(principal, v) if k in _ID_KEYS and isinstance(v, str) else _rename(v, principal))
            for k, v in value.items()  # pyright: ignore[reportUnknownVariableType]
        }
    if isinstance(value, list):
        return [_rename(v, principal) for v in value]  # pyright: ignore[reportUnknownVariableType]
    return value


def renamed(model: M, principal: Principal) -> M:
    """`model` with every operation id the principal owns shown as the name it chose."""
    if not principal.authenticated:
        return model
    return type(model).model_validate(_rename(model.model_dump(mode="python"), principal))
