"""The message input: multi-line, Enter sends, Ctrl+J (or Alt+Enter) inserts a new line, and
Up/Down on the first/last line walk the prompt history (like a shell)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message
from textual.widgets import TextArea

from ... import keymap


class Composer(TextArea):
    BINDINGS = keymap.bindings("composer")

    @dataclass
    class Submitted(Message):
        composer: Composer
        text: str

    def __init__(self, *, history: list[str] | None = None, cursor_blink: bool = True,
                 id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.cursor_blink = cursor_blink
        self.prompt_history: list[str] = list(history or [])
        self._history_pos: int | None = None  # index into history while browsing
        self._draft = ""

    def action_submit(self) -> None:
        text = self.text
        if not text.strip():
            return
        self.post_message(self.Submitted(self, text))

    def remember(self, text: str) -> None:
        """Add a sent prompt to the history and clear the input."""
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._history_pos = None
        self.clear()

    def action_newline(self) -> None:
        self.insert("\n")

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == 0 and self.prompt_history:
            if self._history_pos is None:
                self._draft, self._history_pos = self.text, len(self.prompt_history)
            if self._history_pos > 0:
                self._history_pos -= 1
                self._show(self.prompt_history[self._history_pos])
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        last_row = self.document.line_count - 1
        if not select and self._history_pos is not None and self.cursor_location[0] == last_row:
            self._history_pos += 1
            if self._history_pos >= len(self.prompt_history):
                self._history_pos = None
                self._show(self._draft)
            else:
                self._show(self.prompt_history[self._history_pos])
            return
        super().action_cursor_down(select)

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)
