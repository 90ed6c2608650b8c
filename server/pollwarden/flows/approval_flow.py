"""One approval flow: ask a person by elicitation, take the answer, then apply, deny or wait for an operator.

Every action that needs a person goes through it: an extension
(`approvals.EXTENSION`), a cancel at the provider (`followups.CANCEL`), a
resubmission of a payload that ended (`resubmission.RESUBMISSION`), and one
status request where the table requires a person for each
(`status_approval.STATUS_REQUEST`). A `Flow` says what its kind asks and what
each answer does; `settle` takes the steps in one order:

1. settled already: a refusal (not allowed now), or an operator's recorded
   decision the flow uses first;
2. the operator trusts the client's own prompt (``tool-confirmation``): approved, on a tool call only
   (a ``tasks/get`` had no prompt before it: `NOT_A_TOOL_CALL`);
3. the person answered in this call (elicitation, either protocol era):
   approved, or denied / dismissed (nothing happens);
   Steps 2 and 3 count only when the database's approval policy counts their
   channel (`pollwarden.access.approval_policy`), read when the flow settles;
4. nobody could be asked (the client cannot show a prompt): an operator decides
   outside the chat (`pollwarden approve`, the console), and the agent's next
   call applies that decision.

Over authenticated HTTP (issue 19) an agent never approves its own request:
its answer is `OPERATOR_DECIDES`, so steps 2 and 3 are skipped and an operator
decides (`decide_approval` over HTTP with ``pollwarden:operator``, or the CLI).

The MCP side (asking, and an answer that comes after the client stopped
waiting) is `server._ask`; it asks only where `Flow.asks` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel

from pollwarden.access.approval_policy import CHANNEL_ELICITATION, CHANNEL_TOOL_CONFIRMATION
from pollwarden.access.operator_keys import METHOD_ELICITATION, METHOD_TOOL_CONFIRMATION

if TYPE_CHECKING:
    from pollwarden.flows.controller import Controller

P = TypeVar("P", contravariant=True)  # what is asked about (a plan)
S = TypeVar("S", contravariant=True)  # what the answer is applied to
R = TypeVar("R", covariant=True)  # what the tool answers


@dataclass(frozen=True)
class Answer:
    """What the person said in this call: approve (True), deny (False), dismissed (None); or not asked."""

    asked: bool
    approve: bool | None = None
    # An authenticated HTTP agent (issue 19): its own client's confirmation counts for nothing.
    operator_only: bool = False
    # A tools/call the client confirmed before sending it; a protocol request (tasks/get) is confirmed by nobody.
    tool_call: bool = True


NOT_ASKED = Answer(asked=False)
OPERATOR_DECIDES = Answer(asked=False, operator_only=True)
# A request that is not a tool call (tasks/get): no client prompt stood before it, so tool-confirmation
# mode approves nothing here; a person answers through tasks/update, the console or the CLI.
NOT_A_TOOL_CALL = Answer(asked=False, tool_call=False)


@dataclass(frozen=True)
class Approver:
    """Who approved and how it was authenticated (`operator_keys` methods); the audit keeps both."""

    by: str
    method: str


TOOL_CONFIRMATION = Approver("client tool confirmation", METHOD_TOOL_CONFIRMATION)
ELICITATION = Approver("person (elicitation)", METHOD_ELICITATION)
# A person who answered after the client stopped waiting: recorded as a decided approval.
LATE_ANSWER_BY = "person (elicitation, answered after the client stopped waiting)"
DISMISSED = "the question was dismissed (cancelled)"

No = Literal["denied", "cancelled"]


class Flow(Protocol[P, S, R]):
    """One kind of approval: what it asks, and what each answer does."""

    @property
    def tool(self) -> str:
        """The tool that asks (named in the message for an answer that fits no choice)."""
        ...

    @property
    def schema(self) -> type[BaseModel]:
        """The flat choice the person is shown."""
        ...

    @property
    def yes(self) -> str:
        """The approving choice in `schema`."""
        ...

    def asks(self, plan: P, /) -> bool:
        """Whether this call needs a person's answer (allowed, and nobody decided yet)."""
        ...

    def question(self, plan: P, /) -> str:
        """What the person reads (untrusted values quoted)."""
        ...

    async def late(self, controller: Controller, plan: P, approve: bool | None, missing: str, /) -> None:
        """Record an answer that came after the client stopped waiting (`missing`: why there is none)."""
        ...

    async def settled(self, controller: Controller, subject: S, /) -> R | None:
        """A refusal, or the outcome of an operator's decision already recorded; None: go on."""
        ...

    async def approve(self, controller: Controller, subject: S, approver: Approver, /) -> R:
        """Apply it: the person (or the client's own prompt) approved."""
        ...

    async def deny(self, controller: Controller, subject: S, no: No, /) -> R:
        """The person denied it or dismissed the question: audited, nothing else happens."""
        ...

    async def ask_operator(self, controller: Controller, subject: S, /) -> R:
        """Nobody was asked here: use an operator's decision, or record a question for one."""
        ...


async def settle(flow: Flow[Any, S, R], controller: Controller, subject: S, answer: Answer) -> R:
    """Take the flow's steps in the one order (this module's docstring) and return what the tool answers."""
    if (known := await flow.settled(controller, subject)) is not None:
        return known
    if answer.operator_only:
        return await flow.ask_operator(controller, subject)  # nobody decides about their own operation
    counted = (await controller.store.approval_policy()).channels  # the database's policy, as it is now
    confirmed = controller.config.approval_mode == "tool-confirmation" and answer.tool_call
    if confirmed and CHANNEL_TOOL_CONFIRMATION in counted:
        return await flow.approve(controller, subject, TOOL_CONFIRMATION)
    if answer.asked and CHANNEL_ELICITATION in counted:
        if answer.approve:
            return await flow.approve(controller, subject, ELICITATION)
        return await flow.deny(controller, subject, "denied" if answer.approve is False else "cancelled")
    return await flow.ask_operator(controller, subject)
