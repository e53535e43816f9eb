"""A readable message in a box (an error, a diff): never a traceback. Dismissed with Esc/Enter."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class MessageDialog(ModalScreen[None]):
    BINDINGS = [Binding("escape,enter,q", "close", "Close", id="dialog.close")]

    def __init__(self, title: str, body: str, *, error: bool = False) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text, self.body, self.error = title, body, error

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog" + (" -error" if self.error else "")):
            yield Static(self.title_text, classes="dialog-title")
            with VerticalScroll(classes="dialog-scroll"):
                yield Static(self.body, classes="dialog-body", markup=False)
            yield Button("OK", id="ok", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#ok", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)


def error_dialog(title: str, reason: str) -> MessageDialog:
    return MessageDialog(title, reason, error=True)
