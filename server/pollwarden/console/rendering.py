"""What the console's pages show: untrusted text escaped and marked, moments, an approval's card,
a provider's states; and the templates' filters."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from pollwarden.console import reading
from pollwarden.core.records import ApprovalRecord, OperationRecord
from pollwarden.core.timefmt import iso, to_datetime
from pollwarden.core.untrusted import one_line, quoted
from pollwarden.flows.approvals import describe_request
from pollwarden.surface.views import human_duration
from pollwarden_providers.table import ProviderTable

__all__ = ["approval_card", "provider_states", "templates", "untrusted"]

UNTRUSTED_TITLE = "untrusted: written by a provider or an agent; shown escaped, on one line"


def untrusted(value: object, limit: int = 120) -> Markup:
    """One untrusted value: escaped, on one line, capped, quoted, and marked."""
    if value is None:
        return Markup('<span class="none">—</span>')
    return Markup('<span class="untrusted" title="{}">{}</span>').format(
        UNTRUSTED_TITLE, quoted(value, limit=limit)
    )


def line(value: object, limit: int = 300) -> str:
    """Pollwarden's own line that may embed stored text: escaped onto one line and capped."""
    return one_line(value, limit=limit)


def when(at: float | None) -> str:
    return iso(at) or "—"


def clock_time(at: float | None) -> Markup:
    """A moment: UTC on the page (the script shows it in local time), the full UTC time on hover."""
    if at is None:
        return Markup('<span class="none">—</span>')
    moment = to_datetime(at)
    return Markup('<time class="clock" datetime="{}" title="{} UTC">{} UTC</time>').format(
        iso(at), moment.strftime("%Y-%m-%d %H:%M:%S"), moment.strftime("%H:%M:%S")
    )


def words(value: object) -> str:
    return "—" if value is None else str(value).replace("_", " ")


def templates() -> Environment:
    env = Environment(
        loader=PackageLoader("pollwarden.console", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["untrusted"] = untrusted
    env.filters["when"] = when
    env.filters["clock"] = clock_time
    env.filters["words"] = words
    env.filters["line"] = line
    return env


def ago(at: float | None, now: float) -> str:
    return "—" if at is None else reading.relative(at, now)


def approval_card(approval: ApprovalRecord, record: OperationRecord | None, now: float) -> dict[str, Any]:
    """What an approval's card shows: the question, the reason, the impact, the expiry, the two buttons."""
    return {
        "approval": approval,
        "record": record,
        "question": question_lines(approval),
        "reason": approval.request.get("reason"),
        "impact": impact(approval),
        "stale": record is not None and record.version != approval.bound_version,
        "expires": reading.expires_words(approval, now),
        "approve": reading.approval_action(approval, approve=True),
        "deny": reading.approval_action(approval, approve=False),
    }


def question_lines(approval: ApprovalRecord) -> list[str]:
    # Stored text that embeds quoted values: escaped again line by line (a row may have been written by hand).
    return [one_line(line) for line in str(approval.request.get("question", "")).splitlines()]


def impact(approval: ApprovalRecord) -> str:
    request = approval.request
    if approval.kind == "cancel":
        return "one cancel call to the provider; the job's work is lost"
    if approval.kind == "reopen":
        return "it waits again inside the same budget and deadline once the server verified who decided"
    if approval.kind in ("resubmission", "status_request"):
        return describe_request(approval).removeprefix("asks to ")  # one submission, or one status request
    seconds = float(request.get("extra_seconds", 0) or 0)
    checks = int(request.get("extra_status_requests", 0) or 0)
    return (
        f"+{human_duration(seconds) if seconds else '0 seconds'} of waiting and +{checks} status requests; "
        "counters are kept, the agent's next check_status applies it"
    )


def provider_states(table: ProviderTable) -> list[tuple[str, tuple[str, ...]]]:
    states = table.states
    return [
        (name, values)
        for name, values in (
            ("pending", states.pending),
            ("succeeded", states.succeeded),
            ("failed", states.failed),
            ("cancelled", states.cancelled),
            ("expired", states.expired),
            ("awaiting review", states.awaiting_review),
        )
        if values
    ]
