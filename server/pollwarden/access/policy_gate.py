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

from pollwarden.access.approval_policy import ApprovalPolicy, effective, raised, refusal, weaker_than
from pollwarden.config import ServerConfig

if TYPE_CHECKING:
    from pollwarden.store import Store

__all__ = ["serving_config", "stored_policy"]


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
