"""The files attached to the next message, as a row of chips just above the composer.

The screen owns the list of attachments; this widget only shows it (`show`) and says what the
user asked for (`Removed`). The chips sit in one row that scrolls sideways when they do not fit,
so however many files are attached the row never takes more than its own line and a scrollbar:
the composer below it stays on screen. A focused chip is scrolled into view, so Tab and the arrow
keys reach every one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual import events
from textual.app import ComposeResult
from textual.containers import HorizontalGroup, HorizontalScroll
from textual.message import Message
from textual.widgets import Label

from ... import keymap

PATH_WIDTH = 24
"""A longer path shows its tail (the file's name is what tells chips apart); the chip's tooltip
has the whole path."""


@dataclass(frozen=True)
class ChipInfo:
    """One attached file as the screen knows it. `tokens` is None until it has been counted;
    `note` says something the user should know (e.g. "changed since turn 3")."""

    path: str
    lines: int
    tokens: int | None
    note: str = ""


def count(n: int, unit: str) -> str:
    return f"{n:,} {unit}" if n == 1 else f"{n:,} {unit}s"


def short_path(path: str, width: int = PATH_WIDTH) -> str:
    """The path, or "…" and its last `width - 1` characters: the end names the file."""
    return path if len(path) <= width else "…" + path[-(width - 1) :]


def chip_label(chip: ChipInfo) -> str:
    tokens = "… tokens" if chip.tokens is None else count(chip.tokens, "token")
    parts = [short_path(chip.path), count(chip.lines, "line"), tokens]
    if chip.note:
        parts.append(chip.note)
    return " · ".join(parts)


class RemoveMark(Label):
    """The chip's "✕": a click on it removes the chip."""

    def __init__(self) -> None:
        super().__init__("✕", classes="chip-remove")


class Chip(HorizontalGroup, can_focus=True):
    """One attached file. Focusable so it can be removed without a mouse."""

    BINDINGS = keymap.bindings("chips")

    def __init__(self, info: ChipInfo, index: int) -> None:
        super().__init__(classes="chip")
        self.info = info
        self.index = index
        self.tooltip = info.path
        self._text = Label(chip_label(info), markup=False, classes="chip-text")

    def compose(self) -> ComposeResult:
        yield self._text
        yield RemoveMark()

    def show_info(self, info: ChipInfo, index: int) -> None:
        """Show another attachment in this chip (reused, so focus stays where it was)."""
        self.index = index
        if info != self.info:
            self.info = info
            self.tooltip = info.path
            self._text.update(chip_label(info))

    def action_remove(self) -> None:
        self.post_message(AttachmentChips.Removed(self.index))

    def action_previous_chip(self) -> None:
        self._focus_sibling(-1)

    def action_next_chip(self) -> None:
        self._focus_sibling(+1)

    def _focus_sibling(self, step: int) -> None:
        if isinstance(self.parent, AttachmentChips):
            self.parent.focus_chip(self.index + step)

    def on_click(self, event: events.Click) -> None:
        if isinstance(event.widget, RemoveMark):
            event.stop()
            self.action_remove()


class AttachmentChips(HorizontalScroll, can_focus=False):
    """The attachments row. Hidden while nothing is attached."""

    @dataclass
    class Removed(Message):
        """The user asked to detach the attachment at `index` (of the list last shown)."""

        index: int

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.chips: list[ChipInfo] = []
        self._widgets: list[Chip] = []  # the live chips, in order (not those being removed)

    def on_mount(self) -> None:
        pending, self.chips = self.chips, []
        self.show(pending)

    def show(self, chips: Sequence[ChipInfo]) -> None:
        """Show `chips`, in order. Existing chip widgets are reused, so a focused chip keeps the
        focus; when the focused one goes (the last was removed), the new last chip takes it. When
        no chip is left the row hides, and the focus is the screen's to place."""
        self.chips = list(chips)
        if not self.is_attached:  # shown once mounted
            return
        shown = self._widgets
        kept, surplus = shown[: len(self.chips)], shown[len(self.chips) :]
        for index, (widget, info) in enumerate(zip(kept, self.chips, strict=False)):
            widget.show_info(info, index)
        if kept and any(c.has_focus for c in surplus):
            self.screen.set_focus(kept[-1])  # before the removal, so the focus never jumps away
        if surplus:
            self.remove_children(surplus)
        extra = [Chip(info, index) for index, info in enumerate(self.chips) if index >= len(shown)]
        if extra:
            self.mount_all(extra)
        self._widgets = kept + extra
        self.display = bool(self.chips)

    def focus_chip(self, index: int) -> None:
        """Focus the chip at `index`, if there is one (the arrow keys stop at either end)."""
        if 0 <= index < len(self._widgets):
            self._widgets[index].focus()
