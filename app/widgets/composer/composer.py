"""The message input: multi-line, Enter sends, Ctrl+J (or Alt+Enter) inserts a new line, and
Up/Down on the first/last line walk the prompt history (like a shell).

Never lose a keystroke. Enter is a *priority* binding (TextArea would otherwise take it as a new
line), and priority bindings run in the App's message loop as soon as the App reads the key,
while the characters typed before it are still queued on this widget. Reading `self.text` in the
action itself would send a prefix of what was typed, and clearing the input afterwards would
drop the rest (seen with `tmux send-keys` on a busy machine). So the action only schedules the
send on this widget's own queue, behind every key already delivered; the send then takes the
whole text and clears exactly that text in the same step. While the screen says sending is not
possible (`accepting` False: no model yet, a reply streaming), the text stays where it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message
from textual.widgets import TextArea

from ... import keymap


class Composer(TextArea):
    BINDINGS = keymap.bindings("composer")

    @dataclass
    class Submitted(Message):
        """The input was taken (and cleared): the screen must send `text` or give it back."""

        composer: Composer
        text: str

    @dataclass
    class Held(Message):
        """Enter was pressed while sending is not possible; the text stays in the input."""

        composer: Composer

    def __init__(
        self, *, history: list[str] | None = None, cursor_blink: bool = True, id: str | None = None
    ) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.cursor_blink = cursor_blink
        self.prompt_history: list[str] = list(history or [])
        self._history_pos: int | None = None  # index into history while browsing
        self._draft = ""
        self.accepting = True  # set by the screen: can a message be sent right now?

    def action_submit(self) -> None:
        # Runs from the App's loop, possibly ahead of keys still queued here: see the docstring.
        self.call_later(self._submit_queued)

    def _submit_queued(self) -> None:
        text = self.text
        if not text.strip():
            return
        if not self.accepting:
            self.post_message(self.Held(self))
            return
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._history_pos = None
        self.clear()
        self.post_message(self.Submitted(self, text))

    def give_back(self, text: str) -> None:
        """Put a message that was not sent back in front of whatever was typed since."""
        rest = self.text
        joined = text if not rest.strip() else f"{text}\n\n{rest}"
        self.load_text(joined)
        self.move_cursor(self.document.end)

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
