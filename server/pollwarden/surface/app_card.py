"""The wait and the approval inside the chat: pollwarden's MCP App (`io.modelcontextprotocol/ui`, issue 32).

`start_operation`, `check_status`, `get_operation`, `request_extension` and
`cancel_operation` carry `_meta.ui.resourceUri` = `CARD_URI`: a host that
speaks MCP Apps renders one page (`app_card.html`, plain JS, no external
anything) inline with their result. The page reads the result it is given and
refreshes through two tools only the page may call (`_meta.ui.visibility`
``["app"]``; a host keeps them from the model):

- `app_card_state`: what the card draws — the operation, the console's
  timeline chart as data, and the approvals waiting for a person. A read of the
  record: no provider request, so the card never makes a status request nor
  causes one sooner than the agent could.
- `app_decide_approval`: Approve or Deny from the card. It records the
  decision on the pending approval through the one path every person outside
  the client takes (`operator_decision.decide`), authenticated as ``app``;
  the agent's next call applies it exactly as it applies an operator's
  (`approvals.apply_decided_approvals`, which checks it again).

The channel trusts the host as elicitation does, so it is opt-in
(``--approval app``) and `app_channel_refusal` refuses it where the approval
policy asks for more. Clients that did not negotiate the extension see today's
tool list and results (`apps_middleware`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from importlib import resources
from typing import Annotated, Any, Literal, cast

import anyio
from mcp.server.apps import Apps, ResourceCsp, client_supports_apps
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from pollwarden.access import ownership
from pollwarden.access.approval_policy import ALL_CHANNELS, CHANNEL_APP
from pollwarden.access.operator_keys import METHOD_APP
from pollwarden.access.policy_gate import in_chat_refusal, in_chat_refusal_now
from pollwarden.access.principals import Principal, current_principal
from pollwarden.audit.chain import read_rows
from pollwarden.config import ServerConfig
from pollwarden.console.charts import timeline
from pollwarden.core.errors import InvalidRequest
from pollwarden.core.records import ApprovalRecord
from pollwarden.core.timefmt import iso
from pollwarden.core.untrusted import shown
from pollwarden.core.vocabulary import ApprovalKind, ApprovalStatus
from pollwarden.flows.approvals import describe_request, what_happens_next
from pollwarden.flows.controller import Controller
from pollwarden.flows.operator_decision import decide
from pollwarden.flows.starting import MAX_OPERATION_ID_LENGTH
from pollwarden.surface.asking import Ctx, controller_of, run_tool
from pollwarden.surface.views import OperationView

__all__ = [
    "APP_ONLY_TOOLS",
    "CARD_META",
    "CARD_URI",
    "CardDecision",
    "CardState",
    "app_channel_refusal",
    "apps_middleware",
    "card_extension",
]

CARD_URI = "ui://pollwarden/card.html"
# On the model-visible tools whose results the card draws.
CARD_META: dict[str, Any] = {"ui": {"resourceUri": CARD_URI}}
STATE_TOOL = "app_card_state"
DECIDE_TOOL = "app_decide_approval"
APP_ONLY_TOOLS = frozenset({STATE_TOOL, DECIDE_TOOL})
# Who the audit names for a decision taken on the card (the host's user; its identity is the host's).
DECIDED_BY = "person (MCP App card)"
# The approvals a person answers for the agent's own calls; a reopen is the operator's own request.
CARD_KINDS = frozenset(
    {ApprovalKind.EXTENSION, ApprovalKind.CANCEL, ApprovalKind.RESUBMISSION, ApprovalKind.STATUS_REQUEST}
)


def card_html() -> str:
    """The page (one file: markup, style and plain JS; nothing loaded from anywhere)."""
    return resources.files("pollwarden.surface").joinpath("app_card.html").read_text(encoding="utf-8")


# -- the approval policy for the app channel ------------------------------------------------------


def app_channel_refusal(
    config: ServerConfig, principal: Principal, channels: frozenset[str] = ALL_CHANNELS
) -> str | None:
    """Why Approve/Deny on the card may not decide here, or None (`policy_gate.in_chat_refusal`)."""
    return in_chat_refusal(config, principal, channels, channel=CHANNEL_APP)


async def channel_refusal(controller: Controller, principal: Principal) -> str | None:
    """`app_channel_refusal` under the database's approval policy as stored now."""
    return await in_chat_refusal_now(controller.store, controller.config, principal, channel=CHANNEL_APP)


# -- what the card draws --------------------------------------------------------------------------


class CardApproval(BaseModel):
    """One approval waiting for a person, as the card asks it."""

    approval_id: str
    kind: str
    asks: str = Field(description="What it asks for, in a few words.")
    question: str = Field(description="The question a person gets by elicitation (untrusted values quoted).")
    reason: str | None = Field(description="The agent's reason, untrusted text.")
    expires_at: str
    on_approve: str = Field(description="What happens once approved.")


class CardState(BaseModel):
    """Everything the card draws for one operation; read from the record, no provider call."""

    operation: OperationView
    approvals: list[CardApproval]
    app_channel: bool = Field(description="Whether Approve and Deny are offered on the card.")
    app_channel_note: str = Field(description="Why they are not offered, or what a decision does.")
    chart: dict[str, Any] | None = Field(description="The console's timeline chart, as data.")
    now: str = Field(description="The server's time when this was read (the countdown's reference).")


class CardDecision(BaseModel):
    """What Approve or Deny on the card did."""

    approval_id: str
    decided: bool
    status: str
    message: str
    card: CardState


def _approved_view(approval: ApprovalRecord) -> ApprovalRecord:
    return dataclasses.replace(approval, status=ApprovalStatus.APPROVED)


