"""What the MCP tools resolve before they run: the caller's stored operation id, the principal's
limits, and what a person is asked first (the SDK's `Resolve` dependencies, one plan and one
question per kind of approval).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import (
    Elicit,
    Resolve,
)
from mcp.server.mcpserver.exceptions import (
    ResourceError,
    ResourceNotFoundError,
)
from pydantic import BaseModel

from pollwarden.access import ownership
from pollwarden.access.principals import Principal, current_principal
from pollwarden.core.errors import (
    InvalidRequest,
    OperationNotFound,
    PollwardenError,
)
from pollwarden.flows import approvals, followups, resubmission, status_approval
from pollwarden.flows.controller import Controller
from pollwarden.rules.extensions import ExtensionDecision, ExtensionPlan
from pollwarden.rules.schedule import (
    wait_bound,
)
from pollwarden.surface.asking import (
    Answered,
    Ctx,
    ask,
    controller_of,
    run_tool,
)

log = logging.getLogger("pollwarden")

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


async def read_resource(work: Awaitable[T]) -> T:
    """For resources: an unknown operation is 'not found' with the message, not an internal error."""
    try:
        return await work
    except PollwardenError as exc:
        unreadable = ResourceNotFoundError if isinstance(exc, OperationNotFound) else ResourceError
        raise unreadable(str(exc)) from exc


async def stored_operation_id(ctx: Ctx, operation_id: str) -> str:
    """The stored id of the caller's operation (another principal's is answered as unknown)."""
    return await run_tool(ownership.resolve(controller_of(ctx), current_principal(), operation_id))


def as_chosen(model: M) -> M:
    """The result with the caller's own operation ids as it chose them."""
    return ownership.renamed(model, current_principal())


async def within_principal_limits(
    controller: Controller, principal: Principal, operation_id: str | None
) -> None:
    """Refuse a new operation beyond the principal's fair share (its existing ones are always answered)."""
    limits = controller.config.limits
    if not principal.authenticated or (limits.max_active is None and limits.max_starts_per_minute is None):
        return
    if operation_id is not None and await controller.store.get(ownership.stored_id(principal, operation_id)):
        return  # the same id again returns the same record: nothing new is started
    now = controller.clock.now()
    active, started = await controller.store.principal_usage(principal.name, since=now - 60.0)
    if limits.max_active is not None and active >= limits.max_active:
        raise InvalidRequest(
            f"{principal.name} already has {active} active operations, the most the operator allows per principal "
            f"({limits.max_active}); nothing was started. Finish, cancel or let one stop first"
        )
    if limits.max_starts_per_minute is not None and started >= limits.max_starts_per_minute:
        raise InvalidRequest(
            f"{principal.name} started {started} operations in the last minute, the most the operator allows "
            f"({limits.max_starts_per_minute} a minute); nothing was started. Start it again in a minute"
        )


async def plan_extension(
    operation_id: str,
    extra_seconds: float,
    extra_status_requests: int,
    reason: str,
    ctx: Ctx,
    new_business_deadline_at: str | None = None,
) -> ExtensionPlan:
    stored = await stored_operation_id(ctx, operation_id)
    return await run_tool(
        approvals.plan_extension(
            controller_of(ctx),
            stored,
            extra_seconds=extra_seconds,
            extra_status_requests=extra_status_requests,
            reason=reason,
            new_business_deadline_at=new_business_deadline_at,
        )
    )


async def ask_extension(
    plan: Annotated[ExtensionPlan, Resolve(plan_extension)], ctx: Ctx
) -> Elicit[ExtensionDecision] | Answered | None:
    return await ask(ctx, approvals.EXTENSION, plan)


async def plan_resubmission(
    provider: str, operation_id: str | None, submit: dict[str, Any] | None, ctx: Ctx
) -> resubmission.ResubmissionPlan:
    if current_principal().authenticated:
        return resubmission.ResubmissionPlan()  # an operator decides; the agent's client is never asked
    return await run_tool(
        resubmission.plan(controller_of(ctx), provider=provider, operation_id=operation_id, submit=submit)
    )


async def ask_resubmission(
    plan: Annotated[resubmission.ResubmissionPlan, Resolve(plan_resubmission)], ctx: Ctx
) -> Elicit[resubmission.ResubmitDecision] | Answered | None:
    return await ask(ctx, resubmission.RESUBMISSION, plan)


async def plan_status_request(
    operation_id: str, wait_seconds: float, ctx: Ctx
) -> status_approval.StatusRequestPlan:
    controller = controller_of(ctx)
    if not controller.per_request_providers:
        return status_approval.StatusRequestPlan()  # the common case: no table asks for it, nothing read
    bounded = wait_bound(
        wait_seconds,
        max_wait=controller.config.max_wait_seconds,
        request_timeout=controller.http.limits.total_timeout_seconds,
    )
    stored = await stored_operation_id(ctx, operation_id)
    return await run_tool(status_approval.plan(controller, stored, wait_seconds=bounded))


async def ask_status_request(
    plan: Annotated[status_approval.StatusRequestPlan, Resolve(plan_status_request)], ctx: Ctx
) -> Elicit[status_approval.SendDecision] | Answered | None:
    return await ask(ctx, status_approval.STATUS_REQUEST, plan)


async def plan_cancel(operation_id: str, ctx: Ctx) -> followups.CancelPlan:
    stored = await stored_operation_id(ctx, operation_id)
    return await run_tool(followups.plan_cancel(controller_of(ctx), stored))


async def ask_cancel(
    plan: Annotated[followups.CancelPlan, Resolve(plan_cancel)], ctx: Ctx
) -> Elicit[followups.ConfirmCancel] | Answered | None:
    return await ask(ctx, followups.CANCEL, plan)
