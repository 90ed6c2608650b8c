"""The tree a newcomer reads: no module reaches itself through its imports, and the Layout of docs/development.md is the tree.

An import circle is found the way Python would follow it: every `import` and `from … import` that
runs in a module of server/ or providers/ (at the top or in a function; not those only the type
checker reads, under `if TYPE_CHECKING:`), to the module it names (`from pkg import mod` names
`pkg.mod` when that is a module, else `pkg`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "pollwarden": ROOT / "server" / "pollwarden",
    "pollwarden_providers": ROOT / "providers" / "pollwarden_providers",
}


def modules() -> dict[str, Path]:
    """Every module of the two packages, by dotted name."""
    found: dict[str, Path] = {}
    for name, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = [name, *path.relative_to(root).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The modules of the two packages that `path` imports where it runs (not only for the type checker)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [n if n in known else node.module for n in names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                yield name


def circles() -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan), and any module importing itself."""
    known = modules()
    edges = {name: set(imported(path, known)) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group: set[str] = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in edges[node]:
                found.append(frozenset(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_reaches_itself_through_its_imports() -> None:
    assert not [sorted(group) for group in circles()], (
        "import circles (a module reaching itself through its imports)"
    )


def test_the_store_is_in_no_import_circle() -> None:
    assert not [sorted(g) for g in circles() if any(m.startswith("pollwarden.store") for m in g)]


def test_the_postgresql_engine_imports_nothing_from_the_sqlite_one() -> None:
    known = modules()
    engine = [name for name in known if name.startswith("pollwarden.store.postgres")]
    reached = {target for name in engine for target in imported(known[name], known)}
    assert not [t for t in reached if t.startswith("pollwarden.store.sqlite")]


# -- the Layout of docs/development.md section --------------------------------------------------------------------

_PATH = re.compile(r"[\w.]+(/[\w.]+)*(\.py|/)")


def layout_names() -> set[str]:
    """The paths under server/pollwarden/ the Layout of docs/development.md block names.

    A line indented two spaces names its first path (a directory, or a module at the top) and the
    paths after it; a line indented deeper continues the directory of the line above it.
    """
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    block = text.split("\n## Layout\n", 1)[1].split("```", 2)[1]
    named: set[str] = set()
    inside, directory = False, ""
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            inside = line.startswith("server/pollwarden/")
            continue
        paths: list[str] = []
        for token in line.split():
            if not _PATH.fullmatch(token):
                break
            paths.append(token)
        if not inside or not paths:
            continue
        if indent == 2:
            directory = paths[0] if paths[0].endswith("/") else ""
            if directory:
                named.add(directory)
                paths = paths[1:]
        named.update(directory + path for path in paths)
    return named


def tree_names() -> set[str]:
    """Every module and package of the server, relative to server/pollwarden/ (the console's templates and
    static files are named by their directories)."""
    root = PACKAGES["pollwarden"]
    names: set[str] = set()
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if "__pycache__" in relative.parts or {"templates", "static"} & set(relative.parts[:-1]):
            continue
        if path.is_dir():
            names.add(f"{relative.as_posix()}/")
        elif path.suffix == ".py":
            names.add(relative.as_posix())
    return names


def test_the_readmes_layout_names_every_module_and_nothing_else() -> None:
    named, tree = layout_names(), tree_names()
    unnamed = sorted(n for n in tree - named if not n.endswith(("__init__.py", "__main__.py")))
    assert not unnamed, f"modules the Layout of docs/development.md does not name: {unnamed}"
    assert not sorted(named - tree), (
        f"the Layout of docs/development.md names what is not there: {sorted(named - tree)}"
    )
