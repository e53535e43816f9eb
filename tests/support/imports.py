"""What a source file imports, read with `ast`: the layering and import-guard tests share it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PRODUCT = ("app", "engine", "kernels", "store")  # the folders installed as velo_chat.<name>


def module_of(path: Path) -> tuple[str, str]:
    """The module a file is imported as and the package its relative imports start from:
    `velo_chat.engine.llama.model` in `velo_chat.engine.llama` for engine/llama/model.py,
    `devkit.spec_sim` in `devkit` for devkit/spec_sim.py."""
    parts = list(path.resolve().relative_to(ROOT).with_suffix("").parts)
    if parts[0] in PRODUCT:
        parts.insert(0, "velo_chat")
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def imported_modules(source: str, package: str) -> set[str]:
    """Every module `source` imports, relative imports resolved against `package`, imports
    inside functions and `TYPE_CHECKING` blocks included; `from P import name` counts as `P`
    and `P.name` (the name may be a submodule)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                where = ".".join([*base, node.module] if node.module else base)
            else:
                where = node.module or ""
            found.add(where)
            found.update(f"{where}.{alias.name}" for alias in node.names)
    return found
