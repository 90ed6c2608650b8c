"""MCP Tasks (`io.modelcontextprotocol/tasks`, SEP-2663) whose poll interval is enforced, not advised.

Opt-in (`serve --tasks`), 2026-07-28 connections only. A `start_operation`
called by a client that declared the extension on the request answers with a
task (`resultType: "task"`) whose id is the operation's id as the caller sees
it, so a task lives exactly as long as its operation record (kept for good:
`ttlMs` is null) and another principal's task id is unknown, as the operation is.

- `tasks/get` is `check_status` with the controller's rules: before the next
  allowed check it answers the recorded status and the true `pollIntervalMs`
  until that time and sends nothing (the early poll is counted and summarised
  in the audit like any refused call); at or after it, it makes the one status
  request. A stopped operation answers its terminal task status: `completed`
  with the validated result `fetch_result` hands over, or an `isError` result
  naming the stop reason and the allowed actions; `cancelled` when the job was.
- An approval waiting for a person (an extension after an extendable stop, a
  cancel asked by `tasks/cancel`, a status request where the table requires a
  person) is `input_required`, with the same question as elicitation in
  `inputRequests`, keyed by the approval's id (unique for the task's life).
  `tasks/update` records the person's answer on that approval through the one
  decision path (`operator_decision.decide`, audited as ``task-input``); the
  next `tasks/get` applies it as `check_status` applies any decided approval.
  Refused where the database's policy requires an operator key, and for agent
  principals on authenticated HTTP (operators decide there).
- `tasks/cancel` goes through the cancel flow: a person approves the provider
  cancel (as an `input_required` question), then it is sent once.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any, cast

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    CallToolRequestParams,
    CallToolResult,
    RequestParams,
    TextContent,
)
from pydantic import BaseModel, Field

from pollwarden.access import ownership
from pollwarden.access.approval_policy import CHANNEL_ELICITATION
from pollwarden.access.operator_keys import METHOD_TASK_INPUT
from pollwarden.access.policy_gate import in_chat_refusal_now
from pollwarden.access.principals import Principal, current_principal
from pollwarden.core.errors import OperationNotFound, PollwardenError
from pollwarden.core.records import ApprovalRecord, OperationRecord
from pollwarden.core.timefmt import iso
from pollwarden.core.vocabulary import ApprovalKind, ApprovalStatus, Status, StopReason
from pollwarden.flows import approvals, checking, followups, status_approval
from pollwarden.flows.approval_flow import NOT_A_TOOL_CALL, OPERATOR_DECIDES, Flow, settle
from pollwarden.flows.controller import Controller
from pollwarden.flows.operator_decision import decide
from pollwarden.surface.asking import DatabaseUnavailable
from pollwarden.surface.views import OperationView

log = logging.getLogger("pollwarden")

__all__ = ["TASKS_EXTENSION", "OperationTasks"]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
MODERN_ERA = frozenset({"2026-07-28"})
TASK_TOOLS = frozenset({"start_operation"})
# While a person (or an operator) is to decide, polling changes nothing: look again after this long.
PERSON_POLL_MS = 5_000
PERSON = "person (task input)"

# The question each approval kind asks, and its approving choice.
FLOWS: dict[str, Flow[Any, Any, Any]] = {
    ApprovalKind.EXTENSION: approvals.EXTENSION,
    ApprovalKind.CANCEL: followups.CANCEL,
    ApprovalKind.STATUS_REQUEST: status_approval.STATUS_REQUEST,
}


class TaskParams(RequestParams):
    """`tasks/get` and `tasks/cancel`."""

    task_id: str = Field(min_length=1, max_length=400)


class UpdateTaskParams(TaskParams):
    """`tasks/update`: answers keyed by the `inputRequests` keys."""

    input_responses: dict[str, Any] = Field(default_factory=dict[str, Any])


def client_speaks_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request declared the tasks extension (per-request capabilities, 2026-07-28)."""
    if ctx.protocol_version not in MODERN_ERA:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return bool(extensions) and TASKS_EXTENSION in cast(dict[str, Any], extensions)


def poll_interval_ms(view: OperationView) -> int:
    """The true time until the controller allows the next status request, in whole milliseconds."""
    return max(0, math.ceil((view.retry_after_seconds or 0.0) * 1000))


def _controller(ctx: ServerRequestContext[Any, Any]) -> Controller:
    context = ctx.lifespan_context
    if isinstance(context, DatabaseUnavailable):
        raise MCPError(code=INTERNAL_ERROR, message=context.message)
    if not isinstance(context, Controller):
        raise MCPError(code=INTERNAL_ERROR, message="pollwarden's controller is not running")
    return context


async def _operation(controller: Controller, principal: Principal, task_id: str) -> OperationRecord:
    """The caller's operation a task id names; another principal's is as unknown as a wrong id."""
    try:
        return await controller.load(await ownership.resolve(controller, principal, task_id))
    except OperationNotFound:
        raise MCPError(
            code=INVALID_PARAMS, message=f"unknown task {task_id!r}: no operation of yours has that id"
        ) from None


