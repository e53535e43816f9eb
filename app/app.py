"""The Textual App subclass and the `make_app` factory the CLI and tests use."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Footer, Header, Static

from velo_chat.engine.profile_schema import Profile


class VeloChatApp(App[None]):
    TITLE = "velo-chat"
    BINDINGS = [("ctrl+q", "quit", "Quit")]

    def __init__(self, profile: Profile) -> None:
        super().__init__()
        self.profile = profile

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(
            f"velo-chat — profile [b]{self.profile.name}[/b]\n\n"
            "The chat screen arrives with the TUI issue; until then use `velo-chat ask`.",
            id="placeholder",
        )
        yield Footer()


def make_app(profile: Profile) -> VeloChatApp:
    return VeloChatApp(profile)
