"""The approval policy of a database: one policy for every process that opens it (issue 31).

A policy set on one server's environment binds only that server: an agent
could start a second server on the same database with a weaker one and approve
its own extension. So the policy lives in the database (schema step 15): whether
a decision made outside the client must be signed with an operator key (and
then which public keys the database trusts), and which approval channels
count. Every process reads it:

* a server (`serve`, either transport) refuses to start with a weaker policy
  than the database's (`weaker_than`), and one started with a stronger one
  raises the database's (`raised`); the stored policy never weakens on its
  own: only `pollwarden policy set`, with the operator key when one is
  required, lowers it;
* a deciding command (`approve`, `deny`, `reopen`, the console, `policy set`)
  takes the stricter of its own and the database's (`effective`);
* a server checks the stored policy again whenever it applies a decision
  (`pollwarden.flows.approvals`, `pollwarden.flows.approval_flow`), so a policy raised while
  it runs binds it at once.

The functions here are pure; the store reads and writes the one row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from pollwarden.access.operator_keys import (
    METHOD_CONSOLE,
    METHOD_ELICITATION,
    METHOD_HTTP_OPERATOR,
    METHOD_TASK_INPUT,
    METHOD_TOOL_CONFIRMATION,
    METHOD_TTY,
    REQUIRE_ENV,
    OperatorPolicy,
    PublicKey,
    describe_keys,
    parse_public_keys,
)
from pollwarden.core.errors import ConfigError

__all__ = [
    "ALL_CHANNELS",
    "CHANNEL_APP",
    "CHANNEL_ELICITATION",
    "CHANNEL_OPERATOR",
    "CHANNEL_TOOL_CONFIRMATION",
    "HOW_TO_CHANGE",
    "ApprovalPolicy",
    "channel_of",
    "describe",
    "effective",
    "parse_channels",
    "raised",
    "weaker_than",
]

CHANNEL_ELICITATION = "elicitation"  # the person answered the MCP client's own prompt
CHANNEL_TOOL_CONFIRMATION = "tool-confirmation"  # the client's per-tool confirmation (--approval)
CHANNEL_APP = "app"  # the MCP App's approval view in the client
CHANNEL_OPERATOR = "operator"  # decided outside the client: CLI, console, operator key, operator token
ALL_CHANNELS: frozenset[str] = frozenset(
    {CHANNEL_ELICITATION, CHANNEL_TOOL_CONFIRMATION, CHANNEL_APP, CHANNEL_OPERATOR}
)
_CHANNEL_ORDER = (CHANNEL_ELICITATION, CHANNEL_TOOL_CONFIRMATION, CHANNEL_APP, CHANNEL_OPERATOR)

HOW_TO_CHANGE = (
    "an operator changes it with `pollwarden policy set … --db DB` (with --operator-key FILE while it requires "
    "one); `pollwarden policy show --db DB` shows it"
)


@dataclass(frozen=True)
class ApprovalPolicy:
    """What the database requires of every decision, in every process that opens it."""

    require_operator_key: bool = False
    channels: frozenset[str] = ALL_CHANNELS
    # The public keys whose signatures count while a key is required (lines as `operator-key init` prints).
    operator_keys: tuple[PublicKey, ...] = field(default=())

    def key_lines(self) -> str:
        """The trusted keys as stored: one public key line each."""
        return "\n".join(k.line() for k in self.operator_keys)

    def facts(self) -> dict[str, object]:
        """What the policy requires, as the audit tells it (key ids, never the keys)."""
        return {
            "require_operator_key": self.require_operator_key,
            "channels": sorted(self.channels),
            "operator_key_ids": sorted(k.key_id for k in self.operator_keys),
        }

    @classmethod
    def from_row(cls, row: Sequence[object] | None) -> ApprovalPolicy:
        """The policy from its row as read (`require_operator_key, channels, operator_keys`); none: the default."""
        return cls() if row is None else cls.stored(bool(row[0]), str(row[1]), str(row[2]))

    @classmethod
    def stored(cls, require: bool, channels: str, keys: str) -> ApprovalPolicy:
        """The policy from its row (a row edited into nonsense is refused with the fix)."""
        try:
            return cls(
                bool(require), parse_channels(channels, allow_empty=True), parse_public_keys(keys, "policy")
            )
        except ConfigError as exc:
            raise ConfigError(
                f"the database's approval policy cannot be read ({exc}); {HOW_TO_CHANGE}"
            ) from exc


def parse_channels(text: str, *, allow_empty: bool = False) -> frozenset[str]:
    """A comma-separated list of channels (`ALL_CHANNELS`); an unknown name is a ConfigError."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - ALL_CHANNELS)
    if unknown:
        raise ConfigError(
            f"unknown approval channel(s) {', '.join(unknown)}; use a comma-separated list of "
            f"{', '.join(_CHANNEL_ORDER)}"
        )
    if not names and not allow_empty:
        raise ConfigError(f"name at least one approval channel: {', '.join(_CHANNEL_ORDER)}")
    return names