async def who_decides_elsewhere(controller: Controller, principal: Principal) -> str | None:
    """Why the person in this chat may not answer (an operator decides), or None if they may.

    A task's input request is an elicitation, so it counts only where elicitation does
    (`policy_gate.in_chat_refusal`, under the policy as stored now).
    """
    return await in_chat_refusal_now(
        controller.store, controller.config, principal, channel=CHANNEL_ELICITATION
    )


def _question(approval: ApprovalRecord) -> tuple[str, type[BaseModel]] | None:
    flow = FLOWS.get(approval.kind)
    if flow is None:
        return None
    request: object = json.loads(approval.request_json or "{}")
    text = cast(dict[str, Any], request).get("question") if isinstance(request, dict) else None
    return (str(text) if text else f"Approve {approval.kind} for {approval.operation_id}?"), flow.schema


def input_request(approval: ApprovalRecord) -> dict[str, Any] | None:
    """The elicitation a task client shows the person for one pending approval."""
    asked = _question(approval)
    if asked is None:
        return None
    text, schema = asked
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": text, "requestedSchema": schema.model_json_schema()},
    }


class OperationTasks(Extension):
    """The tasks extension over the controller (this module's docstring)."""

    identifier = TASKS_EXTENSION

    def methods(self) -> Sequence[MethodBinding]:
        """`tasks/get`, `tasks/update` and `tasks/cancel`, on 2026-07-28 connections only."""
        return (
            MethodBinding("tasks/get", TaskParams, self.get_task, MODERN_ERA),
            MethodBinding("tasks/update", UpdateTaskParams, self.update_task, MODERN_ERA),
            MethodBinding("tasks/cancel", TaskParams, self.cancel_task, MODERN_ERA),
        )

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """A start by a client that declared tasks answers with the operation's task."""
        result = await call_next(ctx)
        if params.name not in TASK_TOOLS or not client_speaks_tasks(ctx):
            return result
        if not isinstance(result, CallToolResult) or result.is_error or result.structured_content is None:
            return result  # a refusal, or a question to a person first: answered as the tool answers it
        view = OperationView.model_validate(result.structured_content)
        controller = _controller(ctx)
        principal = current_principal()
        record = await controller.load(ownership.stored_id(principal, view.operation_id))
        task = _task(controller, record, view)
        task["status"] = "working" if task["status"] == "input_required" else task["status"]
        log.info("tasks: %s started as a task (%s)", view.operation_id, task["status"])
        return {
            "resultType": "task",
            **{k: v for k, v in task.items() if k not in ("result", "inputRequests")},
        }

    async def get_task(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        """check_status under the controller's rules, answered as the task's state."""
        controller = _controller(ctx)
        principal = current_principal()
        record = await _operation(controller, principal, params.task_id)
        try:
            return {"resultType": "complete", **await self._describe(controller, principal, record)}
        except PollwardenError as exc:
            raise MCPError(code=INVALID_REQUEST, message=str(exc)) from exc

    async def _describe(
        self, controller: Controller, principal: Principal, record: OperationRecord
    ) -> dict[str, Any]:
        stored = record.operation_id
        if record.status == Status.ESCALATED:
            await self._send_approved_cancel(controller, stored)
        plan = status_approval.StatusRequestPlan()
        per_request = record.provider in controller.per_request_providers
        if per_request:
            plan = await status_approval.plan(controller, stored, wait_seconds=0.0)
        answer = OPERATOR_DECIDES if principal.authenticated else NOT_A_TOOL_CALL
        view = await checking.check_status(controller, stored, plan, answer, wait_seconds=0.0, progress=None)
        if view.status == Status.WAITING and not per_request:
            return _task(controller, record, ownership.renamed(view, principal))  # the hot path: two trips
        record = await controller.load(stored)
        pending = await controller.store.list_approvals(status=ApprovalStatus.PENDING, operation_id=stored)
        if not pending and record.status == Status.ESCALATED:
            opened = await self._ask_to_extend(controller, principal, record)
            pending = [opened] if opened is not None else []
        task = _task(controller, record, ownership.renamed(view, principal))
        if pending:
            return _awaiting_person(task, pending, await who_decides_elsewhere(controller, principal))
        if record.status == Status.SUCCEEDED:
            fetched = ownership.renamed(await followups.fetch_result(controller, stored), principal)
            task["result"] = _tool_result(fetched.model_dump(mode="json"), fetched.message, error=False)
        return task

    async def _send_approved_cancel(self, controller: Controller, stored: str) -> None:
        """A cancel a person approved (through tasks/update) is sent once, by the next tasks/get."""
        plan = await followups.plan_cancel(controller, stored)
        if plan.allowed and plan.approved_id is not None:
            await settle(followups.CANCEL, controller, plan, OPERATOR_DECIDES)

    async def _ask_to_extend(
        self, controller: Controller, principal: Principal, record: OperationRecord
    ) -> ApprovalRecord | None:
        """After an extendable stop, ask the person once to extend by the table's defaults (clipped).

        Not again once a person answered (or nobody did) about this version of the operation.
        """
        if await who_decides_elsewhere(controller, principal) is not None:
            return None
        earlier = await controller.store.list_approvals(operation_id=record.operation_id)
        if any(a.kind == ApprovalKind.EXTENSION and a.bound_version == record.version for a in earlier):
            return None
        table = controller.tables.get(record.provider)
        if table is None:
            return None
        plan = await approvals.plan_extension(
            controller,
            record.operation_id,
            extra_seconds=table.limits.default_deadline_seconds,
            extra_status_requests=table.limits.default_max_status_requests,
            reason="the task's client keeps waiting (MCP tasks): the table's default deadline and budget again",
        )
        if not plan.allowed:
            return None
        return await approvals.open_question(
            controller, record, ApprovalKind.EXTENSION, plan.model_dump(mode="json")
        )

    async def update_task(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
    ) -> HandlerResult:
        """Record the person's answers on the task's pending approvals (unknown keys are ignored)."""
        controller = _controller(ctx)
        principal = current_principal()
        stored = (await _operation(controller, principal, params.task_id)).operation_id
        elsewhere = await who_decides_elsewhere(controller, principal)
        if elsewhere is not None:
            raise MCPError(code=INVALID_REQUEST, message=f"not recorded: {elsewhere}")
        pending = {
            a.approval_id: a
            for a in await controller.store.list_approvals(status=ApprovalStatus.PENDING, operation_id=stored)
        }
        for key, response in params.input_responses.items():
            approval = pending.get(key)
            flow = FLOWS.get(approval.kind) if approval is not None else None
            if approval is None or flow is None or not isinstance(response, dict):
                continue  # not outstanding (never issued, already answered, superseded): ignored
            answered = cast(dict[str, Any], response)
            action = answered.get("action")
            if action not in ("accept", "decline"):
                continue  # dismissed: nothing changes, the question stays open until it expires
            content = answered.get("content")
            choice = cast(dict[str, Any], content).get("decision") if isinstance(content, dict) else None
            approve = action == "accept" and choice == flow.yes
            decision = await decide(
                controller.store,
                key,
                approve=approve,
                by=PERSON,
                at=controller.clock.now(),
                method=METHOD_TASK_INPUT,
            )
            if not decision.ok:
                log.info("tasks: the answer to %s was not recorded: %s", key, decision.message)
        return {"resultType": "complete"}

    async def cancel_task(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        """Ask a person to approve the provider cancel (the cancel flow); refused where no cancel is allowed."""
        controller = _controller(ctx)
        principal = current_principal()
        stored = (await _operation(controller, principal, params.task_id)).operation_id
        plan = await followups.plan_cancel(controller, stored)
        if not plan.allowed:
            raise MCPError(code=INVALID_REQUEST, message=f"the job was not cancelled: {plan.refusal}")
        await settle(followups.CANCEL, controller, plan, OPERATOR_DECIDES)
        return {"resultType": "complete"}


def _tool_result(structured: dict[str, Any], message: str, *, error: bool) -> dict[str, Any]:
    content = CallToolResult(
        content=[TextContent(type="text", text=message)], structured_content=structured, is_error=error
    )
    return content.model_dump(mode="json", by_alias=True, exclude_none=True)


def _task(controller: Controller, record: OperationRecord, view: OperationView) -> dict[str, Any]:
    """The task shape of an operation as it is now (no inline input requests yet)."""
    task: dict[str, Any] = {
        "taskId": view.operation_id,
        "statusMessage": view.message,
        "createdAt": iso(record.created_at),
        "lastUpdatedAt": iso(record.updated_at),
        "ttlMs": None,  # the operation's record is kept for good, and so is its task
    }
    # The view is the state after this call's check (the record may be from before it).
    if view.status == Status.WAITING:
        return {**task, "status": "working", "pollIntervalMs": poll_interval_ms(view)}
    if view.status == Status.CANCELLED or view.stop_reason == StopReason.CANCELLED:
        return {**task, "status": "cancelled"}
    if view.status == Status.SUCCEEDED:
        return {**task, "status": "completed"}
    text = view.message if view.escalation is None else f"{view.message}\n\n{view.escalation.message}"
    return {
        **task,
        "status": "completed",
        "result": _tool_result(view.model_dump(mode="json"), text, error=True),
    }


def _awaiting_person(
    task: dict[str, Any], pending: list[ApprovalRecord], elsewhere: str | None
) -> dict[str, Any]:
    """A task whose operation waits for a person: asked in the chat, or waiting for an operator."""
    base = {k: v for k, v in task.items() if k not in ("result", "status", "pollIntervalMs")}
    if elsewhere is not None:
        ids = ", ".join(a.approval_id for a in pending)
        message = f"Waiting for an operator's decision on {ids}: {elsewhere}."
        return {**base, "status": "working", "statusMessage": message, "pollIntervalMs": PERSON_POLL_MS}
    requests = {a.approval_id: r for a in pending if (r := input_request(a)) is not None}
    return {**base, "status": "input_required", "inputRequests": requests, "pollIntervalMs": PERSON_POLL_MS}
