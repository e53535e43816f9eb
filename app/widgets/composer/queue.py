"""Messages typed while a reply streams, waiting their turn: shown between the transcript and the
composer, one line each.

The screen owns the queue (the drafts are in the store); this widget shows it (`show`) and says
what the user asked for (`EditRequested`, `RemoveRequested`), by the draft's `key`. A queued
message is the user's text: it is only ever shown, never parsed as markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Static

from ... import keymap


@dataclass(frozen=True)
class QueuedItem:
    """One queued message as the screen knows it."""

    key: int
    """The draft's id in the store."""
    text: str
    n_files: int = 0
    editing: bool = False
    """Taken back into the composer to be edited: marked so, as it will not be sent as shown."""


def first_line(text: str) -> str:
    """The first non-blank line, with "…" when the message goes on past it."""
    stripped = text.strip()
    head, _, rest = stripped.partition("\n")
    return head.rstrip() + (" …" if rest.strip() else "")


def item_label(item: QueuedItem) -> Content:
    state = "editing" if item.editing else "queued"
    parts: list[str | tuple[str, str]] = [(state, "italic"), "  ", first_line(item.text)]
    if item.n_files:
        parts.append((f"  +{item.n_files} file{'s' if item.n_files != 1 else ''}", "bold"))
    return Content.assemble(*parts)


def paused_label(hint: str) -> str:
    return f"queue paused — {hint}" if hint else "queue paused"


class QueueEntry(Static, can_focus=True):
    """One queued message. Focusable, so it can be edited or removed from the keyboard."""

    BINDINGS = keymap.bindings("queue")

    def __init__(self, item: QueuedItem) -> None:
        super().__init__(item_label(item), classes="queue-item", markup=False)
        self.item = item
        self.set_class(item.editing, "-editing")

    def show_item(self, item: QueuedItem) -> None:
        """Show another queued message in this line (reused, so the focus stays in place)."""
        if item != self.item:
            self.item = item
            self.update(item_label(item))
            self.set_class(item.editing, "-editing")

    def action_edit(self) -> None:
        self.post_message(MessageQueue.EditRequested(self.item.key))

    def action_remove(self) -> None:
        self.post_message(MessageQueue.RemoveRequested(self.item.key))


class MessageQueue(Vertical):
    """The queued messages, oldest first, under a "paused" line while the queue is held.
    Hidden while nothing is queued; the stylesheet caps its height (it scrolls past that)."""

    @dataclass
    class EditRequested(Message):
        """The user wants the queued message `key` back in the composer to edit it."""

        key: int

    @dataclass
    class RemoveRequested(Message):
        """The user wants the queued message `key` dropped from the queue."""

        key: int

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.items: list[QueuedItem] = []
        self.paused = False
        self.paused_hint = ""
        self._header = Static("", classes="queue-header", markup=False)
        self._entries: list[QueueEntry] = []  # the live entries, in order (not those being removed)

    def compose(self) -> ComposeResult:
        yield self._header

    def on_mount(self) -> None:
        pending, self.items = self.items, []
        self.show(pending, paused=self.paused, paused_hint=self.paused_hint)

    def show(self, items: Sequence[QueuedItem], *, paused: bool, paused_hint: str = "") -> None:
        """Show `items` in order. Entry widgets are reused by position, so after a removal the
        focus stays on the same line (the next message); when the focused last line goes, the
        new last line takes it. When nothing is left the queue hides and the focus is the
        screen's to place."""
        self.items, self.paused, self.paused_hint = list(items), paused, paused_hint
        if not self.is_attached:  # shown once mounted
            return
        self._header.update(paused_label(paused_hint))
        self._header.display = paused
        kept, surplus = self._entries[: len(self.items)], self._entries[len(self.items) :]
        for entry, item in zip(kept, self.items, strict=False):
            entry.show_item(item)
        if kept and any(e.has_focus for e in surplus):
            self.screen.set_focus(kept[-1])  # before the removal, so the focus never jumps away
        if surplus:
            self.remove_children(surplus)
        extra = [QueueEntry(item) for item in self.items[len(kept) :]]
        if extra:
            self.mount_all(extra)
        self._entries = kept + extra
        self.display = bool(self.items)
