"""A task-speaking client for the tests: the SDK's own `Client`, declaring `io.modelcontextprotocol/tasks`.

The SDK (2.x) ships no tasks support, but its client extension API does what a requester needs: it
advertises the extension in every request's capabilities, claims the `resultType: "task"` answer of a
`tools/call`, and sends `tasks/get`, `tasks/update` and `tasks/cancel` with the `Mcp-Name` header the
extension requires. Every answer pollwarden sends is also checked against the extension's published
JSON schema (vendored in `ext_tasks/`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

import jsonschema
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"
SCHEMA = Path(__file__).parent / "ext_tasks" / "schema.json"


class CreateTaskResult(Result):
    """The task a task-augmented tools/call answers with."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str
    status: str


async def _unresolved(result: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
    raise AssertionError("the tests drive tasks themselves (call_tool with allow_claimed=True)")


class TasksClientExtension(ClientExtension):
    """Declares the tasks extension and claims its task result."""

    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=CreateTaskResult, resolve=_unresolved),)


class TaskIdParams(RequestParams):
    task_id: str


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    name_param = "taskId"


class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
    name_param = "taskId"


class AnyResult(Result):
    model_config = ConfigDict(extra="allow")


@cache
def _validator(definition: str) -> jsonschema.Draft202012Validator:
    schema = {**json.loads(SCHEMA.read_text()), "$ref": f"#/$defs/{definition}"}
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def conforms(definition: str, message: dict[str, Any]) -> dict[str, Any]:
    """`message`, after checking it against the extension's published definition (raises if not)."""
    _validator(definition).validate(message)
    return message


async def start_as_task(client: Client, arguments: dict[str, Any]) -> dict[str, Any]:
    """start_operation as a task; the CreateTaskResult as sent (schema-checked)."""
    result = await client.session.call_tool("start_operation", arguments, allow_claimed=True)
    assert isinstance(result, CreateTaskResult), f"not a task: {result}"
    return conforms("CreateTaskResult", result.model_dump(mode="json", by_alias=True, exclude_none=False))


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    """tasks/get; the task as sent (schema-checked)."""
    result = await client.session.send_request(
        GetTask(method="tasks/get", params=TaskIdParams(task_id=task_id)), AnyResult
    )
    return conforms("GetTaskResult", result.model_dump(mode="json", by_alias=True))


async def update_task(client: Client, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
    """tasks/update with `responses` keyed by the inputRequests keys."""
    params = UpdateParams(task_id=task_id, input_responses=responses)
    result = await client.session.send_request(UpdateTask(method="tasks/update", params=params), AnyResult)
    return conforms("UpdateTaskResult", result.model_dump(mode="json", by_alias=True))


async def cancel_task(client: Client, task_id: str) -> dict[str, Any]:
    """tasks/cancel."""
    result = await client.session.send_request(
        CancelTask(method="tasks/cancel", params=TaskIdParams(task_id=task_id)), AnyResult
    )
    return conforms("CancelTaskResult", result.model_dump(mode="json", by_alias=True))
