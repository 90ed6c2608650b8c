"""The category of a provider state: the one word of the vocabulary the tables define.

It lives here because this package never imports ``pollwarden``; the server
re-uses it (``pollwarden.core.vocabulary.Category``) in its records, views and SQL.
"""

from __future__ import annotations

from enum import StrEnum


class Category(StrEnum):
    """The category of a provider state; ``unknown`` is anything the table does not list."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    # The job waits for a person to act at the provider (approve a deployment, a run from a fork):
    # waiting stops and says where the person acts.
    AWAITING_REVIEW = "awaiting_review"
    UNKNOWN = "unknown"


CATEGORIES: tuple[Category, ...] = (
    Category.PENDING,
    Category.SUCCEEDED,
    Category.FAILED,
    Category.CANCELLED,
    Category.EXPIRED,
    Category.AWAITING_REVIEW,
)
"""The categories a table can list states under, in table order (``unknown`` is never listed)."""
