"""Provider tables for pollwarden: the model, the loader and the shipped tables.

This package never imports ``pollwarden`` (the server depends on it, not the
reverse), so tables can be loaded and checked without the server.
"""

from .category import CATEGORIES, Category
from .loader import (
    TableError,
    example_tables_dir,
    load_table,
    load_tables,
    shipped_samples_dir,
    shipped_tables_dir,
)
from .table import ProviderTable
from .table_limits import FleetSpec, LimitsSpec, RateLimitSpec, ScheduleSpec
from .table_request import AuthSpec, CancelSpec, SubmitSpec
from .table_response import NotFoundSpec, RefineSpec, ResponseSpec, StatesSpec
from .table_results import SuccessSpec
from .table_webhook import WebhookSpec

__all__ = [
    "CATEGORIES",
    "AuthSpec",
    "CancelSpec",
    "Category",
    "FleetSpec",
    "LimitsSpec",
    "NotFoundSpec",
    "ProviderTable",
    "RateLimitSpec",
    "RefineSpec",
    "ResponseSpec",
    "ScheduleSpec",
    "StatesSpec",
    "SubmitSpec",
    "SuccessSpec",
    "TableError",
    "WebhookSpec",
    "example_tables_dir",
    "load_table",
    "load_tables",
    "shipped_samples_dir",
    "shipped_tables_dir",
]
