"""MkDocs hook: regenerate the CLI and tool references before every build (docs/gen_reference.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any


def on_pre_build(config: Any, **_: Any) -> None:
    """Rewrite docs/reference/*.md from the code, so a build never shows a stale reference."""
    del config
    path = Path(__file__).with_name("gen_reference.py")
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([])


# Files kept at the repository's root (linked from the pages) that the site shows as they are.
REPO_FILES = ("SECURITY.md", "RELIABILITY.md", "benchmarks/README.md")
REPO_GLOBS = ("benchmarks/results/*.png",)


def on_files(files: Any, config: Any) -> Any:
    """Add SECURITY.md, RELIABILITY.md and the benchmark screenshots from the repository root."""
    from mkdocs.structure.files import File

    root = Path(config["config_file_path"]).parent
    paths = [root / name for name in REPO_FILES]
    paths += [p for pattern in REPO_GLOBS for p in sorted(root.glob(pattern))]
    for path in paths:
        if path.is_file():
            files.append(File.generated(config, path.relative_to(root).as_posix(), abs_src_path=str(path)))
    return files
