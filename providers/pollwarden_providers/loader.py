"""Load provider tables from TOML files, refusing a wrong table with the file, the key and the fix.

A table is written by a person, usually while reading a provider's docs, so
every refusal says where (file and dotted key), what is wrong, and what to
write instead. The first problem found is reported in full; any others are
named so one edit-and-reload cycle can fix them all.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from pollwarden_providers.errors import PollwardenError

from .table import ProviderTable

__all__ = [
    "TableError",
    "check_shared_credentials",
    "load_table",
    "load_tables",
    "shipped_samples_dir",
    "shipped_tables_dir",
]

_TOML_POSITION_RE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_MAX_SHOWN_INPUT = 80
# No real table nests deeper than [fields."a.b"] (four levels); a file nesting
# arrays or inline tables past this is refused before anything recurses into it.
MAX_TABLE_DEPTH = 16
_NESTING_FIX = "a provider table nests at most a few levels; remove the nested arrays or tables"


class TableError(PollwardenError, ValueError):
    """A provider table that cannot be used, naming the file, the key and the fix.

    ``key`` is the dotted TOML key (``"states.pending"``, ``"states.pending[1]"``),
    or ``""`` when the problem concerns the whole file or directory.
    ``line`` and ``column`` are set for TOML syntax errors.
    """

    file: str
    key: str
    problem: str
    fix: str
    line: int | None
    column: int | None

    def __init__(
        self,
        file: str,
        key: str,
        problem: str,
        fix: str,
        *,
        line: int | None = None,
        column: int | None = None,
        also: Sequence[str] = (),
    ) -> None:
        self.file = file
        self.key = key
        self.problem = problem
        self.fix = fix
        self.line = line
        self.column = column
        where = f"{file}: key '{key}'" if key else file
        message = f"{where}: {problem} — {fix}"
        if also:
            message += f" (also to fix: {'; '.join(also)})"
        super().__init__(message)


def shipped_tables_dir() -> Path:
    """Return the directory of tables shipped inside this package."""
    return Path(__file__).parent / "tables"


def example_tables_dir() -> Path:
    """Return the directory of commented example tables (documentation; never loaded as providers)."""
    return Path(__file__).parent / "examples"


def shipped_samples_dir() -> Path:
    """Return the directory of sample status answers for the shipped tables (one sub-directory each)."""
    return Path(__file__).parent / "samples"


def load_table(path: Path) -> ProviderTable:
    """Load and validate one provider table file.

    Raises TableError for an unreadable file, a TOML syntax error (naming the
    line and column) or a table that does not validate (naming the dotted key
    and the fix). The returned table's ``source`` is ``str(path)``.
    """
    file = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TableError(
            file, "", f"cannot be read ({exc.strerror or exc})", "check the path and its permissions"
        ) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TableError(file, "", "is not UTF-8 text", "save the file as UTF-8 (TOML requires it)") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(file, exc) from exc
    except RecursionError as exc:  # tomllib recurses once per nested array or inline table
        raise TableError(file, "", "nests arrays or inline tables too deeply to read", _NESTING_FIX) from exc
    if _depth_exceeds(data, MAX_TABLE_DEPTH):
        raise TableError(file, "", f"nests values deeper than {MAX_TABLE_DEPTH} levels", _NESTING_FIX)
    try:
        table = ProviderTable.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(file, exc) from exc
    return table.with_source(file)


def _depth_exceeds(data: object, limit: int) -> bool:
    """True when lists and dicts in `data` nest deeper than `limit` (walked without recursion)."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children: list[object] = []
        if isinstance(value, dict):
            children = list(cast(dict[str, object], value).values())
        elif isinstance(value, list):
            children = list(cast(list[object], value))
        if children and depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def check_shared_credentials(tables: Sequence[ProviderTable]) -> None:
    """Refuse two tables sending one credential variable to different origins, unless one allows it.

    A credential belongs to one provider account. A table naming another
    table's variable for another origin would send that secret elsewhere; it
    is allowed only when one of the two lists the other's origin in
    ``[auth] shared_with_origins``.
    """
    first_by_env: dict[str, list[ProviderTable]] = {}
    for table in tables:
        if table.auth is None:
            continue
        for other in first_by_env.get(table.auth.env, []):
            if other.origin == table.origin:
                continue
            if table.shares_credential_with(other.origin) or other.shares_credential_with(table.origin):
                continue
            raise TableError(
                table.source,
                "auth.env",
                f"${table.auth.env} is also the credential of {other.name!r} ({other.source}) for "
                f"{other.origin}; this table would send it to {table.origin}",
                f"use a variable of its own, or, if that account really serves both origins, add "
                f'shared_with_origins = ["{other.origin}"] under [auth]',
            )
        first_by_env.setdefault(table.auth.env, []).append(table)
    check_webhook_secrets_are_no_credentials(tables)


