"""Ask for one line of text (a session title, a new profile name). Returns str or None.

An optional `validate` callable returns an error message (or None) so the dialog can refuse a
bad value in place instead of round-tripping through the caller.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class TextPrompt(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(
        self,
        title: str,
        value: str = "",
        *,
        validate: Callable[[str], str | None] | None = None,
        cursor_blink: bool = True,
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text, self.value, self.validate = title, value, validate
        self.cursor_blink = cursor_blink

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.title_text, classes="dialog-title")
            box = Input(self.value, id="prompt-input")
            box.cursor_blink = self.cursor_blink
            yield box
            yield Static("Enter to accept, Esc to cancel", id="prompt-error", classes="dialog-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        problem = self.validate(value) if self.validate else (None if value else "empty")
        if problem:
            self.query_one("#prompt-error", Static).update(f"[b $error]{problem}[/]")
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)
