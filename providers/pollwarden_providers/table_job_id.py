"""The `[job_id]` section: how a provider compares job ids, so one job is one job however it is written.

GitHub documents owner and repository names as case-insensitive and a run id
as an integer, so ``octo-org/hello/42``, ``Octo-Org/Hello/42`` and
``octo-org/hello/042`` are one run. A table declares which parts of its job id
(names from ``job_id_parts``) compare that way; pollwarden keeps and compares
every job id in the table's canonical form (`canonical_job_id`).

    [job_id]
    case_insensitive = ["owner", "repo"]   # compared lower-cased
    integer = ["run_id"]                   # decimal digits; leading zeros dropped
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictStr

from pollwarden_providers.table_common import MODEL_CONFIG, refuse

__all__ = ["JobIdSpec", "canonical_job_id", "check_job_id_spec"]


class JobIdSpec(BaseModel):
    """Which job id parts the provider compares without case, and which are integers."""

    model_config = MODEL_CONFIG

    case_insensitive: Annotated[tuple[StrictStr, ...], Field(strict=False)] = Field(
        default=(),
        description='names from job_id_parts the provider compares without case, e.g. ["owner", "repo"]',
    )
    integer: Annotated[tuple[StrictStr, ...], Field(strict=False)] = Field(
        default=(),
        description='names from job_id_parts that are decimal integers (leading zeros dropped), e.g. ["run_id"]',
    )


def check_job_id_spec(spec: JobIdSpec, parts: tuple[str, ...]) -> None:
    """Refuse a `[job_id]` section naming a part the table's job id does not have, or one part twice."""
    for key, names in (("job_id.case_insensitive", spec.case_insensitive), ("job_id.integer", spec.integer)):
        for name in names:
            if name not in parts:
                raise refuse(
                    f"{name!r} is not a part of this table's job id ({', '.join(parts)})",
                    f"name parts from job_id_parts, e.g. {key.split('.')[1]} = [{parts[0]!r}]",
                    key=key,
                )
    both = set(spec.case_insensitive) & set(spec.integer)
    if both:
        raise refuse(
            f"{', '.join(sorted(both))} is listed both as case_insensitive and as integer",
            "list each part once: an integer has no case",
            key="job_id",
        )


def canonical_job_id(parts: tuple[str, ...], spec: JobIdSpec, job_id: str) -> str:
    """`job_id` in its table's canonical form: declared parts lower-cased or as plain integers.

    A part that does not fit (an "integer" with other characters, or a job id
    with another number of parts) is left as written; the request then fails
    or succeeds as the provider decides, and the id is still one job.
    """
    if not spec.case_insensitive and not spec.integer:
        return job_id
    pieces = job_id.split("/") if len(parts) > 1 else [job_id]
    if len(pieces) != len(parts):
        return job_id
    out: list[str] = []
    for name, piece in zip(parts, pieces, strict=True):
        if name in spec.case_insensitive:
            piece = piece.lower()
        elif name in spec.integer and piece.isascii() and piece.isdigit():
            piece = str(int(piece))
        out.append(piece)
    return "/".join(out)