def check_webhook_secrets_are_no_credentials(tables: Sequence[ProviderTable]) -> None:
    """Refuse a table whose credential variable is a webhook signing secret (its own or another table's).

    A signing secret proves a webhook came from the provider; sent as a
    credential it would reach the table's origin, and whoever reads it there
    could sign webhooks. Checked in both directions: a [webhook] secret_env
    naming a variable that some table sends as its credential is refused too.
    """
    secrets = {t.webhook.secret_env: t for t in tables if t.webhook is not None}
    for table in tables:
        if table.auth is None or (owner := secrets.get(table.auth.env)) is None:
            continue
        whose = "its own" if owner is table else f"the one of {owner.name!r} ({owner.source})"
        raise TableError(
            table.source,
            "auth.env",
            f"${table.auth.env} is a webhook signing secret ({whose} [webhook] secret_env); this table would "
            f"send it to {table.origin} as a credential",
            "give the credential and the webhook signing secret variables of their own",
        )


def load_tables(dirs: Sequence[Path], include_shipped: bool = True) -> dict[str, ProviderTable]:
    """Load every ``*.toml`` table: the shipped directory first, then each of ``dirs`` in order.

    Files in one directory load in name order, so errors are reproducible. A
    missing directory is an error rather than "no tables": a typo in the
    configuration must not silently leave a provider unavailable. Two files
    declaring the same ``name`` are an error naming both; the same file
    reached twice (a directory listed twice) is loaded once.
    """
    search: list[Path] = [shipped_tables_dir()] if include_shipped else []
    search.extend(Path(d) for d in dirs)
    tables: dict[str, ProviderTable] = {}
    loaded: set[Path] = set()
    for directory in search:
        if not directory.exists():
            raise TableError(
                str(directory),
                "",
                "this provider table directory does not exist",
                "create it, or remove it from the configured table directories",
            )
        if not directory.is_dir():
            raise TableError(
                str(directory),
                "",
                "is not a directory",
                "name the directory that holds the *.toml tables, not a file",
            )
        for path in sorted(directory.glob("*.toml")):
            resolved = path.resolve()
            if resolved in loaded or not path.is_file():
                continue
            loaded.add(resolved)
            table = load_table(path)
            first = tables.get(table.name)
            if first is not None:
                raise TableError(
                    table.source,
                    "name",
                    f"{table.name!r} is also declared by {first.source}",
                    "give each provider table its own name, or remove one of the two files",
                )
            tables[table.name] = table
    check_shared_credentials(list(tables.values()))
    return tables


def _syntax_error(file: str, exc: tomllib.TOMLDecodeError) -> TableError:
    message = str(exc)
    match = _TOML_POSITION_RE.search(message)
    if match is None:
        return TableError(file, "", f"is not valid TOML: {message}", "fix the TOML syntax")
    line, column = int(match.group(1)), int(match.group(2))
    reason = message[: match.start()]
    return TableError(
        file,
        "",
        f"is not valid TOML at line {line}, column {column}: {reason}",
        "fix the TOML syntax at that position",
        line=line,
        column=column,
    )


def _validation_error(file: str, exc: ValidationError) -> TableError:
    described = [_describe(error) for error in exc.errors()]
    key, problem, fix = described[0]
    also = [f"key '{k}': {p}" if k else p for k, p, _ in described[1:]]
    return TableError(file, key, problem, fix, also=also)


def _describe(error: ErrorDetails) -> tuple[str, str, str]:
    """Turn one pydantic error into (dotted key, problem, fix)."""
    loc = tuple(error["loc"])
    context: dict[str, Any] = dict(error.get("ctx") or {})
    sub_key = context.get("table_key")
    if isinstance(sub_key, str):
        # A model-level check (e.g. a state in two categories) knows which key is wrong.
        loc = (*loc, sub_key)
    key = _dotted(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        known = list(parent.model_fields) if parent is not None else []
        fix = "remove it or check the spelling; known keys here: " + ", ".join(known)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        if close:
            fix += f"; did you mean '{close[0]}'?"
        return key, "unknown key", fix
    expected = _expected_form(loc)
    if kind == "missing":
        return key, "is required but missing", f"add it: {expected}" if expected else "add it"
    problem = context.get("table_problem")
    fix = context.get("table_fix")
    if isinstance(problem, str) and isinstance(fix, str):
        return key, problem, fix
    shown = repr(error["input"])
    if len(shown) > _MAX_SHOWN_INPUT:
        shown = shown[: _MAX_SHOWN_INPUT - 1] + "…"
    return key, f"{error['msg']} (got {shown})", f"write {expected}" if expected else "correct the value"


def _dotted(loc: Sequence[int | str]) -> str:
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key = f"{key}.{part}" if key else part
    return key


def _model_of(field: FieldInfo) -> type[BaseModel] | None:
    """The table model behind a field (``AuthSpec`` for ``AuthSpec | None``), if any."""
    annotation: Any = field.annotation
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _field_at(loc: Sequence[int | str]) -> FieldInfo | None:
    model: type[BaseModel] | None = ProviderTable
    field: FieldInfo | None = None
    for part in loc:
        if isinstance(part, int):
            continue  # an index into a list keeps the list's field
        if model is None or part not in model.model_fields:
            return None
        field = model.model_fields[part]
        model = _model_of(field)
    return field


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    if not loc:
        return ProviderTable
    field = _field_at(loc)
    return _model_of(field) if field is not None else None


def _expected_form(loc: Sequence[int | str]) -> str | None:
    field = _field_at(loc)
    return field.description if field is not None else None