def describe(policy: ApprovalPolicy) -> str:
    """The policy in one line, for messages and `policy show`."""
    channels = ", ".join(c for c in _CHANNEL_ORDER if c in policy.channels) or "none"
    key = (
        f"an operator key required (trusted: {describe_keys(policy.operator_keys)})"
        if policy.require_operator_key
        else "no operator key required"
    )
    return f"{key}; channels that count: {channels}"


def channel_of(method: str) -> str:
    """The channel a decision's `authenticated_by` belongs to (a task's input request is an elicitation)."""
    if method.startswith(METHOD_ELICITATION) or method == METHOD_TASK_INPUT:
        return CHANNEL_ELICITATION
    if method == METHOD_TOOL_CONFIRMATION:
        return CHANNEL_TOOL_CONFIRMATION
    if method.startswith(CHANNEL_APP):
        return CHANNEL_APP
    return CHANNEL_OPERATOR  # tty, console, operator-key:…, http-operator, or unrecorded


OPERATOR_METHODS = (METHOD_TTY, METHOD_CONSOLE, METHOD_HTTP_OPERATOR)


def _process_channel(approval_mode: str) -> str:
    return CHANNEL_TOOL_CONFIRMATION if approval_mode == CHANNEL_TOOL_CONFIRMATION else CHANNEL_ELICITATION


def weaker_than(stored: ApprovalPolicy, operator: OperatorPolicy, approval_mode: str) -> list[str]:
    """How a server's own policy is weaker than the database's (empty: it may serve)."""
    reasons: list[str] = []
    if stored.require_operator_key and not operator.require_key:
        reasons.append(
            f"the database requires an operator key for every decision and this process does not ({REQUIRE_ENV})"
        )
    if stored.require_operator_key:
        trusted = {k.key_id for k in stored.operator_keys}
        extra = [k for k in operator.keys if k.key_id not in trusted]
        if extra:
            reasons.append(
                f"this process trusts operator key(s) the database does not: {describe_keys(extra)}"
            )
    channel = _process_channel(approval_mode)
    if channel not in stored.channels:
        reasons.append(
            f"this process approves by {channel} (--approval), which the database's policy does not count"
        )
    return reasons


def refusal(stored: ApprovalPolicy, reasons: Iterable[str]) -> ConfigError:
    """The error a server with a weaker policy stops with: what differs, the policy, and how to change it."""
    return ConfigError(
        f"refusing to serve with a weaker approval policy than the database's: {'; '.join(reasons)}. The "
        f"database's policy: {describe(stored)}. Start it with that policy, or {HOW_TO_CHANGE}"
    )


def raised(stored: ApprovalPolicy, operator: OperatorPolicy, approval_mode: str) -> ApprovalPolicy | None:
    """The database's policy raised to a server's stronger one, or None when it is not stronger.

    A server that requires an operator key on a database that does not makes the
    database require it, trusting that server's keys, and counting the client's
    per-tool confirmation only if that server itself approves by it.
    """
    if not operator.require_key or stored.require_operator_key:
        return None
    channels = stored.channels
    if _process_channel(approval_mode) != CHANNEL_TOOL_CONFIRMATION:
        channels = channels - {CHANNEL_TOOL_CONFIRMATION}
    return ApprovalPolicy(True, channels, operator.keys)


def effective(stored: ApprovalPolicy, operator: OperatorPolicy) -> OperatorPolicy:
    """The operator policy a process applies: the stricter of its own and the database's.

    While the database requires a key, only the keys it trusts count (a keys
    file the caller names cannot add one).
    """
    if not stored.require_operator_key:
        return operator
    return replace(operator, keys=stored.operator_keys, require_key=True)
