"""The provider table: one provider's documented HTTP contract, as data.

A table says where requests go (one origin), which provider states mean what,
which result fields a success must carry, how 404s are to be read, how fast to
poll and what the budgets are (README "Writing a provider table"). Everything here is validated when
the table is loaded, so a wrong table is refused at start-up with a message
naming the key and the fix, rather than misbehaving mid-operation.

``ProviderTable`` here assembles the sections, checks its top-level keys and
makes the checks that need more than one section. The sections live by group:

- ``table_request``: base_url and its origin, job id parts, paths, [headers],
  [auth], [submit], [cancel];
- ``table_response``: [response], [states], [refine.*], [not_found], [expiry],
  [awaiting_review];
- ``table_results``: [success], [results], [fields], [counts];
- ``table_limits``: [schedule], [fleet], [rate_limit], [limits], [approval];
- ``table_webhook``: [webhook];
- ``table_common``: what they are all built from (frozen models, strict and
  finite numbers, the refusal that carries its fix).
"""

from __future__ import annotations

import re
from typing import Annotated, Self

from pydantic import BaseModel, Field, PrivateAttr, StrictStr, field_validator, model_validator

from pollwarden_providers.category import CATEGORIES, Category
from pollwarden_providers.table_common import MODEL_CONFIG, PLACEHOLDER_RE, check_dotted_path, refuse
from pollwarden_providers.table_job_id import JobIdSpec, canonical_job_id, check_job_id_spec
from pollwarden_providers.table_limits import (
    ApprovalSpec,
    FleetSpec,
    LimitsSpec,
    RateLimitSpec,
    ScheduleSpec,
)
from pollwarden_providers.table_request import (
    CREDENTIAL_HEADER_WORDS,
    CREDENTIAL_HEADERS,
    AuthSpec,
    CancelSpec,
    SubmitSpec,
    check_base_url,
    check_fixed_headers,
    check_job_id_parts,
    check_path,
    check_placeholders,
    normalized_origin,
)
from pollwarden_providers.table_response import (
    AwaitingReviewSpec,
    ExpirySpec,
    NotFoundSpec,
    RefineSpec,
    ResponseSpec,
    StatesSpec,
)
from pollwarden_providers.table_results import (
    CountsSpec,
    FieldSpec,
    ResultsSpec,
    SuccessSpec,
)
from pollwarden_providers.table_webhook import WebhookSpec

__all__ = ["ProviderTable"]

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")