def card_approval(approval: ApprovalRecord) -> CardApproval:
    """A pending approval as the card shows it: the recorded question, the agent's reason apart."""
    request = approval.request
    reason = request.get("reason")
    return CardApproval(
        approval_id=approval.approval_id,
        kind=approval.kind,
        asks=describe_request(approval),
        question=str(request.get("question") or describe_request(approval)),
        reason=reason if isinstance(reason, str) and reason else None,
        expires_at=iso(approval.expires_at) or "",
        on_approve=what_happens_next(_approved_view(approval)),
    )


async def card_state(controller: Controller, principal: Principal, stored: str) -> CardState:
    """The card for the caller's operation `stored` (a stored id), as of now."""
    record = await controller.load(stored)
    now = controller.clock.now()
    pending = [
        a
        for a in await controller.store.list_approvals(operation_id=stored, status=ApprovalStatus.PENDING)
        if a.kind in CARD_KINDS and a.expires_at > now
    ]
    where = controller.store.location
    rows = await anyio.to_thread.run_sync(lambda: read_rows(where, stored))
    chart = dataclasses.asdict(timeline(record, rows, now=now))
    refusal = await channel_refusal(controller, principal)
    note = refusal or (
        "Approve or Deny here decides as you, recorded and audited as 'app'; the agent's next call applies it."
    )
    state = CardState(
        operation=await controller.view(record),
        approvals=[card_approval(a) for a in pending],
        app_channel=refusal is None,
        app_channel_note=note,
        chart=chart,
        now=iso(now) or "",
    )
    return ownership.renamed(state, principal)


async def decide_on_card(
    controller: Controller, principal: Principal, approval_id: str, decision: Literal["approve", "deny"]
) -> CardDecision:
    """Record the person's Approve or Deny from the card, once, authenticated as ``app``."""
    if (refusal := await channel_refusal(controller, principal)) is not None:
        raise InvalidRequest(f"{refusal}. Nothing was decided")
    approval = await controller.store.get_approval(approval_id)
    if approval is None or approval.kind not in CARD_KINDS:
        raise InvalidRequest(f"no approval {shown(approval_id)} the card can decide; nothing was decided")
    decided = await decide(
        controller.store,
        approval_id,
        approve=decision == "approve",
        by=DECIDED_BY,
        at=controller.clock.now(),
        method=METHOD_APP,
    )
    after = decided.approval or approval
    return CardDecision(
        approval_id=approval_id,
        decided=decided.ok,
        status=after.status,
        message=decided.message,
        card=await card_state(controller, principal, approval.operation_id),
    )


# -- the extension ------------------------------------------------------------------------------


def card_extension() -> Apps:
    """The MCP Apps extension: the card's `ui://` page and its two app-only tools."""
    apps = Apps()
    apps.add_html_resource(
        CARD_URI,
        card_html(),
        name="pollwarden-card",
        title="pollwarden wait and approval card",
        description="The operation's wait (budget, countdown, timeline) and any approval waiting for a person.",
        csp=ResourceCsp(connect_domains=[], resource_domains=[], frame_domains=[], base_uri_domains=[]),
        prefers_border=True,
    )

    @apps.tool(
        resource_uri=CARD_URI,
        visibility=["app"],
        name=STATE_TOOL,
        description="For the pollwarden card only: the operation's recorded state, timeline and pending "
        "approvals. No provider call.",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )
    async def app_card_state(
        operation_id: Annotated[str, Field(min_length=1, max_length=MAX_OPERATION_ID_LENGTH)], ctx: Ctx
    ) -> CardState:
        controller = controller_of(ctx)
        principal = current_principal()
        stored = await run_tool(ownership.resolve(controller, principal, operation_id))
        return await run_tool(card_state(controller, principal, stored))

    @apps.tool(
        resource_uri=CARD_URI,
        visibility=["app"],
        name=DECIDE_TOOL,
        description="For the pollwarden card only: the person's Approve or Deny on a pending approval.",
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
        ),
    )
    async def app_decide_approval(
        approval_id: Annotated[str, Field(min_length=1, max_length=100)],
        decision: Literal["approve", "deny"],
        ctx: Ctx,
    ) -> CardDecision:
        return await run_tool(decide_on_card(controller_of(ctx), current_principal(), approval_id, decision))

    return apps


# -- graceful without Apps ----------------------------------------------------------------------


def _without_ui(tool: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(tool)
    meta = out.get("_meta")
    if isinstance(meta, Mapping):
        rest = {k: v for k, v in cast(Mapping[str, Any], meta).items() if k != "ui"}
        if rest:
            out["_meta"] = rest
        else:
            out.pop("_meta")
    return out


def plain_tool_list(result: Mapping[str, Any]) -> dict[str, Any]:
    """A tools/list result as a client without Apps sees it: no app-only tools, no `_meta.ui`."""
    tools = cast(list[Mapping[str, Any]], result.get("tools") or [])
    return {**result, "tools": [_without_ui(t) for t in tools if t.get("name") not in APP_ONLY_TOOLS]}


async def apps_middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Clients that did not negotiate MCP Apps see today's tool list, and cannot call the card's tools."""
    if ctx.method not in ("tools/list", "tools/call") or client_supports_apps(ctx):
        return await call_next(ctx)
    if ctx.method == "tools/call":
        name = (ctx.params or {}).get("name")
        if name in APP_ONLY_TOOLS:
            # Answered as a tool error, as an unknown tool is: this client has no card to call it from.
            return CallToolResult(
                content=[
                    TextContent(type="text", text=f"{name} is for the pollwarden card in an MCP Apps host")
                ],
                is_error=True,
            )
        return await call_next(ctx)
    result = await call_next(ctx)
    if isinstance(result, Mapping):
        return plain_tool_list(cast(Mapping[str, Any], result))
    return result
