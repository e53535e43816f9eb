"""The screens never import app/app.py: the app imports its screens, so an import back would
make a circle through every screen (`app/screens/base.py` types `self.app` with a protocol
instead). Read from the source with `ast`, type-checking-only imports included."""

from __future__ import annotations

import ast
from pathlib import Path

APP_DIR = Path(__file__).resolve().parent.parent / "app"
APP_MODULE = "velo_chat.app.app"


def module_of(path: Path) -> str:
    """`velo_chat.app.screens.chat` for app/screens/chat.py."""
    parts = path.relative_to(APP_DIR).with_suffix("").parts
    return ".".join(("velo_chat", "app", *parts))


def imported_modules(source: str, module: str) -> set[str]:
    """Every module that `source` (the text of `module`) imports, relative imports resolved,
    `from P import name` counted as both `P` and `P.name` (the name may be a submodule)."""
    package = module.rsplit(".", 1)[0]
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


def test_the_resolver_sees_every_way_to_import_the_app_module() -> None:
    screen = "velo_chat.app.screens.chat"
    for source in (
        "from ..app import VeloChatApp",
        "from .. import app",
        "import velo_chat.app.app",
        "from velo_chat.app import app",
        "from velo_chat.app.app import make_app",
        "if TYPE_CHECKING:\n    from ..app import VeloChatApp",
        "def f():\n    from ..app import make_app",
    ):
        assert APP_MODULE in imported_modules(source, screen), source
    for source in ("from ..app_state import X", "from . import base", "from ..widgets import app_bar"):
        assert APP_MODULE not in imported_modules(source, screen), source


def test_no_screen_imports_the_app_module() -> None:
    screens = sorted((APP_DIR / "screens").glob("*.py"))
    assert screens
    offenders = [
        p.name for p in screens if APP_MODULE in imported_modules(p.read_text(encoding="utf-8"), module_of(p))
    ]
    assert offenders == []
