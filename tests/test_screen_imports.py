"""The screens never import app/app.py: the app imports its screens, so an import back would
make a circle through every screen (`app/screens/base.py` types `self.app` with a protocol
instead). Read from the source with `ast`, type-checking-only imports included."""

from __future__ import annotations

from tests.support.imports import ROOT, imported_modules, module_of

APP_DIR = ROOT / "app"
APP_MODULE = "velo_chat.app.app"


def test_the_resolver_sees_every_way_to_import_the_app_module() -> None:
    for source in (
        "from ..app import VeloChatApp",
        "from .. import app",
        "import velo_chat.app.app",
        "from velo_chat.app import app",
        "from velo_chat.app.app import make_app",
        "if TYPE_CHECKING:\n    from ..app import VeloChatApp",
        "def f():\n    from ..app import make_app",
    ):
        assert APP_MODULE in imported_modules(source, "velo_chat.app.screens"), source
    for source in ("from ..app_state import X", "from . import base", "from ..widgets import app_bar"):
        assert APP_MODULE not in imported_modules(source, "velo_chat.app.screens"), source


def test_no_screen_imports_the_app_module() -> None:
    screens = sorted((APP_DIR / "screens").glob("*.py"))
    assert screens
    offenders = [
        p.name
        for p in screens
        if APP_MODULE in imported_modules(p.read_text(encoding="utf-8"), package=module_of(p)[1])
    ]
    assert offenders == []
