"""Which tools each caller is shown: the operator tools only to operator principals (issue 31).

`list_approvals` and `decide_approval` decide for a person. A stdio caller is
the agent itself and an agent principal may not decide, so neither is shown
them; an authenticated ``pollwarden:operator`` is. A call by anyone else is
still refused by the tool (`pollwarden.surface.operator_tools`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types import ListToolsResult

from pollwarden.access.principals import Principal, current_principal

__all__ = ["OPERATOR_TOOLS", "operator_tools_middleware", "shows_operator_tools"]

OPERATOR_TOOLS = frozenset({"list_approvals", "decide_approval"})


def shows_operator_tools(principal: Principal) -> bool:
    """Whether `principal` is shown the operator tools: an authenticated operator, never the stdio caller."""
    return principal.authenticated and principal.operator


def _without_operator_tools(result: HandlerResult) -> HandlerResult:
    if isinstance(result, ListToolsResult):
        return result.model_copy(update={"tools": [t for t in result.tools if t.name not in OPERATOR_TOOLS]})
    if isinstance(result, Mapping):
        listed = cast(Mapping[str, Any], result)
        tools = cast(list[Any], listed.get("tools") or [])
        kept: list[Any] = [
            t
            for t in tools
            if not (isinstance(t, Mapping) and cast(Mapping[str, Any], t).get("name") in OPERATOR_TOOLS)
        ]
        return {**listed, "tools": kept}
    return result


async def operator_tools_middleware(
    ctx: ServerRequestContext[Any, Any], call_next: CallNext
) -> HandlerResult:
    """`tools/list` without the operator tools, unless the caller is an operator principal."""
    result = await call_next(ctx)
    if ctx.method == "tools/list" and not shows_operator_tools(current_principal()):
        return _without_operator_tools(result)
    return result
