"""check_status, the main tool path: one round of the check, with a person's permission first where the
provider's table requires one for every status request (`status_approval`)."""

from __future__ import annotations

from pollwarden.flows.approval_flow import Answer, settle
from pollwarden.flows.controller import Controller, ProgressCallback
from pollwarden.flows.status_approval import STATUS_REQUEST, StatusRequestPlan
from pollwarden.surface.views import OperationView


async def check_status(
    controller: Controller,
    operation_id: str,
    plan: StatusRequestPlan,
    answer: Answer,
    *,
    wait_seconds: float,
    progress: ProgressCallback | None,
) -> OperationView:
    """check_status, with a person's permission where the table requires one for every status request."""
    permission = await settle(STATUS_REQUEST, controller, plan, answer)
    shown = await controller.check_status(
        operation_id, wait_seconds=wait_seconds, progress=progress, person_approved=permission.granted
    )
    if permission.refusal is not None and shown.outcome == "not_yet":
        shown = shown.model_copy(update={"message": permission.refusal})
    return shown
