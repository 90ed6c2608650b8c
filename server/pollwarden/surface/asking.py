"""The MCP side of the one approval flow, and the typed context every tool and resolver receives.

`Ctx` is the SDK's `Context` whose lifespan context is the `Controller` (or
`DatabaseUnavailable`, saying why there is none). `ask` puts a flow's
question to a person by elicitation in either protocol era — as an `Elicit`
the SDK carries through tools/call rounds (2026-07-28), or on the 2025-11-25
back channel, where an answer that comes after the client stopped waiting is
handed to the flow to be recorded. `settle_tool` is a tool's whole body:
the person's answer (or none) through `approval_flow.settle`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
from mcp.server.mcpserver import AcceptedElicitation, Context, DeclinedElicitation, Elicit, ElicitationResult
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types.version import is_version_at_least
from pydantic import BaseModel

from pollwarden.access.approval_policy import CHANNEL_ELICITATION
from pollwarden.access.principals import current_principal
from pollwarden.core.errors import PollwardenError
from pollwarden.flows.approval_flow import DISMISSED, NOT_ASKED, OPERATOR_DECIDES, Answer, Flow, settle
from pollwarden.flows.controller import Controller

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")


@dataclass(frozen=True)
class DatabaseUnavailable:
    """The lifespan context when the database could not be opened at start-up (missing, read-only, locked)."""

    reason: str

    @property
    def message(self) -> str:
        """What every tool call answers: the problem and its fix, then the restart it needs."""
        return (
            f"{self.reason}. pollwarden could not open its database when it started, so no tool works; "
            "fix this, then restart the pollwarden server (reconnect it in the MCP client)"
        )


ServerContext = Controller | DatabaseUnavailable
# What every tool and resolver receives: its lifespan context is the controller, or why there is none.
Ctx = Context[ServerContext, Any]


def controller_of(ctx: Ctx) -> Controller:
    """The controller, or a ToolError saying why the database is unusable (every tool answers it)."""
    controller = ctx.request_context.lifespan_context
    if isinstance(controller, DatabaseUnavailable):
        raise ToolError(controller.message)
    return controller


async def run_tool(work: Awaitable[T]) -> T:
    """Turn expected errors into a ToolError the agent can read (the only text that reaches it)."""
    try:
        return await work
    except PollwardenError as exc:
        raise ToolError(str(exc)) from exc


def client_can_elicit(ctx: Ctx) -> bool:
    """Whether the client can show a form question (a URL-only client cannot)."""
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


# The first protocol revision without a back channel: a question travels inside tools/call rounds.
INPUT_REQUIRED_VERSION = "2026-07-28"
MISMATCHED_ANSWER = (
    "the answer to the question did not match the choices offered, so it was not taken as a decision "
    "and nothing changed; call {tool} again to ask again"
)
Schema = TypeVar("Schema", bound=BaseModel)


@dataclass(frozen=True)
class Answered:
    """A person's answer, asked here on the 2025-11-25 back channel (the SDK hands it on as accepted data)."""

    outcome: ElicitationResult[Any]


def outcome_of(decision: ElicitationResult[Any]) -> ElicitationResult[Any] | None:
    """What the person answered, or None when nobody was asked (the client cannot show a prompt)."""
    if isinstance(decision, AcceptedElicitation):
        data: object = decision.data
        if isinstance(data, Answered):
            return data.outcome
        if data is None:
            return None
    return decision


def yes_of(outcome: ElicitationResult[Any] | None, yes: str) -> bool | None:
    """True for the approving choice, False for the other one or a decline, None for no answer."""
    if isinstance(outcome, AcceptedElicitation):
        return getattr(outcome.data, "decision", None) == yes
    if isinstance(outcome, DeclinedElicitation):
        return False
    return None


async def ask_on_back_channel(
    ctx: Ctx,
    question: str,
    schema: type[Schema],
    *,
    tool: str,
    late: Callable[[ElicitationResult[Schema] | None, str], Awaitable[None]],
) -> Answered:
    """Ask on the 2025-11-25 back channel, and keep listening if the client gives up meanwhile.

    The wait is shielded from the call's cancellation (and bounded by the
    approval TTL), so an answer that arrives after the client timed out or
    cancelled is still received and handed to `late` to be recorded, instead of
    being lost with the call.
    """
    outcome: ElicitationResult[Schema] | None = None
    missing = "no answer came in time"
    failure: Exception | None = None
    with anyio.CancelScope(shield=True), anyio.move_on_after(controller_of(ctx).config.approval_ttl_seconds):
        try:
            outcome = await ctx.elicit(question, schema)
        except ValueError:
            missing = "the answer did not match the choices offered"
        except (MCPError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            missing, failure = "the client went away before an answer came", exc
    try:
        await anyio.lowlevel.checkpoint()
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await late(outcome, missing)
        raise
    if failure is not None:
        raise failure
    if outcome is None:
        raise ToolError(MISMATCHED_ANSWER.format(tool=tool))
    return Answered(outcome)


def has_back_channel(ctx: Ctx) -> bool:
    """Whether the session's protocol has the 2025-11-25 back channel (server requests to the client)."""
    version = ctx.protocol_version
    return version is None or not is_version_at_least(version, INPUT_REQUIRED_VERSION)


async def ask(ctx: Ctx, flow: Flow[P, Any, Any], plan: P) -> Elicit[Any] | Answered | None:
    """Ask a person where the flow needs an answer, the operator wants a prompt and the client can show one.

    On the 2025-11-25 back channel an answer that comes after the client stopped
    waiting is handed to the flow (`Flow.late`) to be recorded.
    """
    controller = controller_of(ctx)
    if not flow.asks(plan) or controller.config.approval_mode == "tool-confirmation":
        return None
    if current_principal().authenticated:
        return None  # over authenticated HTTP the agent's own client never answers: an operator decides
    if not client_can_elicit(ctx):
        return None
    if CHANNEL_ELICITATION not in (await controller.store.approval_policy()).channels:
        return None  # the database's policy does not count the client's prompt: an operator decides
    question = flow.question(plan)
    if not has_back_channel(ctx):
        return Elicit(question, flow.schema)

    async def late(outcome: ElicitationResult[Any] | None, missing: str) -> None:
        await flow.late(
            controller, plan, yes_of(outcome, flow.yes), missing if outcome is None else DISMISSED
        )

    return await ask_on_back_channel(ctx, question, flow.schema, tool=flow.tool, late=late)


def answer_of(flow: Flow[Any, Any, Any], decision: ElicitationResult[Any]) -> Answer:
    """What the person said in this call, as the one approval flow takes it.

    Over authenticated HTTP nobody was asked and only an operator decides (`OPERATOR_DECIDES`).
    """
    if current_principal().authenticated:
        return OPERATOR_DECIDES
    outcome = outcome_of(decision)
    return NOT_ASKED if outcome is None else Answer(asked=True, approve=yes_of(outcome, flow.yes))


async def settle_tool(ctx: Ctx, flow: Flow[P, P, R], plan: P, decision: ElicitationResult[Any]) -> R:
    """The tool's whole body where the flow settles the plan it asked about."""
    return await run_tool(settle(flow, controller_of(ctx), plan, answer_of(flow, decision)))
