"""Pick one of a few named options (a profile for this session). Returns the name or None."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option


class ChoiceDialog(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(self, title: str, choices: Sequence[tuple[str, str]], current: str | None = None) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text, self.choices, self.current = title, list(choices), current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.title_text, classes="dialog-title")
            yield OptionList(*[Option(label, id=key) for key, label in self.choices], id="choices")

    def on_mount(self) -> None:
        lst = self.query_one(OptionList)
        keys = [k for k, _ in self.choices]
        if self.current in keys:
            lst.highlighted = keys.index(self.current)
        lst.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
