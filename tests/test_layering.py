"""Which part of the repository may import which, read from the source with `ast` (imports
inside functions and under `TYPE_CHECKING` included, relative imports resolved).

The product's packages form layers: `kernels/` (the PLE GPU kernels) imports nothing of the
project, the engine may use the kernels but never the app, the store never the engine, and
neither the engine nor the kernels import Textual. Nothing shipped imports `devkit/`, `tests/`
or `benchmarks/`. The tests and the benchmarks share code only through `devkit/`: a test of a
benchmark runs it as a command, and a benchmark never imports `tests`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.imports import PRODUCT, ROOT, imported_modules, module_of

DEV = ("devkit", "tests", "benchmarks")

# folder -> module prefixes its files must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "kernels": ("velo_chat.engine", "velo_chat.app", "velo_chat.store", "textual"),
    "engine": ("velo_chat.app", "textual"),
    "store": ("velo_chat.engine", "velo_chat.app", "textual"),
    "app": (),
    "devkit": ("tests", "benchmarks"),
    "tests": ("benchmarks",),
    "benchmarks": ("tests",),
}
for _folder in PRODUCT:
    FORBIDDEN[_folder] += DEV


def _breaks(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_the_resolver_follows_relative_and_absolute_imports() -> None:
    assert module_of(ROOT / "engine" / "llama" / "model.py") == (
        "velo_chat.engine.llama.model",
        "velo_chat.engine.llama",
    )
    assert module_of(ROOT / "engine" / "__init__.py") == ("velo_chat.engine", "velo_chat.engine")
    package = "velo_chat.kernels"
    for source, module in (
        ("from ..engine.llama import gguf_file", "velo_chat.engine.llama.gguf_file"),
        ("from .. import engine", "velo_chat.engine"),
        ("import velo_chat.engine.llama.gguf_file", "velo_chat.engine.llama.gguf_file"),
        ("def f():\n    from velo_chat.store import rows", "velo_chat.store.rows"),
        ("if TYPE_CHECKING:\n    from textual.app import App", "textual.app"),
    ):
        found = imported_modules(source, package)
        assert module in found, source
        assert _breaks(module, FORBIDDEN["kernels"]), source
    assert not _breaks("velo_chat.kernels.dequant", FORBIDDEN["engine"])
    assert imported_modules("from .dequant import row_nbytes", package) >= {"velo_chat.kernels.dequant"}


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_each_folder_imports_only_what_its_layer_allows(folder: str) -> None:
    files = _files(folder)
    assert files, f"no Python files under {folder}/"
    offenders: dict[str, list[str]] = {}
    for path in files:
        _, package = module_of(path)
        bad = sorted(
            m
            for m in imported_modules(path.read_text(encoding="utf-8"), package)
            if _breaks(m, FORBIDDEN[folder])
        )
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


def test_no_test_loads_a_script_by_its_path() -> None:
    """A test of a benchmark runs the script as a command (what its users do); loading a
    script's file as a module would make the script's internals the test's interface."""
    loaders = {"spec_from_file_location", "exec_module", "run_path"}
    offenders = {
        str(path.relative_to(ROOT))
        for path in _files("tests")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr in loaders
    }
    assert offenders == set()


def test_the_device_scripts_import_nothing_from_tests() -> None:
    """The Python the device harness runs inline (heredocs, `python -c`) counts too."""
    pattern = re.compile(r"^\s*(from|import)\s+tests\b|\b(from|import) tests\.", re.MULTILINE)
    scripts = sorted((ROOT / "benchmarks").rglob("*.sh"))
    assert scripts
    assert [str(p.relative_to(ROOT)) for p in scripts if pattern.search(p.read_text())] == []