class ProviderTable(BaseModel):
    """One provider's table. ``source`` is the file it was loaded from, not a TOML key."""

    model_config = MODEL_CONFIG

    name: str = Field(description='lower-case letters, digits, ".", "_" or "-", e.g. "acme-export"')
    base_url: str = Field(
        description='an absolute http(s) URL with only scheme, host and port, e.g. "https://api.acme.example"'
    )
    status_path: str = Field(
        description='a path containing {job_id} (or each of job_id_parts) once, e.g. "/v1/jobs/{job_id}"'
    )
    job_id_parts: Annotated[tuple[StrictStr, ...], Field(strict=False)] = Field(
        default=("job_id",),
        description='placeholder names a job id is made of, e.g. ["owner", "repo", "run_id"]; '
        'the agent writes the id as the parts joined by "/"',
    )
    job_id: JobIdSpec = Field(
        default=JobIdSpec(),
        description="a [job_id] table naming parts compared without case or as integers, e.g. "
        'case_insensitive = ["owner", "repo"], integer = ["run_id"]',
    )
    headers: dict[str, StrictStr] = Field(
        default_factory=dict[str, str],
        description='a [headers] table of fixed, non-secret headers, e.g. "anthropic-version" = "2023-06-01"',
    )
    auth: AuthSpec | None = Field(
        default=None, description='an [auth] table with env, e.g. env = "ACME_TOKEN"'
    )
    submit: SubmitSpec | None = Field(
        default=None, description='a [submit] table with path, e.g. path = "/v1/jobs"'
    )
    cancel: CancelSpec | None = Field(
        default=None, description="a [cancel] table with a path containing {job_id}"
    )
    response: ResponseSpec = Field(default=ResponseSpec(), description="a [response] table")
    states: StatesSpec = Field(
        description='a [states] table, e.g. pending = ["queued"] and succeeded = ["done"]'
    )
    refine: dict[str, RefineSpec] = Field(
        default_factory=dict[str, RefineSpec],
        description='[refine.<state>] tables, e.g. [refine.completed] with field = "conclusion"',
    )
    success: SuccessSpec = Field(default=SuccessSpec(), description="a [success] table")
    fields: dict[str, FieldSpec] = Field(
        default_factory=dict[str, FieldSpec],
        description='[fields] declaring each result field\'s type, e.g. result_url = { type = "url" }',
    )
    results: ResultsSpec = Field(default=ResultsSpec(), description="a [results] table")
    counts: CountsSpec = Field(default=CountsSpec(), description="a [counts] table")
    expiry: ExpirySpec = Field(default=ExpirySpec(), description="an [expiry] table")
    awaiting_review: AwaitingReviewSpec | None = Field(
        default=None, description='an [awaiting_review] table with where = "..."'
    )
    not_found: NotFoundSpec = Field(default=NotFoundSpec(), description="a [not_found] table")
    schedule: ScheduleSpec = Field(default=ScheduleSpec(), description="a [schedule] table")
    fleet: FleetSpec | None = Field(default=None, description="a [fleet] table with max_requests_per_second")
    rate_limit: RateLimitSpec = Field(default=RateLimitSpec(), description="a [rate_limit] table")
    webhook: WebhookSpec | None = Field(
        default=None, description="a [webhook] table with scheme, secret_env, job_id_fields and events"
    )
    limits: LimitsSpec = Field(default=LimitsSpec(), description="a [limits] table")
    approval: ApprovalSpec = Field(default=ApprovalSpec(), description="an [approval] table")
    description: str = Field(default="", description="free text for people")

    _source: str = PrivateAttr(default="<memory>")

    @field_validator("name")
    @classmethod
    def _name_is_a_slug(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):
            raise refuse(
                f"{value!r} is not a valid provider name",
                'use lower-case letters, digits, ".", "_" and "-", starting with a letter or digit, '
                'e.g. "acme-export"',
            )
        return value

    @field_validator("base_url")
    @classmethod
    def _base_url_is_one_origin(cls, value: str) -> str:
        return check_base_url(value)

    @field_validator("status_path")
    @classmethod
    def _status_path_is_relative(cls, value: str) -> str:
        return check_path(value, example='"/v1/jobs/{job_id}"')

    @field_validator("job_id_parts")
    @classmethod
    def _parts_are_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_job_id_parts(value)

    @field_validator("headers")
    @classmethod
    def _headers_are_plain(cls, value: dict[str, str]) -> dict[str, str]:
        return check_fixed_headers(value)

    @model_validator(mode="after")
    def _parts_states_and_headers_agree(self) -> Self:
        """Checks that need more than one section: placeholders, refined states, header ownership."""
        parts = self.job_id_parts
        check_job_id_spec(self.job_id, parts)
        check_placeholders(self.status_path, parts, key="status_path", names_the_job=True)
        if self.cancel is not None:
            check_placeholders(self.cancel.path, parts, key="cancel.path", names_the_job=True)
        if self.submit is not None:
            check_placeholders(self.submit.path, parts, key="submit.path", names_the_job=False)
            if len(parts) > 1 and self.submit.job_id_field is not None:
                raise refuse(
                    f"a job id made of {len(parts)} parts cannot be read from one reply field",
                    "remove job_id_field so the id is read from the Location header, or remove job_id_parts",
                    key="submit.job_id_field",
                )
        for state, refine in self.refine.items():
            if state == "" or state != state.strip():
                raise refuse(
                    f"{state!r} is empty or has surrounding spaces",
                    "write the state exactly as the provider sends it",
                    key=f"refine.{state}",
                )
            listed_under = self.states.category_of(state)
            if listed_under != Category.UNKNOWN:
                raise refuse(
                    f"{state!r} is refined here and also listed under states.{listed_under}",
                    f"remove it from states.{listed_under}: its {refine.field!r} decides the category",
                    key=f"refine.{state}",
                )
        # Without a pending state every first answer would stop the operation,
        # and without a succeeded state it could never succeed.
        for category in (Category.PENDING, Category.SUCCEEDED):
            if not self.states_of(category):
                raise refuse(
                    f"no {category} state is listed",
                    f"list at least one state the provider reports as {category}",
                    key=f"states.{category}",
                )
        self._check_result_fields()
        self._check_awaiting_review()
        self._check_expiry()
        owned: set[str] = {self.auth.header.lower()} if self.auth is not None else set()
        if self.submit is not None and self.submit.idempotency_header:
            owned.add(self.submit.idempotency_header.lower())
        for name in self.headers:
            if name.lower() in owned:
                raise refuse(
                    f"{name!r} is already sent by [auth] or [submit]",
                    "remove it from [headers]; secrets belong in the environment variable [auth] names",
                    key=f"headers.{name}",
                )
        for name in self.headers:
            lower = name.lower()
            if lower in CREDENTIAL_HEADERS or any(word in lower for word in CREDENTIAL_HEADER_WORDS):
                # The value is not echoed: it would be a secret living in the table.
                raise refuse(
                    f"{name!r} names a credential (Authorization, Cookie, or a name containing "
                    f"{', '.join(CREDENTIAL_HEADER_WORDS)}); in [headers] it would keep a secret in the table",
                    'remove it and add [auth] with env = "<VARIABLE HOLDING THE SECRET>" and header = '
                    f'"{name}"',
                    key="headers",
                )
        return self

    def _check_result_fields(self) -> None:
        named: dict[str, str] = {}
        for key, fields in (
            ("success.required_fields", self.success.required_fields),
            ("success.required_one_of", self.success.required_one_of),
            ("success.failure_fields", self.success.failure_fields),
            ("results.failed", self.results.failed),
            ("results.cancelled", self.results.cancelled),
            ("results.expired", self.results.expired),
        ):
            for field in fields:
                named.setdefault(field, key)
                if field not in self.fields:
                    raise refuse(
                        f"{field!r} has no declared type",
                        f'declare it under [fields], e.g. "{field}" = {{ type = "string" }} '
                        "(string, integer, url, object, list or any)",
                        key=key,
                    )
        for field in self.fields:
            check_dotted_path(field)
            if field not in named:
                raise refuse(
                    f"{field!r} is declared but no [success] or [results] list names it",
                    "remove it, or name it where it is handed over",
                    key=f"fields.{field}",
                )

    def _check_awaiting_review(self) -> None:
        states = self.states_of(Category.AWAITING_REVIEW)
        spec = self.awaiting_review
        if states and spec is None:
            raise refuse(
                f"{states[0]!r} waits for a person, but the table does not say where they act",
                'add [awaiting_review] with where = "<the page and button a person uses>"',
                key="awaiting_review",
            )
        if spec is None:
            return
        if not states:
            raise refuse(
                "no state is listed under awaiting_review",
                "list the states in which a person must act, or remove [awaiting_review]",
                key="awaiting_review",
            )
        for state in spec.where_for:
            if state not in states:
                raise refuse(
                    f"{state!r} is not an awaiting_review state",
                    f"use one of {', '.join(states)}",
                    key=f"awaiting_review.where_for.{state}",
                )
        wanted = {f"{{{part}}}" for part in self.job_id_parts}
        for text in (spec.where, *spec.where_for.values()):
            others = sorted(set(PLACEHOLDER_RE.findall(text)) - wanted)
            if others:
                raise refuse(
                    f"{', '.join(others)} is not a job id part",
                    f"use only {', '.join(sorted(wanted))}, or write the text literally",
                    key="awaiting_review.where",
                )

    def _check_expiry(self) -> None:
        spec = self.expiry
        uses_expiry = spec.grace_seconds > 0 or bool(spec.states_after_expiry)
        if uses_expiry and self.response.expires_at_field is None:
            raise refuse(
                "an expiry grace needs the provider's expiry time",
                'set response.expires_at_field (e.g. "expires_at"), or remove the grace',
                key="expiry",
            )
        pending = self.states_of(Category.PENDING)
        for state in spec.states_after_expiry:
            if state not in pending:
                raise refuse(
                    f"{state!r} is not a pending state",
                    f"list only states from states.pending ({', '.join(pending)})",
                    key="expiry.states_after_expiry",
                )
        if spec.window_seconds is not None:
            needed = spec.window_seconds + spec.grace_seconds
            if self.limits.default_deadline_seconds < needed:
                raise refuse(
                    f"default_deadline_seconds ({self.limits.default_deadline_seconds:g}) is shorter than the "
                    f"provider's window plus grace ({needed:g})",
                    f"make limits.default_deadline_seconds at least {needed:g}",
                    key="expiry.window_seconds",
                )

    @property
    def source(self) -> str:
        """The file this table was loaded from (``"<memory>"`` if it was built in code)."""
        return self._source

    def with_source(self, source: str) -> Self:
        """Return a copy of this table recording ``source`` as the file it came from."""
        copy = self.model_copy()
        copy._source = source
        return copy

    @property
    def origin(self) -> str:
        """The one origin every request goes to: ``scheme://host[:port]``.

        Scheme and host are lower-cased and a default port is omitted, so the
        origin compares equal to one computed from any spelling of the same URL.
        """
        return normalized_origin(self.base_url)

    def shares_credential_with(self, origin: str) -> bool:
        """Whether ``[auth] shared_with_origins`` lets a table on `origin` use this table's variable."""
        return self.auth is not None and any(
            normalized_origin(allowed) == origin for allowed in self.auth.shared_with_origins
        )

    def category_of(self, state: object) -> Category:
        """Return the category of a provider state that no other field refines.

        Exact, case-sensitive string match with no stripping; anything else,
        including non-strings (``None``, numbers, lists) and refined states, is
        ``"unknown"``. Reading a whole body is ``interpret.read_status_body``.
        """
        return self.states.category_of(state)

    def canonical_job_id(self, job_id: str) -> str:
        """`job_id` as this table compares it (`[job_id]`): one job, however the agent or provider wrote it."""
        return canonical_job_id(self.job_id_parts, self.job_id, job_id)

    def states_of(self, category: Category) -> tuple[str, ...]:
        """Every state in ``category`` as pollwarden reports it, refined ones as ``state/value``."""
        refined = tuple(
            f"{state}/{value}" for state, refine in self.refine.items() for value in refine.of(category)
        )
        return self.states.of(category) + refined

    def documented_states(self) -> tuple[str, ...]:
        """Every state the table lists, refined ones as ``state/value``, in table order."""
        return tuple(state for category in CATEGORIES for state in self.states_of(category))
