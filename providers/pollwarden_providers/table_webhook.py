"""A table's ``[webhook]``: how the provider signs its webhooks and which events wake an operation.

A verified event is only a hint that brings the next status check forward
(the server checks the signature, ``webhook.py`` reads the event); the status
answer still decides.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictStr, field_validator

from pollwarden_providers.table_common import (
    ENV_RE,
    MODEL_CONFIG,
    check_dotted_path,
    check_header_name,
    has_control_or_space,
    refuse,
)

__all__ = ["WebhookSpec"]


class WebhookSpec(BaseModel):
    """A provider's signed webhooks: a hint that brings the next status check forward, nothing more."""

    model_config = MODEL_CONFIG

    scheme: Literal["standard", "github"] = Field(
        description='"standard" (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature; '
        'OpenAI, Replicate) or "github" (X-Hub-Signature-256)'
    )
    secret_env: str = Field(
        description='the name of an environment variable holding the signing secret, e.g. "OPENAI_WEBHOOK_SECRET"'
    )
    job_id_fields: Annotated[tuple[StrictStr, ...], Field(strict=False)] = Field(
        description='dotted paths to the job id in the event, joined by "/" when several, '
        'e.g. ["data.id"] or ["repository.full_name", "workflow_run.id"]'
    )
    event_type_field: str = Field(
        default="type", description='a dotted path to the event type in the event, e.g. "type" or "action"'
    )
    event_type_header: str | None = Field(
        default=None,
        description='a header whose value is put before the field\'s, joined by ".", e.g. "X-GitHub-Event"',
    )
    events: Annotated[tuple[StrictStr, ...], Field(strict=False)] = Field(
        description='the event types that wake an operation, e.g. ["batch.completed", "batch.failed"]'
    )
    timestamp_field: str | None = Field(
        default=None,
        description="a dotted path to an RFC 3339 time inside the signed event, for a scheme that signs no "
        'timestamp (github), e.g. "workflow_run.updated_at": an event older than 5 minutes is refused as a replay',
    )
    max_body_bytes: int = Field(
        default=256 * 1024, gt=0, le=25 * 1024 * 1024, description="a whole number of bytes, at most 26214400"
    )

    @field_validator("secret_env")
    @classmethod
    def _secret_env_is_a_variable_name(cls, value: str) -> str:
        if not ENV_RE.fullmatch(value):
            # The value is not echoed: people paste the secret itself here.
            raise refuse(
                "the value is not an environment variable name",
                'name the variable that holds the signing secret, not the secret, e.g. "OPENAI_WEBHOOK_SECRET"',
            )
        return value

    @field_validator("job_id_fields")
    @classmethod
    def _job_id_fields_are_dotted(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise refuse("no field is named", 'name where the job id is, e.g. ["data.id"]')
        for field in value:
            check_dotted_path(field)
        return value

    @field_validator("event_type_field")
    @classmethod
    def _event_type_field_is_dotted(cls, value: str) -> str:
        check_dotted_path(value)
        return value

    @field_validator("timestamp_field")
    @classmethod
    def _timestamp_field_is_dotted(cls, value: str | None) -> str | None:
        if value is not None:
            check_dotted_path(value)
        return value

    @field_validator("event_type_header")
    @classmethod
    def _event_type_header_is_a_token(cls, value: str | None) -> str | None:
        return check_header_name(value)

    @field_validator("events")
    @classmethod
    def _events_are_exact(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise refuse(
                "no event type is listed, so no webhook could ever wake an operation",
                'list the event types that mean the job may have finished, e.g. ["batch.completed"]',
            )
        for name in value:
            if name == "" or name != name.strip() or has_control_or_space(name):
                raise refuse(
                    f"{name!r} is empty or has spaces or control characters",
                    "write the event type exactly as the provider sends it",
                )
        if len(set(value)) != len(value):
            raise refuse("an event type is listed twice", "list each once")
        return value
