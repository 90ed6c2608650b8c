"""The database's approval policy in a server: checked at start and whenever a decision is applied.

`serving_config` is what a server applies (refusing a weaker policy than the
database's, raising the database's to a stronger one); `stored_policy` what it
checks again when it applies a decision, so a policy raised while it runs binds
it at once. The rules are `pollwarden.access.approval_policy`'s.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from pollwarden.access.approval_policy import (
    ALL_CHANNELS,
    CHANNEL_APP,
    ApprovalPolicy,
    effective,
    raised,
    refusal,
    weaker_than,
)
from pollwarden.access.principals import Principal
from pollwarden.config import ServerConfig

if TYPE_CHECKING:
    from pollwarden.store import Store

__all__ = ["in_chat_refusal", "in_chat_refusal_now", "serving_config", "stored_policy"]


async def serving_config(store: Store, config: ServerConfig, *, at: float) -> ServerConfig:
    """A server's configuration under the database's policy: refused when weaker, raising it when stronger."""
    stored = await store.approval_policy()
    if (stronger := raised(stored, config.operator, config.approval_mode)) is not None:
        by = f"pollwarden serve (pid {os.getpid()}, {config.approval_mode})"
        await store.write_approval_policy(stronger, at=at, by=by, only_raising_to_a_key=True)
        stored = await store.approval_policy()  # this server's, or another's that raised it first
    if reasons := weaker_than(stored, config.operator, config.approval_mode):
        raise refusal(stored, reasons)
    return replace(config, operator=effective(stored, config.operator))


async def stored_policy(store: Store, config: ServerConfig) -> tuple[ServerConfig, ApprovalPolicy]:
    """The configuration under the policy stored now (a policy raised while a server runs binds it)."""
    stored = await store.approval_policy()
    return replace(config, operator=effective(stored, config.operator)), stored


def in_chat_refusal(
    config: ServerConfig, principal: Principal, channels: frozenset[str] = ALL_CHANNELS, *, channel: str
) -> str | None:
    """Why a person answering in the agent's own chat may not decide here, or None when they may.

    The one rule for both in-chat channels: the MCP App card (`CHANNEL_APP`, also opt-in with
    ``--approval app``) and a task's input request, which is an elicitation. Such a channel trusts
    the host, so it is refused wherever that trust is not enough: the operator requires a key for
    every decision, the database's policy (`channels`) does not count the channel, or the caller is
    an agent principal on an authenticated HTTP server (operators decide there). A refusal names
    where a person decides, never a command.
    """
    on_card = channel == CHANNEL_APP
    if on_card and not config.app_channel:
        return (
            "this server does not take decisions from the MCP App card (the operator did not start it with "
            "--approval app); an operator decides at the operator's own terminal or console"
        )
    if config.operator.require_key:
        what = "the card" if on_card else "a chat"
        return (
            f"the operator requires an operator key for every decision, which {what} cannot give; an operator "
            "decides with their key at the operator's own terminal"
        )
    if channel not in channels:
        what = "decisions made on the card" if on_card else "answers given in the chat"
        return (
            f"the database's approval policy does not count {what}; an operator decides at the operator's "
            "own terminal or console"
        )
    if principal.authenticated:
        return (
            "on an authenticated HTTP server operators decide approvals: an operator decides (with operator tools "
            "or the console), never the agent's own chat"
        )
    return None


async def in_chat_refusal_now(
    store: Store, config: ServerConfig, principal: Principal, *, channel: str
) -> str | None:
    """`in_chat_refusal` under the database's approval policy as stored now (raised while serving binds at once)."""
    current, stored = await stored_policy(store, config)
    return in_chat_refusal(current, principal, stored.channels, channel=channel)
