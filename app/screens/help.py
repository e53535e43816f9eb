"""The help screen: every binding, by where it works, with the keys the keymap gives it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from .. import keymap
from .base import VeloScreen

INTRO = (
    "[b]velo-chat keys[/b]\n"
    'Rebind any of these in settings.toml, e.g.\n  \\[keymap]\n  "session.new" = "f9"\n'
    "Ctrl+P opens the command palette: every action below is there too.\n"
)


def help_text(user_keymap: dict[str, str]) -> str:
    lines = [INTRO]
    for scope, title in keymap.SCOPE_TITLES.items():
        lines.append(f"\n[b]{title}[/b]")
        for a in keymap.ACTIONS:
            if a.scope == scope:
                keys = keymap.effective_key(a, user_keymap).replace("[", r"\[")
                lines.append(f"  {keys:<28} {a.description}  [dim]{a.id}[/]")
    return "\n".join(lines)


class HelpScreen(VeloScreen):
    BINDINGS = [Binding("escape,q,f1", "app.pop_screen", "Back", id="help.close")]

    def __init__(self) -> None:
        super().__init__(id="help")

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(help_text(self.app.settings.keymap))
        yield Footer()
