"""A person must decide: the one check every deciding command makes (approve/deny, reopen, console).

An agent with a shell can run any command its user can, so a decision needs
proof that a person made it: an operator key the agent cannot read (whose
public key the operator configured), or else a person at an interactive
terminal (stdin and stdout are terminals) — unless the operator requires a key
for every decision. The server checks a key-signed decision again against its
own keys before it applies it (`operator_keys`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from pollwarden.access.operator_keys import (
    PUBKEYS_ENV,
    REQUIRE_ENV,
    OperatorKey,
    describe_keys,
    load_operator_key,
)
from pollwarden.config import ServerConfig
from pollwarden.core.errors import ConfigError

__all__ = ["SERVER_VERIFIES", "Deciding", "operator_key_for", "require_person"]

SERVER_VERIFIES = (
    "note: the server applies a key-signed decision only if the key is among the operator public keys the "
    f"server itself was started with ({PUBKEYS_ENV} in its own environment); a file named here proves nothing "
    "to it"
)


@dataclass(frozen=True)
class Deciding:
    """Which command decides, in the words its refusals use."""

    command: str  # "pollwarden approve"
    at_terminal: str  # what a person at the terminal sees and does
    nothing: str  # "Nothing was decided": what a refusal left undone
    run: str = "run"  # "run it" / "start it" at an interactive terminal
    with_key: str = ""  # what the key then does, said after "the agent cannot read"
    pass_key: str = "pass --operator-key FILE"


def interactive() -> bool:
    """Whether a person could be at this process's terminal (stdin and stdout both terminals)."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def not_a_person(deciding: Deciding) -> str:
    """The refusal of a decision made without a terminal and without a key."""
    return (
        f"{deciding.command} needs a person: {deciding.run} it at an interactive terminal (stdin and stdout must "
        f"be a terminal; {deciding.at_terminal}), or pass --operator-key FILE with an operator key the agent "
        f"cannot read{deciding.with_key}. {deciding.nothing}"
    )


def operator_key_for(config: ServerConfig, path: str, deciding: Deciding) -> OperatorKey:
    """The operator key in `path`, refused unless its public key is among the configured ones."""
    key = load_operator_key(Path(path).expanduser())
    if config.operator.find(key.public.key_id) is None:
        raise ConfigError(
            f"the operator key {path} (id {key.public.key_id}) is not among the operator public keys "
            f"({PUBKEYS_ENV}: {describe_keys(config.operator.keys)}); add its public line "
            "(`pollwarden operator-key show FILE`) to that file, where the agent cannot change it. "
            f"{deciding.nothing}"
        )
    return key


def require_person(config: ServerConfig, deciding: Deciding) -> None:
    """Without an operator key: a person at an interactive terminal, unless the operator requires a key."""
    if not interactive():
        raise ConfigError(not_a_person(deciding))
    if config.operator.require_key:
        raise ConfigError(
            f"the operator requires an operator key for every decision ({REQUIRE_ENV}): {deciding.pass_key}. "
            f"{deciding.nothing}"
        )
